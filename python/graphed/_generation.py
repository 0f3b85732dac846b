"""graph_generation: transformers' `model.generate(...)` with its decode steps replayed from graphs.

generate() calls the model once per new token with kwargs a graph can hold: `input_ids` of one
token a row, a 4D attention mask as long as the cache, `use_cache`, `return_dict`. One kwarg it
cannot: `past_key_values`, a `StaticCache` object holding the keys and values (graphed refuses an
object holding tensors among the kwargs, naming its path). A static cache's tensors never move
(StaticLayer allocates them once and writes in place, its length included, as a device tensor),
so the decode step needs no cache among its inputs: the graph reads and writes those tensors
where they are. What this file does, and only that:

- `model.forward` (an instance attribute, as accelerate's hooks set it) routes a decode step on
  a static cache to a GraphedForward of the step, the cache taken out of the kwargs and its
  tensors given as keep_alive (held by the entry, so they outlive its graph) and its tensors'
  addresses as the variant (a graph is one cache's graph); the output gets the cache back.
  Everything else (the prefill, a dynamic cache, a sliding-window layer, whose host-side length
  a graph would bake in) runs the model's own forward, eagerly.
- `model.get_compiled_call` returns the model's plain call: generate() would otherwise wrap the
  decode step in torch.compile on a GPU with a static cache, and compile would trace past the
  graph.
- graphed's probe and warm-up forwards before a capture are runs eager would not make, and each
  advances the cache's length: the step puts the lengths back after them (the keys and values
  they wrote sit at the position the captured step writes again).

`GraphedGeneration.remove()` puts both attributes back.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from . import _phases
from ._forward import GraphedForward

__all__ = ["GraphedGeneration", "graph_generation"]

_CACHE_KWARG = "past_key_values"
# The runs of the step the core makes before a capture, besides the one the caller asked for.
_EXTRA_RUNS = (_phases.PHASE_PROBE, _phases.PHASE_WARMUP)


def _static_layer_type() -> type | None:
    try:
        from transformers.cache_utils import StaticLayer
    except ImportError:
        return None
    return StaticLayer


def _graphable_cache_tensors(cache: Any, static_layer: type | None) -> list[torch.Tensor] | None:
    """The tensors of a cache a decode graph can hold by address (each layer's keys, values and
    length), or None for any other cache: a dynamic one (it grows), a sliding-window or other
    StaticLayer subclass (it keeps a Python int the graph would bake in), an offloading one (it
    moves its tensors), or one the prefill has not allocated yet."""
    if static_layer is None or getattr(cache, "offloading", True):
        return None
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    tensors: list[torch.Tensor] = []
    for layer in layers:
        if type(layer) is not static_layer or not layer.is_initialized:
            return None
        tensors += (layer.keys, layer.values, layer.cumulative_length)
    return tensors


def _one_token_a_row(kwargs: dict) -> bool:
    """A decode step: the forward extends each sequence by one position."""
    tokens = kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
        return isinstance(tokens, torch.Tensor) and tokens.dim() == 3 and tokens.shape[1] == 1
    return isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[1] == 1


class _DecodeStep(torch.nn.Module):
    """What the decode graph captures: the model's own forward on the cache of the call in flight
    (set per call, per thread), its output without the cache (generate gets it back outside)."""

    def __init__(self, model: torch.nn.Module, forward: Any) -> None:
        super().__init__()
        self.model = model
        self._model_forward = forward
        self._in_flight = threading.local()

    def forward(self, **kwargs: Any) -> Any:
        cache = self._in_flight.cache
        lengths = [layer.cumulative_length for layer in cache.layers]
        saved = (
            [length.clone() for length in lengths]
            if _phases.current_phase() in _EXTRA_RUNS
            else None
        )
        output = self._model_forward(**kwargs, past_key_values=cache)
        if saved is not None:
            with torch.no_grad():
                for length, before in zip(lengths, saved, strict=True):
                    length.copy_(before)
        return type(output)(**{key: value for key, value in output.items() if key != _CACHE_KWARG})


class GraphedGeneration:
    """The handle graph_generation returns: the decode steps' GraphedForward (`graphed`), their
    counters, and `remove()`."""

    def __init__(self, model: torch.nn.Module, **options: Any) -> None:
        if "forward" in vars(model) or "get_compiled_call" in vars(model):
            raise ValueError(
                "graphed: this model's forward (or get_compiled_call) is already replaced on the "
                "instance (graph_generation applied twice, or another library's hook); remove that "
                "first"
            )
        self.model = model
        self._model_forward = model.forward
        self._step = _DecodeStep(model, self._model_forward)
        self.graphed = GraphedForward(self._step, **options)
        self._static_layer = _static_layer_type()
        self.eager_forwards = 0

        @functools.wraps(self._model_forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._forward(args, kwargs)

        model.forward = forward
        model.get_compiled_call = lambda compile_config=None: model.__call__

    def _forward(self, args: tuple, kwargs: dict) -> Any:
        cache = kwargs.get(_CACHE_KWARG)
        tensors = None
        if not args and kwargs.get("return_dict") is not False and _one_token_a_row(kwargs):
            tensors = _graphable_cache_tensors(cache, self._static_layer)
        if tensors is None:
            self.eager_forwards += 1
            return self._model_forward(*args, **kwargs)
        step_kwargs = {key: value for key, value in kwargs.items() if key != _CACHE_KWARG}
        in_flight = self._step._in_flight
        in_flight.cache = cache
        try:
            output = self.graphed(
                variant=tuple(tensor.data_ptr() for tensor in tensors),
                keep_alive=tensors,
                **step_kwargs,
            )
        finally:
            in_flight.cache = None
        output[_CACHE_KWARG] = cache
        return output

    def stats(self) -> dict[str, Any]:
        """The decode runner's stats() (graphs, captures, replays, ...) and `eager_forwards`: the
        model's forwards that ran eagerly without reaching it (prefills, other caches)."""
        return {**self.graphed.stats(), "eager_forwards": self.eager_forwards}

    def remove(self) -> None:
        """Puts the model's forward and get_compiled_call back and drops the graphs."""
        vars(self.model).pop("forward", None)
        vars(self.model).pop("get_compiled_call", None)
        self.graphed.reset()


def graph_generation(
    model: torch.nn.Module,
    *,
    device: torch.device | str | int,
    max_entries: int = 4,
    **options: Any,
) -> GraphedGeneration:
    """Makes `model.generate(...)` replay a graph at every decode step on a static cache
    (`cache_implementation="static"`, or a `StaticCache` passed as `past_key_values`); the
    prefill runs eagerly. Changes `model` in place (see GraphedGeneration.remove) and returns the
    handle. `device` and the other options are GraphedForward's; each graph holds its cache's
    tensors, so `max_entries` also bounds how many caches stay allocated: pass one StaticCache,
    `reset()` between requests, and every request replays the same graph."""
    return GraphedGeneration(model, device=device, max_entries=max_entries, **options)
