"""Forward patterns that the CPU can show: an input written in place reaches the caller's tensor
also when graphed handed the forward a dense copy of it (a strided view, a lazily conjugated
one), on both call paths. The GPU half of these patterns is test_patterns_gpu.py."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from graphed import GraphedForward


class WritesRow(torch.nn.Module):
    def forward(self, *, cache, row, value):
        cache.index_copy_(0, row, value)
        return cache.sum(dim=1)


@pytest.mark.parametrize("variant", [None, ("python-path",)])
def test_a_strided_input_written_in_place_is_written_back(variant):
    gf = GraphedForward(WritesRow(), device="cpu")
    eager_cache = torch.zeros(8, 4)[::2]
    graphed_cache = torch.zeros(8, 4)[::2]
    assert not graphed_cache.is_contiguous()
    for step in range(3):
        row = torch.tensor([step])
        value = torch.full((1, 4), float(step + 1))
        with torch.no_grad():
            want = WritesRow()(cache=eager_cache, row=row, value=value)
        got = gf(cache=graphed_cache, row=row, value=value, variant=variant)
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(graphed_cache, eager_cache)


class SaysItSynchronizes(torch.nn.Module):
    """Stands in for a forward with a host sync: on the CPU, torch's sync-debug warning is the
    only trace of one that the probe listens for."""

    def __init__(self) -> None:
        super().__init__()
        self.finished = 0

    def forward(self, *, x):
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)  # the sync
        warnings.warn("an unrelated warning of the forward", UserWarning, stacklevel=1)
        self.finished += 1  # the forward ran to its end
        return x * 2


@pytest.mark.parametrize("user_filter", ["default", "error", "ignore"])
def test_the_sync_probe_lets_the_forward_finish_then_fails_naming_the_line(
    emulated_backend, user_filter
):
    module = SaysItSynchronizes()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, name="syncs")
    x = torch.arange(4.0)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter(user_filter)
        warnings.filterwarnings("always", message="an unrelated")
        if user_filter == "error":
            # The eager run after the disable raises where the user's filter says; the probe
            # before it had run the whole forward all the same.
            with pytest.raises(UserWarning, match="synchronizing"):
                gf(x=x)
        else:
            torch.testing.assert_close(gf(x=x), x * 2)
    # The probe ran the whole forward, then the eager run after the disable ran it again.
    assert module.finished == (1 if user_filter == "error" else 2)
    stats = gf.stats()
    assert stats["enabled"] is False
    assert stats["captures"] == 0
    reason = stats["disabled_reason"]
    assert "called a synchronizing CUDA operation at " in reason, reason
    assert "test_patterns_cpu.py:" in reason, reason
    # Other warnings of the probe's forward are shown as ever; the sync one only where the probe
    # was not listening (the eager run), and as the user's filter says.
    unrelated = [w for w in shown if "an unrelated" in str(w.message)]
    assert len(unrelated) == (1 if user_filter == "error" else 2), [str(w) for w in shown]
    syncs = [w for w in shown if "synchronizing" in str(w.message)]
    assert len(syncs) == (1 if user_filter == "default" else 0), [str(w) for w in shown]


class MeetsInItsProbe(torch.nn.Module):
    """Waits in its probe until the other thread's probe is running too; `synchronizes` says
    whether it also gives torch's sync warning there."""

    def __init__(self, barrier: threading.Barrier, synchronizes: bool) -> None:
        super().__init__()
        self.barrier = barrier
        self.synchronizes = synchronizes

    def forward(self, *, x):
        if int(torch.ops.graphed.forward_phase()) == 1:  # the probe
            self.barrier.wait(timeout=30)
            if self.synchronizes:
                warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
            self.barrier.wait(timeout=30)
        return x + 1


def test_probes_overlapping_on_two_threads_count_only_their_own_syncs(emulated_backend):
    barrier = threading.Barrier(2)
    runners = {
        "syncs": GraphedForward(
            MeetsInItsProbe(barrier, True), device="cpu", backend=emulated_backend, name="syncs"
        ),
        "clean": GraphedForward(
            MeetsInItsProbe(barrier, False), device="cpu", backend=emulated_backend, name="clean"
        ),
    }
    shown_before, filters_before = warnings.showwarning, list(warnings.filters)
    results, errors = {}, []

    def call(name: str) -> None:
        try:
            results[name] = runners[name](x=torch.zeros(3))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(name,)) for name in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for name in runners:
        torch.testing.assert_close(results[name], torch.ones(3))
    assert runners["syncs"].stats()["enabled"] is False
    assert "synchronizing" in runners["syncs"].stats()["disabled_reason"]
    assert runners["clean"].stats()["enabled"] is True, runners["clean"].stats()
    assert runners["clean"].stats()["captures"] == 1
    # The last probe to end put the process's warning hook and filters back.
    assert warnings.showwarning is shown_before
    assert warnings.filters == filters_before
