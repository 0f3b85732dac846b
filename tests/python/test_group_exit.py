"""A rank exits cleanly with a GraphedForward(group=...) still alive: at destroy_process_group() and
at interpreter exit. Before graphed let go of the group first (graphed._groups) and agreed in C++
(shim/gf_shim_group.h), about one two-rank run in ten on gloo aborted at exit ("terminate called
without an active exception"): a gloo thread released the agreement's tensor, which a Python
object shared, after the interpreter had begun to exit.

Aborts at exit are rare and timing-bound, so the test runs many two-rank runs, each rank a process
of its own started as a script is (this file run as `python test_group_exit.py rank RANK STORE
MODE`; ranks forked from one process never showed the abort): it joins a gloo group, calls its
GraphedForward twice (one capture, agreed across the ranks, and replays), meets the other rank at
a barrier, then either destroys the group and exits or just exits, holding the GraphedForward at
top level until the interpreter's own exit. A few runs go at once, to keep the test short.

How many runs: 40 that destroy the group and 20 that just exit, by default (every ordinary run and
CI). Sixty runs catch a one-in-ten abort with probability 1 - 0.9**60, about 99.8%, and each run
costs two interpreters that import torch. The full soak, 200 + 50 runs, is for when time is cheap
or the exit order's code changed (shim/gf_shim_group.*, shim/gf_shim_registry.cpp,
python/graphed/_groups.py):

    GRAPHED_EXIT_RUNS=200,50 python -m pytest tests/python/test_group_exit.py

GRAPHED_EXIT_RUNS is "DESTROY_RUNS,EXIT_RUNS", two positive whole numbers.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# A rank (this file run as a script) does not import pytest: a tenth of each rank's start-up, 120
# ranks a run of the suite.
_RANK = __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "rank"
if not _RANK:
    import pytest

    # Sixty two-rank runs or more: the sanitized suite (scripts/sanitize.sh) leaves them out; what
    # they test is the exit order, which the plain suite proves.
    pytestmark = pytest.mark.many_processes

HERE = Path(__file__).resolve()
ROUND_TIMEOUT_S = 60
RUNS_VARIABLE = "GRAPHED_EXIT_RUNS"
# (runs that destroy the group, runs that just exit) when RUNS_VARIABLE is unset or empty.
DEFAULT_RUNS = (40, 20)
PARALLEL_RUNS = 2
# What a rank's script holds at top level until the interpreter exits: its GraphedForward (one
# deleted before the exit never showed the abort).
_alive_at_exit: list = []


def _rank(rank: int, store: str, mode: str) -> None:
    """One rank of one run; returns to exit through the interpreter."""
    import graphed
    import torch
    import torch.distributed as dist
    from _backend_choice import load_emulated

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=ROUND_TIMEOUT_S),
    )
    module = torch.nn.Linear(8, 8)
    gf = graphed.GraphedForward(
        module, device="cpu", group=dist.group.WORLD, name="exit", backend=load_emulated()
    )
    _alive_at_exit.append(gf)
    for _ in range(2):
        gf(input=torch.randn(4, 8))
    stats = gf.stats()
    # The capturing call replays too: one capture, two replays.
    if stats["captures"] != 1 or stats["replays"] != 2 or not stats["enabled"]:
        raise SystemExit(f"rank {rank}: expected one agreed capture and two replays, got {stats}")
    dist.barrier()
    if mode == "destroy":
        dist.destroy_process_group()
        stats = gf.stats()
        if stats["enabled"] or stats["graphs"] != 0:
            raise SystemExit(f"rank {rank}: the runner kept its graphs past its group: {stats}")
        if stats["disabled_cause"] != "group_released":
            raise SystemExit(f"rank {rank}: disabled for another cause than its group: {stats}")
        x = torch.randn(4, 8)
        with torch.no_grad():
            if not torch.equal(gf(input=x), module(x)):  # eager now, and still right
                raise SystemExit(f"rank {rank}: the eager call after the group's end differs")


def run_counts(value: str | None) -> tuple[int, int]:
    """(destroy runs, exit runs) from RUNS_VARIABLE's value, "DESTROY_RUNS,EXIT_RUNS"; the default
    when it is unset or empty. Anything else is a ValueError naming the variable."""
    if value is None or not value.strip():
        return DEFAULT_RUNS
    parts = [part.strip() for part in value.split(",")]
    if len(parts) == 2 and all(
        part.isascii() and part.isdigit() and int(part) > 0 for part in parts
    ):
        return int(parts[0]), int(parts[1])
    raise ValueError(
        f"{RUNS_VARIABLE} must be two positive whole numbers 'DESTROY_RUNS,EXIT_RUNS' (for example "
        f"'{DEFAULT_RUNS[0]},{DEFAULT_RUNS[1]}', or '200,50' for the full soak), got {value!r}"
    )


def _runs(mode: str) -> int:
    destroy, exit_only = run_counts(os.environ.get(RUNS_VARIABLE))
    return destroy if mode == "destroy" else exit_only


def _run_pairs(runs: int, mode: str) -> list[dict]:
    """Runs `runs` two-rank runs, PARALLEL_RUNS at a time; returns each failed rank's exit code
    and the tail of its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    failures: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="graphed-exit-") as stores:
        for first in range(0, runs, PARALLEL_RUNS):
            batch = range(first, min(first + PARALLEL_RUNS, runs))
            failures += _run_batch(batch, mode, stores, env)
    return failures


def _run_batch(runs: range, mode: str, stores: str, env: dict) -> list[dict]:
    """Starts both ranks of each run at once, each run rendezvousing through a file store of its
    own (no port to race the other runs for); waits for all; returns the failed ranks."""
    started = []
    for run in runs:
        store = os.path.join(stores, f"run{run}")
        for rank in (0, 1):
            command = [sys.executable, str(HERE), "rank", str(rank), store, mode]
            process = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            started.append((run, rank, process))
    failures = []
    for run, rank, process in started:
        try:
            output, _ = process.communicate(timeout=ROUND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        if process.returncode != 0:
            failures.append(
                {"run": run, "rank": rank, "code": process.returncode, "tail": output[-600:]}
            )
    return failures


def _check_clean_exits(mode: str) -> None:
    runs = _runs(mode)
    failures = _run_pairs(runs, mode)
    aborted = [f for f in failures if f["code"] == -signal.SIGABRT]
    assert not failures, (
        f"{len(failures)} rank exits failed in {runs} runs ({len(aborted)} aborted): {failures[:5]}"
    )


def test_ranks_that_destroy_their_group_exit_cleanly_every_time():
    _check_clean_exits("destroy")


def test_ranks_that_exit_without_destroying_their_group_exit_cleanly():
    _check_clean_exits("exit")


def test_the_run_counts_come_from_the_variable_and_a_bad_value_names_it():
    assert run_counts(None) == run_counts("") == DEFAULT_RUNS == (40, 20)
    assert run_counts("200,50") == (200, 50)
    assert run_counts(" 3 , 1 ") == (3, 1)
    for bad in ("200", "200,50,1", "0,5", "-1,5", "a,b", "2.5,1", "200;50", "²,1"):
        with pytest.raises(ValueError, match=f"^{RUNS_VARIABLE} must be two positive") as caught:
            run_counts(bad)
        assert repr(bad) in str(caught.value)


if _RANK:
    _rank(int(sys.argv[2]), sys.argv[3], sys.argv[4])
