"""Why this exists: when the churn guard starts (ops/gf_churn.h: new keys keep arriving and none
comes back), the user needs to know which argument makes every call a new key, in the words of
their call: `kwargs['scale']: a float, 12 values`, `kwargs['x']: dim 1, 9 sizes`. The core sees
only key bytes; this module keeps a short record of the kwargs of the latest calls that had no
graph (the forward runs that capture a key or run one eagerly, so nothing is recorded on a replay)
and names the paths whose value, or tensor size, differs among them."""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.utils import _pytree as pytree

# How many calls without a graph are remembered, and how many paths a warning names.
_REMEMBERED = 32
_NAMED = 4


def _summary(kwargs: dict) -> dict[str, Any]:
    """Each leaf of a call's kwargs by its path: a tensor as (dtype, shape), else its value (or
    its type where it cannot be hashed)."""
    leaves, _ = pytree.tree_flatten_with_path(kwargs)
    summary = {}
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            value: Any = ("tensor", leaf.dtype, tuple(leaf.shape))
        else:
            try:
                hash(leaf)
                value = leaf
            except TypeError:
                value = ("object", type(leaf).__name__, id(leaf))
        summary["kwargs" + pytree.keystr(path)] = value
    return summary


def _phrase(path: str, values: list) -> str | None:
    """What differs at `path` among `values` (one per remembered call), or None."""
    distinct = set(values)
    if len(distinct) < 2:
        return None
    tensors = [value for value in values if isinstance(value, tuple) and value[:1] == ("tensor",)]
    if len(tensors) == len(values):
        ranks = {len(shape) for _, _, shape in tensors}
        if len(ranks) == 1:
            (rank,) = ranks
            varying = [
                (dim, len({shape[dim] for _, _, shape in tensors}))
                for dim in range(rank)
                if len({shape[dim] for _, _, shape in tensors}) > 1
            ]
            if varying:
                return f"{path}: " + ", ".join(f"dim {dim}, {n} sizes" for dim, n in varying)
        return f"{path}: {len({value[1:] for value in tensors})} dtypes and shapes"
    kinds = {type(value).__name__ for value in values}
    kind = kinds.pop() if len(kinds) == 1 else "value"
    return f"{path}: a {kind}, {len(distinct)} values"


class NewKeys:
    """The kwargs of a runner's latest calls that had no graph (see the module docstring)."""

    def __init__(self) -> None:
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=_REMEMBERED)

    def record(self, kwargs: dict) -> None:
        self._recent.append(_summary(kwargs))

    def describe(self) -> str:
        """The paths that differ among the remembered calls ("" when none can be named), each
        with how: "kwargs['scale']: a float, 3 values"."""
        recent = list(self._recent)
        if len(recent) < 2:
            return ""
        paths = [path for path in recent[-1] if all(path in summary for summary in recent)]
        phrases = [
            phrase
            for path in paths
            if (phrase := _phrase(path, [summary[path] for summary in recent])) is not None
        ]
        if not phrases and any(summary.keys() != recent[-1].keys() for summary in recent):
            phrases = ["the kwargs' structure (which arguments are passed)"]
        named = "; ".join(phrases[:_NAMED])
        return named + (f"; and {len(phrases) - _NAMED} more" if len(phrases) > _NAMED else "")


__all__ = ["NewKeys"]
