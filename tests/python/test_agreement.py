"""Rank agreement: the ranks of a process group capture together or all fall back to eager.

In tensor-parallel serving every rank runs the same forward; if one rank's capture fails and
another's succeeds, the graphed rank would replay while the eager one runs collectives in a
different order, and the job hangs. GraphedForward(group=...) therefore agrees on every capture
with an all-reduce. These tests run two real processes: over gloo on the CPU with the test
plugin's emulated backend (one rank's captures made to fail by its fault switch), and over NCCL on
two GPUs (one rank's forward synchronizes, a real capture failure). Each child writes its stats
to a JSON file that the parent checks; every wait has a timeout so a broken agreement fails
instead of hanging CI.

Run as a script (`python test_agreement.py worker ...`), this file is the child.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import graphed
import pytest
import torch
from _backend_choice import failing_captures, load_emulated
from _ranks import join_group, needs_two_gpus, reports_of, run_ranks, worker_arguments

CHILD_TIMEOUT_S = 180
GROUP_TIMEOUT_S = 60
ROWS, WIDTH = 6, 8


# -- the child -------------------------------------------------------------------------------


class SmallForward(torch.nn.Module):
    """out = tanh(x @ w + b) * scale; with `synchronize`, it also reads a value back to the host,
    which no capture survives."""

    def __init__(self, synchronize: bool) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1234)
        self.weight = torch.nn.Parameter(torch.randn(WIDTH, WIDTH, generator=generator))
        self.bias = torch.nn.Parameter(torch.randn(WIDTH, generator=generator))
        self.synchronize = synchronize

    def forward(self, *, x, scale):
        out = torch.tanh(x @ self.weight + self.bias) * scale
        if self.synchronize:
            peak = out.abs().max().item()
            out = out / (1.0 + peak)
        return out


class PairedForward(torch.nn.Module):
    """out = 2 * (the sum of every rank's x), by an all-reduce each run, so that a rank's run
    pairs with its peers'; on a rank told to, it then raises an error of its own, every run."""

    def __init__(self, raises: bool) -> None:
        super().__init__()
        self.raises = raises
        self.runs = 0

    def forward(self, *, x):
        import torch.distributed as dist

        total = x.clone()
        dist.all_reduce(total)
        self.runs += 1
        if self.raises:
            raise ValueError("the forward's own error")
        return total * 2


def _own_error_worker(rank: int, world_size: int, port: int, plan: str, result_path: str):
    """Two calls of a forward that raises its own error on the ranks the plan says "raise"."""
    import torch.distributed as dist

    join_group("gloo", rank, world_size, port, GROUP_TIMEOUT_S)
    try:
        module = PairedForward(plan.split(",")[rank] == "raise")
        gf = graphed.GraphedForward(
            module, device="cpu", group=dist.group.WORLD, name="own", backend=load_emulated()
        )
        calls = []
        for number in range(2):
            raised, out = None, None
            try:
                out = gf(x=torch.full((ROWS,), float(rank + 1 + number)))
            except Exception as error:  # noqa: BLE001 - reported to the parent, which judges it
                raised = f"{type(error).__name__}: {error}"
            record = {"raised": raised, "runs": module.runs, "stats": gf.stats()}
            record["out"] = None if out is None else out.tolist()
            calls.append(record)
        dist.barrier()
        report = {"rank": rank, "calls": calls}
    finally:
        dist.destroy_process_group()
    Path(result_path).write_text(json.dumps(report))


def _request(device: torch.device, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(ROWS, WIDTH, generator=generator).to(device),
        "scale": torch.rand(1, generator=generator).to(device) + 0.5,
    }


def _worker(rank: int, world_size: int, port: int, mode: str, plan: str, result_path: str):
    import torch.distributed as dist

    backends = plan.split(",")
    backend, fault = None, contextlib.nullcontext()
    if mode == "gloo":
        backend = load_emulated()
        fault = failing_captures() if backends[rank] == "failing" else contextlib.nullcontext()
        device = torch.device("cpu")
        synchronize = False
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        synchronize = backends[rank] == "sync"
    join_group(mode, rank, world_size, port, GROUP_TIMEOUT_S)
    try:
        module = SmallForward(synchronize).to(device)
        gf = graphed.GraphedForward(
            module, device=device, group=dist.group.WORLD, name="agree", backend=backend
        )
        calls = []
        with fault:
            for seed in (10 + rank, 20 + rank):
                request = _request(device, seed)
                out = gf(**request)
                with torch.no_grad():
                    expected = module(**request)
                calls.append(
                    {
                        "max_abs_error": (out - expected).abs().max().item(),
                        "stats": gf.stats(),
                    }
                )
        dist.barrier()
        report = {"rank": rank, "calls": calls}
    finally:
        dist.destroy_process_group()
    Path(result_path).write_text(json.dumps(report))


# -- the parent ------------------------------------------------------------------------------


def _run_ranks(tmp_path: Path, mode: str, plan: list[str]) -> list[dict]:
    """Runs one child per entry of plan; returns their reports, ordered by rank."""
    outcomes = run_ranks(
        Path(__file__).resolve(), len(plan), [mode, ",".join(plan)], tmp_path, CHILD_TIMEOUT_S, mode
    )
    return reports_of(outcomes)


def _check_eager_results(report: dict, tolerance: float) -> None:
    for call in report["calls"]:
        assert call["max_abs_error"] <= tolerance, (report["rank"], call)


def _check_both_disabled_at_the_first_call(reports: list[dict]) -> None:
    """Both ranks are disabled at the first call, keep no graph, and run eager, correctly."""
    for report in reports:
        first, second = (call["stats"] for call in report["calls"])
        assert first["enabled"] is False, report
        assert first["captures"] == 0
        assert first["graphs"] == 0
        assert first["eager_calls"] == 1
        assert second["enabled"] is False
        assert second["eager_calls"] == 2
        assert second["replays"] == 0
        _check_eager_results(report, tolerance=1e-6)


def test_gloo_capture_failure_on_one_rank_disables_both(tmp_path, backend_choice):
    reports = _run_ranks(tmp_path, "gloo", ["capturing", "failing"])
    _check_both_disabled_at_the_first_call(reports)
    healthy, failing = reports
    assert healthy["calls"][0]["stats"]["backend"] == "emulated"
    assert failing["calls"][0]["stats"]["backend"] == "emulated"
    assert "another rank" in healthy["calls"][0]["stats"]["disabled_reason"]
    assert "emulated capture failure" in failing["calls"][0]["stats"]["disabled_reason"]


def test_gloo_ranks_that_both_capture_stay_enabled(tmp_path, backend_choice):
    reports = _run_ranks(tmp_path, "gloo", ["capturing", "capturing"])
    for report in reports:
        first, second = (call["stats"] for call in report["calls"])
        assert first["enabled"] is True, report
        assert first["backend"] == "emulated"
        assert first["disabled_reason"] is None
        assert (first["captures"], first["replays"], first["eager_calls"]) == (1, 1, 0)
        # Same shapes again: a replay, no second capture and no agreement needed.
        assert (second["captures"], second["replays"], second["eager_calls"]) == (1, 2, 0)
        assert second["enabled"] is True
        # The emulated launch does no work, so only the first call's output (written by the
        # capture-time forward from the same inputs) is comparable with eager.
        assert report["calls"][0]["max_abs_error"] <= 1e-6


def test_gloo_a_forwards_own_error_on_one_rank_disables_both_and_runs_it_again_eagerly(
    tmp_path, backend_choice
):
    """With a group the forward's own error is a capture failure: both ranks disable, and the
    eager run after it runs the forward again on both (the raising rank's too, which raises it
    again to its caller), so that their all-reduces pair; without a group the caller gets it at
    once (test_graphed_cpu.py, test_the_forwards_own_exception_keeps_its_type_runs_once...)."""
    reports = _run_ranks(tmp_path, "gloo_own_error", ["fine", "raise"])
    fine, raising = reports
    calls = zip(fine["calls"], raising["calls"], strict=True)
    for number, (fine_call, raising_call) in enumerate(calls):
        assert raising_call["raised"] == "ValueError: the forward's own error", raising_call
        assert fine_call["raised"] is None, fine_call
        expected = 2.0 * ((1 + number) + (2 + number))
        assert fine_call["out"] == [expected] * ROWS
        for call in (fine_call, raising_call):
            assert call["stats"]["enabled"] is False, call
            assert (call["stats"]["captures"], call["stats"]["graphs"]) == (0, 0), call
    # The probe, then the eager run after the failed agreement; then one eager run.
    assert [call["runs"] for call in fine["calls"]] == [2, 3]
    assert [call["runs"] for call in raising["calls"]] == [2, 3]
    assert "another rank" in fine["calls"][0]["stats"]["disabled_reason"]
    assert "forward" in raising["calls"][0]["stats"]["disabled_reason"]


@pytest.mark.gpu
@needs_two_gpus
def test_nccl_capture_failure_on_one_rank_disables_both(tmp_path):
    reports = _run_ranks(tmp_path, "nccl", ["plain", "sync"])
    _check_both_disabled_at_the_first_call(reports)
    assert all(report["calls"][0]["stats"]["backend"] == "cuda" for report in reports)
    healthy, failing = reports
    assert "another rank" in healthy["calls"][0]["stats"]["disabled_reason"]
    assert "synchroniz" in failing["calls"][0]["stats"]["disabled_reason"]


@pytest.mark.gpu
@needs_two_gpus
def test_nccl_ranks_that_both_capture_stay_enabled(tmp_path):
    reports = _run_ranks(tmp_path, "nccl", ["plain", "plain"])
    for report in reports:
        for number, call in enumerate(report["calls"], start=1):
            stats = call["stats"]
            assert stats["enabled"] is True, report
            assert stats["backend"] == "cuda"
            assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, number, 0)
        # Real replays on a GPU: both calls match eager.
        _check_eager_results(report, tolerance=1e-5)


if __name__ == "__main__" and (arguments := worker_arguments()) is not None:
    rank, world_size, port, result_path, (mode, plan) = arguments
    if mode == "gloo_own_error":
        _own_error_worker(rank, world_size, port, plan, result_path)
    else:
        _worker(rank, world_size, port, mode, plan, result_path)
