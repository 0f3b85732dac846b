"""Sizes at the edges of what a runner accepts: a huge max_entries must neither hang nor allocate
up front, a warmup_iters that does not fit the core's int is refused instead of wrapping, and a
runner that sees thousands of keys come and go (evicted, then reset()) holds no more host memory
for it, on either call path."""

import gc
import sys
import tracemalloc

import graphed
import pytest
import torch


class AddOne(torch.nn.Module):
    def forward(self, *, x):
        return x + 1


def test_huge_max_entries_creates_and_runs():
    gf = graphed.GraphedForward(AddOne(), device="cpu", max_entries=sys.maxsize)
    x = torch.arange(4.0)
    torch.testing.assert_close(gf(x=x), x + 1)


def test_warmup_iters_that_would_wrap_is_refused():
    with pytest.raises(ValueError, match="warmup_iters between 0 and 2147483647"):
        graphed.GraphedForward(AddOne(), device="cpu", warmup_iters=2**32 + 3)


class Scales(torch.nn.Module):
    def forward(self, *, x, scale):
        return x * scale


@pytest.mark.parametrize("guard", ["captures", "guarded"])
@pytest.mark.parametrize("path", ["fast", "python"])
def test_host_memory_stays_flat_over_thousands_of_keys(emulated_backend, path, guard):
    """Each call a new key (a float that changes every call, as a sigma does), max_entries=16 so
    that keys are evicted, reset() after each batch: what the second batch of keys leaves behind
    is what the first left (bounded records such as a runner's recent keys), not bytes per key;
    with every key captured (churn_limit=0) and with the churn guard running them eager."""
    runner = graphed.GraphedForward(
        Scales(),
        device="cpu",
        backend=emulated_backend,
        max_entries=16,
        name=f"churn-{path}",
        churn_limit=0 if guard == "captures" else 2,
    )
    x = torch.ones(4)
    # A tuple variant takes the Python path (graphed._tree) instead of the C walker.
    options = {"variant": ("python-path",)} if path == "python" else {}

    def batch(first: float, keys: int) -> None:
        for index in range(keys):
            runner(x=x, scale=first + index, **options)
        runner.reset()
        gc.collect()

    # Traced from the start, so that what bounded records (the latest keys' kwargs, a runner's
    # recent shapes) replace is counted as freed; two batches fill them. The allocator's arenas
    # can take a batch or two more to settle (6.7, 4.4, 1.6 KB, then none, seen on a 2-core
    # host), so up to three measured batches run until one holds nothing per key. A leak holds
    # bytes in every batch (fb188f9's held 35 a key, 105 KB a batch), and fails all three.
    tracemalloc.start()
    held = []
    try:
        batch(0.0, 500)
        batch(1e5, 3000)
        for measured in range(3):
            before = tracemalloc.get_traced_memory()[0]
            batch(1e6 * (measured + 1), 3000)
            held.append(tracemalloc.get_traced_memory()[0] - before)
            if held[-1] < 3000 * 3:
                break
    finally:
        tracemalloc.stop()
    batches = 2 + len(held)
    # Each key captures; the guard lets one a batch capture (a float).
    captured = 500 + 3000 * (batches - 1) if guard == "captures" else batches
    assert runner.stats()["captures"] == captured, runner.stats()
    assert held[-1] < 3000 * 3, f"bytes held after each batch of 3000 keys came and went: {held}"
