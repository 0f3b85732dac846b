"""Why this exists: the one way the Python tests run a process group, one child process per rank.

test_agreement.py and test_sequence_parallel.py start their ranks as plain processes (the file
itself, run as `python FILE worker RANK WORLD PORT RESULT ARGS...`), each writing a JSON report.
Every wait has a deadline, so a rank that hangs fails the test instead of CI; the outcome of each
rank (its exit code, report and output) is returned for the test to judge, since some tests expect
a rank to fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


# The NCCL tests' mark: one rank per GPU, two ranks.
needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs two CUDA devices",
)


@dataclass
class RankOutcome:
    rank: int
    code: int | None  # None: still running at the deadline, then killed
    seconds: float  # from the start until it exited (or was killed)
    report: dict | None
    output: str

    def describe(self) -> str:
        how = "ran past the deadline" if self.code is None else f"exited with {self.code}"
        return f"rank {self.rank} {how} after {self.seconds:.0f} s:\n{self.output[-3000:]}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(
    script: Path, world: int, arguments: list[str], tmp_path: Path, deadline_s: float, tag: str
) -> list[RankOutcome]:
    """Runs `script` once per rank; returns every rank's outcome, ordered by rank. The children
    import graphed as this process did (they inherit its environment, PYTHONPATH included)."""
    port = free_port()
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"
    # The repository's bench/ too, as conftest.py gives the tests (its models are shared).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR), env.get("PYTHONPATH")]))
    started = time.monotonic()
    children = []
    for rank in range(world):
        result_path = tmp_path / f"{tag}_rank{rank}.json"
        log_path = tmp_path / f"{tag}_rank{rank}.log"
        command = [sys.executable, str(script), "worker", str(rank), str(world), str(port)]
        command += [str(result_path), *arguments]
        log = open(log_path, "w")  # noqa: SIM115 - closed after the child exits
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        children.append((process, log, log_path, result_path))
    outcomes = []
    for rank, (process, log, log_path, result_path) in enumerate(children):
        try:
            code: int | None = process.wait(
                timeout=max(1.0, started + deadline_s - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        seconds = time.monotonic() - started
        log.close()
        report = json.loads(result_path.read_text()) if result_path.exists() else None
        outcomes.append(RankOutcome(rank, code, seconds, report, log_path.read_text()))
    return outcomes


def reports_of(outcomes: list[RankOutcome]) -> list[dict]:
    """The reports of ranks that must all have succeeded (else the test fails, saying how)."""
    failures = [o.describe() for o in outcomes if o.code != 0 or o.report is None]
    assert not failures, "\n\n".join(failures)
    return [o.report for o in outcomes]


def worker_arguments() -> tuple[int, int, int, str, list[str]] | None:
    """rank, world, port, result path and the rest, when this process is a rank."""
    if len(sys.argv) < 6 or sys.argv[1] != "worker":
        return None
    return int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6:]


def join_group(backend: str, rank: int, world: int, port: int, timeout_s: float) -> None:
    """Joins this rank to the test's default process group over TCP on localhost; timeout_s is
    the group's timeout, which torch's watchdog enforces on a stuck collective."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
