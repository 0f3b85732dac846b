"""Sizes at the edges of what a runner accepts: a huge max_entries must neither hang nor allocate
up front, and a warmup_iters that does not fit the core's int is refused instead of wrapping."""

import sys

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
