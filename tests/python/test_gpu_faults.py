"""Device faults graphed must survive on a GPU: a forward that runs out of memory during capture
(the caller gets the out-of-memory error as eagerly, the entry's buffers are released, the runner
stays enabled and a smaller key still captures), a forward that fits eagerly but not beside its
capture (eager's result, after the attempt gave back what it took), a replay after
torch.cuda.empty_cache(), and a capture that other work invalidates (the runner is disabled with
the reason and calls run eager; the process and other runners keep working)."""

from __future__ import annotations

import threading

import pytest
import torch
from graphed import GraphedForward
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class Greedy(nn.Module):
    """Asks for far more memory than the device has when given more than 1000 rows."""

    def forward(self, *, x):
        if x.shape[0] > 1000:
            free, _ = torch.cuda.mem_get_info()
            torch.empty(2 * free, dtype=torch.uint8, device=x.device)
        return x * 3


def test_out_of_memory_during_capture_leaves_the_runner_working():
    gf = GraphedForward(Greedy(), device="cuda")
    with pytest.raises(torch.OutOfMemoryError):
        gf(x=torch.ones(2000, device="cuda"))
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["graphs"] == 0 and stats["pool_bytes"] == 0
    x = torch.arange(8.0, device="cuda")
    torch.testing.assert_close(gf(x=x), x * 3)
    assert gf.stats()["captures"] == 1


def test_replay_after_empty_cache():
    gf = GraphedForward(Greedy(), device="cuda")
    x = torch.randn(64, device="cuda")
    torch.testing.assert_close(gf(x=x), x * 3)
    torch.cuda.empty_cache()
    y = torch.randn(64, device="cuda")
    torch.testing.assert_close(gf(x=y), y * 3)
    assert gf.stats()["replays"] == 1  # the first call: its last warm-up's outputs


class Interfered(nn.Module):
    """While it is being captured, another thread synchronizes the device: the capture is
    invalidated, as by any other work that a global capture forbids."""

    def forward(self, *, x):
        if torch.cuda.is_current_stream_capturing():
            thread = threading.Thread(target=self._synchronize)
            thread.start()
            thread.join()
        return x + 1

    @staticmethod
    def _synchronize():
        try:
            torch.cuda.synchronize()
        except RuntimeError:
            pass  # the capture makes this fail; what matters is the capture's end


def test_a_capture_invalidated_by_another_thread_runs_eager():
    gf = GraphedForward(Interfered(), device="cuda", warmup_iters=0)
    x = torch.randn(16, device="cuda")
    torch.testing.assert_close(gf(x=x), x + 1)
    stats = gf.stats()
    if stats["enabled"]:
        pytest.skip("this driver let the other thread's synchronize pass during capture")
    assert "capture failed" in stats["disabled_reason"]
    torch.testing.assert_close(gf(x=x), x + 1)
    other = GraphedForward(Greedy(), device="cuda")
    torch.testing.assert_close(other(x=x), x * 3)
    assert other.stats()["captures"] == 1


class NeedsThreeBuffers(nn.Module):
    """Eagerly holds its input and two intermediates of the same size at once, and returns a row."""

    def forward(self, *, x):
        doubled = x * 2
        tripled = doubled * 3
        return tripled[:1] + doubled[:1]


def test_a_forward_that_fits_eagerly_gets_eagers_result_when_its_capture_does_not_fit():
    """The allocator capped so that the forward fits eagerly (its input and two intermediates) but
    not beside a capture's static copy of its input: the attempt runs out in its sync probe, gives
    back what it took (the copy, and the probe's intermediate cached in the graph pool, which no
    eager run could use), and the call runs eager. Three calls in a row return eager's result."""
    unit = 256 * 2**20  # bytes of the input, and of each intermediate
    x = torch.randn(unit // 4, device="cuda")
    want = x[:1] * 2 * 3 + x[:1] * 2
    gf = GraphedForward(NeedsThreeBuffers(), device="cuda", name="capped")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 2.5 * unit) / total)
    try:
        for call in range(3):
            torch.testing.assert_close(gf(x=x), want, rtol=0, atol=0, msg=f"call {call}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["eager_calls"], stats["graphs"]) == (0, 3, 0), stats
    small = torch.randn(64, device="cuda")
    torch.testing.assert_close(gf(x=small), small[:1] * 2 * 3 + small[:1] * 2, rtol=0, atol=0)
    assert gf.stats()["captures"] == 1, "another key still captures"
