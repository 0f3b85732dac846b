"""Why this exists: when the churn guard starts (ops/gf_churn.h: new keys keep arriving and none
comes back), the user needs to know which argument makes every call a new key, in the words of
their call: `kwargs['scale']: a float, 12 values`, `kwargs['x']: dim 1, 9 sizes`. The core sees
only key bytes; this module keeps a short record of the kwargs of the latest calls that had no
graph (the forward runs that capture a key or run one eagerly, so nothing is recorded on a replay)
and names the paths whose value, or tensor size, differs among them.

A record is what the call's kwargs can be rebuilt from (its key or tree, and each tensor's dtype
and shape), not their summary: a storm runs every call eager through here, and summarising each
with pytree's paths cost about a third of graphed's own time on such a call (34 of 95 us, a
2-core x86 host); the summaries are made only when the guard starts and asks."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ._baked import SCALAR_TYPES

# How many calls without a graph are remembered, and how many paths a warning names.
_REMEMBERED = 32
_NAMED = 4


def _leaf(leaf: Any) -> Any:
    """A tensor as (dtype, shape); a small immutable value (the watch's scalars) as itself; any
    other object as its type and identity, so that the record holds no reference to it."""
    if isinstance(leaf, torch.Tensor):
        return ("tensor", leaf.dtype, tuple(leaf.shape))
    if isinstance(leaf, SCALAR_TYPES):
        return leaf
    return ("object", type(leaf).__name__, id(leaf))


def _summary(kwargs: dict) -> dict[str, Any]:
    """Each leaf of a call's kwargs by its path (see _leaf); a kwarg whose containers pytree
    cannot name the paths of (a type registered without flatten_with_keys_fn) as a whole."""
    try:
        leaves, _ = pytree.tree_flatten_with_path(kwargs)
    except Exception:  # noqa: BLE001 - a diagnostic; the call must go on whatever it holds
        return {f"kwargs[{name!r}]": _leaf(value) for name, value in kwargs.items()}
    return {"kwargs" + pytree.keystr(path): _leaf(leaf) for path, leaf in leaves}


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
            sizes = [len({shape[dim] for _, _, shape in tensors}) for dim in range(rank)]
            varying = [(dim, count) for dim, count in enumerate(sizes) if count > 1]
            if varying:
                return f"{path}: " + ", ".join(f"dim {dim}, {n} sizes" for dim, n in varying)
        return f"{path}: {len({value[1:] for value in tensors})} dtypes and shapes"
    kinds = {type(value).__name__ for value in values}
    kind = kinds.pop() if len(kinds) == 1 else "value"
    return f"{path}: a {kind}, {len(distinct)} values"


class NewKeys:
    """The kwargs of a runner's latest calls that had no graph (see the module docstring).
    `rebuild(source, tensors)` gives back a call's kwargs from what `record` was given (its
    key or tree) and stand-ins for its tensors."""

    def __init__(self, rebuild: Callable[[Any, list], dict]) -> None:
        self._rebuild = rebuild
        self._recent: collections.deque[tuple] = collections.deque(maxlen=_REMEMBERED)

    def record(self, source: Any, tensors: list[torch.Tensor]) -> None:
        """Remembers one call without a graph: `source`, the call's key or tree, and its
        tensors' dtypes and shapes (no reference to a tensor is kept)."""
        self._recent.append((source, [(tensor.dtype, tensor.shape) for tensor in tensors]))

    def _summary_of(self, source: Any, metas: list) -> dict[str, Any]:
        """One remembered call's summary (see _summary), its tensors stood for by meta tensors;
        {} when it cannot be rebuilt (it only feeds a warning)."""
        try:
            stand_ins = [torch.empty(shape, dtype=dtype, device="meta") for dtype, shape in metas]
            return _summary(self._rebuild(source, stand_ins))
        except Exception:  # noqa: BLE001 - a diagnostic must not fail the call
            return {}

    def describe(self) -> str:
        """The paths that differ among the remembered calls ("" when none can be named), each
        with how: "kwargs['scale']: a float, 3 values". Asked when the guard starts, which then
        forgets them: the calls it holds back are not recorded (GraphedForward runs them itself),
        so a later start names the calls since."""
        recent = [self._summary_of(source, metas) for source, metas in self._recent]
        self._recent.clear()
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


# New keys in a row, none seen before, after which a runner without graphs says what a device with
# graphs would have done (ops/gf_churn.h's GF_CHURN_VALUE_REPORT, the core's own report).
_KEYS_WITHOUT_GRAPHS = 4
_SIGNATURES_KEPT = 256
_log = logging.getLogger("graphed")


class KeysWithoutGraphs:
    """Where graphs are unavailable (no GPU, a build without the device's backend) every call runs
    eager and the core never sees a key, so its churn guard would never tell a user developing on
    a laptop that every call of theirs is a new key, each a capture on a GPU. This keeps the
    guard's count in Python for such a runner, from the key the C walker builds (microseconds a
    call), and warns once, as the guard would, naming what changes (NewKeys)."""

    def __init__(self, name: str, new_keys: NewKeys, churn_limit: int) -> None:
        self.name = name
        self.new_keys = new_keys
        self.limit = max(churn_limit, _KEYS_WITHOUT_GRAPHS) if churn_limit > 0 else 0
        self.seen: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self.new_in_a_row = 0

    def note(self, kwargs: dict, flatten: Callable[[dict], Any]) -> None:
        """One eager call of the runner: its key (`flatten(kwargs)`: (key, tensors), or not a
        tuple for a call the C walker hands to Python, which is not counted)."""
        if not self.limit:
            return
        flat = flatten(kwargs)
        if not isinstance(flat, tuple):
            return
        key, tensors = flat[0], flat[1]
        signature = (key, tuple((tensor.dtype, tuple(tensor.shape)) for tensor in tensors))
        if signature in self.seen:
            self.seen.move_to_end(signature)
            self.new_in_a_row = 0
            return
        self.seen[signature] = None
        if len(self.seen) > _SIGNATURES_KEPT:
            self.seen.popitem(last=False)
        self.new_keys.record(key, tensors)
        self.new_in_a_row += 1
        if self.new_in_a_row < self.limit:
            return
        self.limit = 0  # said once
        what = self.new_keys.describe() or "not named"
        _log.warning(
            "runner '%s': %d new keys in a row, none reused. Graphs are unavailable here, so "
            "these calls run eager as every call does; on a device with graphs each new key would "
            "cost a capture, and graphed's churn guard would run such calls eager. What changes "
            "from call to call: %s. A value that changes every call can be passed as a tensor "
            "(graphed keys a tensor by its shape, not its values); see docs/troubleshooting.md",
            self.name,
            self.new_in_a_row,
            what,
        )


__all__ = ["KeysWithoutGraphs", "NewKeys"]
