"""The two floors graphed's host cost is compared against, built the same way for every workload:
a bare replay of a graph captured by hand (`g.replay()` with no copies at all: what launching a
captured graph costs) and an empty dispatcher operator that takes the same Tensor[] as
`torch.ops.graphed.forward` (what crossing the dispatcher with K tensors costs before any work).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BareGraph", "capture_bare", "passthrough_op"]

_library: torch.library.Library | None = None
_EMPTY = torch.empty(0)


def _passthrough(xs: list[torch.Tensor]) -> torch.Tensor:
    del xs
    return _EMPTY


def passthrough_op() -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """`torch.ops.graphed_bench.passthrough(Tensor[] xs) -> Tensor`: a no-op that returns an empty
    tensor created once, so a call costs the dispatcher's parsing of xs and nothing else (its
    kernel is a Python function, so the call also pays the dispatcher's call back into Python)."""
    global _library
    if _library is None:
        library = torch.library.Library("graphed_bench", "DEF")
        library.define("passthrough(Tensor[] xs) -> Tensor")
        library.impl("passthrough", _passthrough, "CompositeExplicitAutograd")
        _library = library
    return torch.ops.graphed_bench.passthrough


class BareGraph:
    """A forward captured by hand on static inputs, replayed with nothing else around it."""

    def __init__(self, graph: torch.cuda.CUDAGraph, static_kwargs: dict, static_output: Any):
        self.graph = graph
        self.static_kwargs = static_kwargs
        self.static_output = static_output
        self.replay = graph.replay


def _clone_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _clone_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_tree(item) for item in value)
    return value


def capture_bare(
    fn: Callable[..., Any],
    kwargs: dict,
    *,
    warmup_iters: int = 2,
    pool: Any = None,
) -> BareGraph:
    """Captures fn(**static) where static is a clone of `kwargs`: warm-up on a side stream, then
    torch.cuda.graph, the PyTorch documentation's recipe."""
    static_kwargs = _clone_tree(kwargs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_iters):
            fn(**static_kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        static_output = fn(**static_kwargs)
    graph.replay()
    torch.cuda.synchronize()
    return BareGraph(graph, static_kwargs, static_output)
