"""Forward patterns that the CPU can show: an input written in place reaches the caller's tensor
also when graphed handed the forward a dense copy of it (a strided view, a lazily conjugated
one), on both call paths. The GPU half of these patterns is test_patterns_gpu.py."""

from __future__ import annotations

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
