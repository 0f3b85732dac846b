"""The seed's pure-Python graph wrapper: the baseline graphed has to beat, kept here so that every
benchmark run measures it beside graphed on the same machine.

It does what a careful Python wrapper of a keyword-only forward does, and nothing cleverer: each
call walks the kwargs in Python into a signature (the tree's structure, every non-tensor value,
each tensor's dtype, shape and device); a new signature warms the forward up on a side stream and
captures it with torch.cuda.graph (as the PyTorch docs say), reading from static clones of the
inputs; a known signature copies each live tensor into its static buffer with one `copy_` per
tensor, replays the graph and returns Python clones of the outputs. A bounded LRU holds the
graphs. By default each graph gets its own memory pool, as in the docs' basic recipe;
share_pool=True puts all of a wrapper's graphs in one pool (the docs' recipe for many graphs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SeedGraphedForward"]


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor]
    static_output: Any


def _signature(value: Any, tensors: list[torch.Tensor]) -> Any:
    """A hashable description of `value`'s structure; appends its tensors to `tensors`."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("T", value.dtype, tuple(value.shape), value.device)
    if isinstance(value, dict):
        return ("D", tuple((key, _signature(item, tensors)) for key, item in value.items()))
    if isinstance(value, list):
        return ("L", tuple(_signature(item, tensors) for item in value))
    if isinstance(value, tuple):
        return ("U", type(value), tuple(_signature(item, tensors) for item in value))
    try:
        hash(value)
    except TypeError:
        return ("R", type(value), repr(value))
    return ("V", type(value), value)


def _substitute(value: Any, tensors: list[torch.Tensor], position: list[int]) -> Any:
    """`value` with its tensors replaced, in walk order, by `tensors`."""
    if isinstance(value, torch.Tensor):
        replacement = tensors[position[0]]
        position[0] += 1
        return replacement
    if isinstance(value, dict):
        return {key: _substitute(item, tensors, position) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, tensors, position) for item in value]
    if isinstance(value, tuple):
        items = [_substitute(item, tensors, position) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def _clone_outputs(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _clone_outputs(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clone_outputs(item) for item in value]
    if isinstance(value, tuple):
        items = [_clone_outputs(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


class SeedGraphedForward:
    """Captures `module`'s keyword-only forward once per kwargs signature and replays it."""

    def __init__(
        self,
        module: Callable[..., Any],
        *,
        device: torch.device | str,
        max_entries: int = 16,
        warmup_iters: int = 2,
        share_pool: bool = False,
    ) -> None:
        self.module = module
        self.device = torch.device(device)
        self.max_entries = max_entries
        self.warmup_iters = warmup_iters
        self._pool = torch.cuda.graph_pool_handle() if share_pool else None
        self._side_stream = torch.cuda.Stream(device=self.device)
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        self.captures = 0
        self.replays = 0
        self.evictions = 0

    def __call__(self, **kwargs: Any) -> Any:
        tensors: list[torch.Tensor] = []
        signature = _signature(kwargs, tensors)
        entry = self._entries.get(signature)
        if entry is None:
            entry = self._capture(kwargs, tensors, signature)
        else:
            self._entries.move_to_end(signature)
            for static, live in zip(entry.static_inputs, tensors, strict=True):
                static.copy_(live)
        entry.graph.replay()
        self.replays += 1
        return _clone_outputs(entry.static_output)

    def _capture(self, kwargs: dict, tensors: list[torch.Tensor], signature: Any) -> _Entry:
        static_inputs = [tensor.clone() for tensor in tensors]
        static_kwargs = _substitute(kwargs, static_inputs, [0])
        # Warm-up on a side stream, as torch.cuda.graph's documentation asks.
        current = torch.cuda.current_stream(self.device)
        self._side_stream.wait_stream(current)
        with torch.cuda.stream(self._side_stream):
            for _ in range(self.warmup_iters):
                self.module(**static_kwargs)
        current.wait_stream(self._side_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_output = self.module(**static_kwargs)
        entry = _Entry(graph, static_inputs, static_output)
        self._entries[signature] = entry
        self.captures += 1
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1
        return entry

    def stats(self) -> dict[str, int]:
        return {
            "graphs": len(self._entries),
            "captures": self.captures,
            "replays": self.replays,
            "evictions": self.evictions,
        }
