"""Sequence-parallel forwards under GraphedForward(group=...): no rank may hang its peers.

The forward is bench/sp_dit.py's DiT: all-to-alls around attention and an all-gather at the end,
so every probe, warm-up and capture runs collectives that pair with the other rank's. Each test
runs two ranks as child processes (see _ranks.py) through a list of cases, one GraphedForward
per case; in the faulty cases rank 1 alone synchronizes, raises or exits at the start, middle or
end of its forward, in one phase (probe, warm-up or capture). The children report per call
whether the output equals eager (bitwise), what was raised, and the runner's stats; every wait
has a deadline, so a hang fails the test instead of CI.

- NCCL on two GPUs: real captures of real collectives.
- gloo on the CPU (in CI): the emulated backend stands in for the device. Its "capture" runs the
  forward live and its replays do no work, so it covers the probe and warm-ups (a synchronizing
  operator is stood in for by the warning torch's sync-debug mode gives) and compares values on
  the capturing call only; the capture cases need NCCL.

Run as a script (`python test_sequence_parallel.py worker ...`), this file is a rank.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import graphed
import pytest
import torch
from _backend_choice import load_emulated
from _ranks import join_group, needs_two_gpus, reports_of, run_ranks, worker_arguments
from sp_dit import SequenceParallelDiT, SPConfig, make_sp_inputs

GROUP_TIMEOUT_S = 20
DEADLINE_S = 240
CALLS = 3
REPLAY_CALLS = 9

# The cases every run goes through, in this order: (name, fault on rank 1 or None).
# A fault is (what, where, phase): what in {sync, raise, own_error, exit}, where in {start, middle,
# end} of the forward, phase the graphed phase it fires in (any phase for sync, which only the
# probe may see before a capture fails on it).
ALIGNABLE = {
    "replay": None,
    "sync_start": ("sync", "start", "any"),
    "sync_middle": ("sync", "middle", "any"),
    "sync_end": ("sync", "end", "any"),
    "raise_in_probe_end": ("raise", "end", "probe"),
    "raise_in_warmup_end": ("raise", "end", "warmup"),
    "own_error_in_warmup_end": ("own_error", "end", "warmup"),
    "raise_in_capture_start": ("raise", "start", "capture"),
    "raise_in_capture_middle": ("raise", "middle", "capture"),
}
CAPTURE_LIVE_ON_EMULATED = {"raise_in_capture_start", "raise_in_capture_middle"}
UNALIGNABLE = {
    "raise_in_warmup_start": ("raise", "start", "warmup"),
    "exit_in_warmup_middle": ("exit", "middle", "warmup"),
}
PHASES = {"probe": 1, "warmup": 2, "capture": 3}


# -- a rank ------------------------------------------------------------------------------------


class FaultyDiT(SequenceParallelDiT):
    """The DiT with a fault point at the start, middle and end of its forward."""

    def __init__(self, config: SPConfig, group, fault, on_gpu: bool) -> None:
        super().__init__(config, group)
        self.fault = fault
        self.on_gpu = on_gpu

    def _fault_point(self, where: str, value: torch.Tensor) -> None:
        if self.fault is None or self.fault[1] != where:
            return
        what, _, phase = self.fault
        now = int(torch.ops.graphed.forward_phase())
        if phase != "any" and now != PHASES[phase]:
            return
        if what == "sync":
            if self.on_gpu:
                value.float().abs().max().item()
            else:
                warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        elif what == "raise":
            raise RuntimeError(f"rank-only failure at the {where} of the forward")
        elif what == "own_error":
            raise ValueError(f"rank-only error of the forward's own at the {where}")
        elif what == "exit":
            os._exit(3)

    def forward(self, *, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h, cond = self.enter(x, t)
        self._fault_point("start", h)
        for number, block in enumerate(self.blocks):
            if number == len(self.blocks) // 2:
                self._fault_point("middle", h)
            h = block(h, cond)
        out = self.leave(h, cond)
        self._fault_point("end", out)
        return out


def _run_case(name, fault, group, rank, world, config, on_gpu, backend) -> dict:
    import torch.distributed as dist

    torch.manual_seed(0)
    module = FaultyDiT(config, group, fault if rank == 1 else None, on_gpu)
    module = module.to(device=config.device, dtype=config.dtype).eval()
    gf = graphed.GraphedForward(
        module, device=config.device, group=group, name=name, backend=backend
    )
    rows = [config.rows] * (REPLAY_CALLS if fault is None else CALLS)
    if fault is None:
        rows += [2 * config.rows] * CALLS  # a new sequence length: a second capture on both
    calls = []
    for number, length in enumerate(rows):
        request = make_sp_inputs(config, world, rank, number, length)
        raised = None
        out = None
        try:
            out = gf(**request)
        except Exception as error:  # noqa: BLE001 - reported to the parent, which judges it
            raised = f"{type(error).__name__}: {error}"
        with torch.no_grad():
            expected = module(**request)  # eager, on every rank in the same order
        calls.append(
            {
                "raised": raised,
                "equal": out is not None and torch.equal(out, expected),
                "max_abs_error": None if out is None else (out - expected).abs().max().item(),
                "stats": gf.stats(),
            }
        )
    dist.barrier()
    return {"calls": calls}


def _worker(rank, world, port, result_path, mode, cases) -> None:
    import torch.distributed as dist

    on_gpu = mode == "nccl"
    if on_gpu:
        torch.cuda.set_device(rank)
        config = SPConfig(blocks=4, dim=256, heads=4, rows=256, device=f"cuda:{rank}")
    else:
        config = SPConfig(blocks=2, dim=64, heads=4, rows=32)
    join_group(mode, rank, world, port, GROUP_TIMEOUT_S)
    faults = {**ALIGNABLE, **UNALIGNABLE}
    report = {"rank": rank, "cases": {}}
    try:
        for name in cases.split(","):
            backend = None if on_gpu else load_emulated()
            report["cases"][name] = _run_case(
                name, faults[name], dist.group.WORLD, rank, world, config, on_gpu, backend
            )
            Path(result_path).write_text(json.dumps(report))
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"
        Path(result_path).write_text(json.dumps(report))
        raise
    finally:
        dist.destroy_process_group()


# -- the parent --------------------------------------------------------------------------------


def _run(tmp_path: Path, mode: str, cases: list[str]) -> list[dict]:
    outcomes = run_ranks(
        Path(__file__).resolve(), 2, [mode, ",".join(cases)], tmp_path, DEADLINE_S, mode
    )
    return reports_of(outcomes)


def _check_replays_equal_eager(reports: list[dict], every_call: bool) -> None:
    for report in reports:
        calls = report["cases"]["replay"]["calls"]
        for number, call in enumerate(calls):
            assert call["raised"] is None, (report["rank"], number, call)
            if every_call or number in (0, REPLAY_CALLS):  # the calls that captured
                assert call["equal"], (report["rank"], number, call)
        after_first, last = calls[REPLAY_CALLS - 1]["stats"], calls[-1]["stats"]
        assert after_first["enabled"] is True, after_first
        assert (after_first["captures"], after_first["eager_calls"]) == (1, 0), after_first
        assert after_first["replays"] == REPLAY_CALLS
        assert (last["captures"], last["graphs"], last["eager_calls"]) == (2, 2, 0), last


def _check_all_disabled_with_eager_results(reports: list[dict], case: str) -> None:
    """Every rank is disabled at the first call and keeps no graph, and every output equals
    eager: with a group, the eager run after a failed capture runs the forward on every rank
    (the faulty rank's too, whose fault fires only in graphed's phases), so that the
    collectives pair."""
    for report in reports:
        faulty = report["rank"] == 1
        for number, call in enumerate(report["cases"][case]["calls"]):
            stats = call["stats"]
            assert stats["enabled"] is False, (report["rank"], case, number, call)
            assert (stats["captures"], stats["graphs"], stats["replays"]) == (0, 0, 0), stats
            assert call["raised"] is None, (report["rank"], case, number, call)
            assert call["equal"], (report["rank"], case, number, call)
        reason = report["cases"][case]["calls"][0]["stats"]["disabled_reason"]
        if not faulty:
            assert "another rank of the process group failed" in reason, (case, reason)
        elif case.startswith("sync"):
            assert "synchronizing" in reason, (case, reason)
        else:
            assert "rank-only" in reason or "forward" in reason, (case, reason)


def _check_faulty_cases(reports: list[dict], cases: list[str]) -> None:
    for case in cases:
        if case != "replay":
            _check_all_disabled_with_eager_results(reports, case)


# -- gloo on the CPU (runs in CI) ---------------------------------------------------------------


GLOO_CASES = [name for name in ALIGNABLE if name not in CAPTURE_LIVE_ON_EMULATED]


def test_gloo_no_one_rank_fault_in_the_probe_or_warm_ups_hangs_its_peer(tmp_path, backend_choice):
    reports = _run(tmp_path, "gloo", GLOO_CASES)
    _check_replays_equal_eager(reports, every_call=False)
    _check_faulty_cases(reports, GLOO_CASES)


# -- NCCL on two GPUs ---------------------------------------------------------------------------


@pytest.mark.gpu
@needs_two_gpus
def test_nccl_replays_and_every_alignable_one_rank_fault_end_aligned(tmp_path):
    reports = _run(tmp_path, "nccl", list(ALIGNABLE))
    _check_replays_equal_eager(reports, every_call=True)
    _check_faulty_cases(reports, list(ALIGNABLE))


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("case", list(UNALIGNABLE))
def test_nccl_a_fault_that_cannot_be_aligned_ends_every_rank_by_the_group_timeout(tmp_path, case):
    """A rank that raises before its collectives in a warm-up, or dies, leaves its peer in a
    collective no one will join: nothing can realign them, so the peer must end (by torch's
    watchdog at the group's timeout) instead of waiting forever."""
    outcomes = run_ranks(Path(__file__).resolve(), 2, ["nccl", case], tmp_path, DEADLINE_S, case)
    for outcome in outcomes:
        assert outcome.code is not None, outcome.describe()
    peer = outcomes[0]
    assert peer.code != 0 or (peer.report or {}).get("error"), peer.describe()
    assert peer.seconds < GROUP_TIMEOUT_S + 120, peer.describe()
    said = peer.output.lower() + json.dumps(peer.report or {}).lower()
    assert "timed out" in said or "timeout" in said, peer.describe()


if __name__ == "__main__" and (arguments := worker_arguments()) is not None:
    rank, world, port, result_path, (mode, cases) = arguments
    _worker(rank, world, port, result_path, mode, cases)
