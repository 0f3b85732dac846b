"""Why this exists: the one comparison of a graphed call's output with eager's that the
third-party model tests share: the same container type and tree (a ModelOutput's keys, a tuple's
length, through torch.utils._pytree, which both diffusers and transformers register their outputs
with), every tensor leaf of eager's shape and dtype and, where the replay computed it, its bits."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten


def assert_same_output(got, want, *, values: bool) -> None:
    """`got` has `want`'s type and tree; each non-tensor leaf is equal; each tensor has its shape
    and dtype and, with `values`, its exact bits."""
    assert type(got) is type(want)
    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(want)
    assert got_spec == want_spec, (got_spec, want_spec)
    for index, (mine, eagers) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if not isinstance(eagers, torch.Tensor):
            assert mine == eagers, index
        elif values:
            torch.testing.assert_close(
                mine, eagers, rtol=0, atol=0, msg=lambda m, index=index: f"output {index}: {m}"
            )
        else:
            assert (mine.shape, mine.dtype) == (eagers.shape, eagers.dtype), index
