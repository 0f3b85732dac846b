"""What a decode graph holds of each kind of transformers cache layer, and what it keeps outside.

graph_generation (graphed._generation) replays one graph per shape for generate()'s decode steps.
The graph reads and writes the cache's tensors where they are; this file says, per layer kind of
transformers' cache_utils, which tensors those are (in one fixed order: the "held" tensors a
request's cache is copied into and re-bound to) and which Python state of a layer a replay
cannot advance, so that graph_generation advances it as eager would:

- a StaticLayer: its keys, values and `cumulative_length` (a device tensor it advances in place);
- a StaticSlidingWindowLayer: the same, and its length as a Python int (`cumulative_length_int`),
  on which its update branches (the window not yet full: write at the length; full: roll by one)
  and which generate() reads between steps for the mask. A decode step's graph is keyed by how
  many sliding layers are full (every layer's length is the same: all advance together), and
  after each step the Python length is set to what eager's update leaves (one more);
- a linear-attention layer (Qwen3-Next, LFM2; LinearAttentionLayer and the hybrids with a static
  attention part): its convolution and recurrent states (dicts of tensors, by state index, each
  written in place once the prefill has run) and `cumulative_length_linear` (transformers 5.24
  on). Its Python flags
  (`has_previous_state`) do not change over decode steps; one that records its past states for
  crop() re-binds them every step and is declined;
- a DummyLayer (a layer that shares another's cache, or has none): nothing.

Any other kind (an indexed layer's indexer keys, a dynamic layer) is declined with the reason
named (`why_declined`). Each kind's plan is found once (by class) and kept.
"""

from __future__ import annotations

from typing import Any

import torch

# What a layer kind contributes, as bits of its plan.
_ATTENTION = 1  # keys, values, cumulative_length
_SLIDING = 2  # and its Python length, cumulative_length_int
_LINEAR = 4  # conv_states, recurrent_states (dicts by state index), cumulative_length_linear

# The attributes of a layer that hold a single tensor graph_generation may re-bind, and those
# that hold dicts of them, by state index.
_TENSOR_ATTRIBUTES = ("keys", "values", "cumulative_length", "cumulative_length_linear")
_DICT_ATTRIBUTES = ("conv_states", "recurrent_states")

# The reason a layer's tensors are not there yet (the prefill allocates them): said for no cache,
# as a later decode step may find them.
NOT_ALLOCATED = "has layers the prefill did not allocate"

# Why a cache layer of another kind is not graphed, by a part of the name of a class it derives
# from (transformers' cache_utils), first match wins.
_LAYER_REASONS = (
    (
        "Indexed",
        "keeps indexer keys with a length of their own, which graph_generation does not hold",
    ),
    (
        "Dynamic",
        "grows its keys and values by concatenation, so they move every step",
    ),
)


def why_declined(kind: type) -> str:
    """Why a cache layer of `kind`, which has no plan, is not graphed."""
    names = [cls.__name__ for cls in kind.__mro__]
    for marker, why in _LAYER_REASONS:
        if any(marker in name for name in names):
            return why
    return (
        "is none of the layer kinds graph_generation holds (StaticLayer, StaticSlidingWindowLayer, "
        "a linear-attention layer, DummyLayer)"
    )


class CacheLayers:
    """The plans of transformers' cache layer kinds, found once per class."""

    def __init__(self, cache_utils: Any) -> None:
        self._static = cache_utils.StaticLayer
        self._sliding = getattr(cache_utils, "StaticSlidingWindowLayer", None)
        self._linear = getattr(cache_utils, "LinearAttentionLayer", None)
        self._dummy = getattr(cache_utils, "DummyLayer", None)
        self._indexed = getattr(cache_utils, "StaticIndexedLayer", None)
        self._plans: dict[type, int | str] = {}
        # The kinds that are attention layers alone (no linear-attention part): whether each is
        # a sliding window. read()'s fast loop.
        self._attention_only: dict[type, bool] = {}

    def plan(self, kind: type) -> int | str:
        """The bits of what a layer of `kind` holds, or (a str) why it is not graphed."""
        plan = self._plans.get(kind)
        if plan is None:
            plan = self._plans[kind] = self._plan_of(kind)
            if type(plan) is int and plan & (_ATTENTION | _LINEAR) == _ATTENTION:
                self._attention_only[kind] = bool(plan & _SLIDING)
        return plan

    def _plan_of(self, kind: type) -> int | str:
        if self._dummy is not None and issubclass(kind, self._dummy):
            return 0
        if self._indexed is not None and issubclass(kind, self._indexed):
            return why_declined(kind)
        plan = 0
        if issubclass(kind, self._static):
            plan |= _ATTENTION
            if self._sliding is not None and issubclass(kind, self._sliding):
                plan |= _SLIDING
        if self._linear is not None and issubclass(kind, self._linear):
            plan |= _LINEAR
        # A kind derived from a dynamic layer as well as from these (a hybrid with a dynamic
        # attention part) grows: not graphed.
        if plan == 0 or any("Dynamic" in cls.__name__ for cls in kind.__mro__):
            return why_declined(kind)
        return plan

    def is_graphed(self, kind: type) -> bool:
        return not isinstance(self.plan(kind), str)

    def read(self, layers: list) -> tuple[list[torch.Tensor], list] | str:
        """For a decode step: the layers' tensors a graph holds, in one fixed order, and the
        sliding-window layers (whose Python length a replay does not advance); or why not (a
        reason from a layer's plan, NOT_ALLOCATED, or why a linear-attention layer is not).

        Called at every decode step. A cache of attention layers only takes the loop
        graph_generation had before other kinds were held, with one dict lookup a layer (a
        lookup of each kind's plan and a test of its bits cost 1.9 us a step more on a 32-layer
        cache, a 2-core x86 host); any other cache takes the general loop."""
        tensors: list[torch.Tensor] = []
        sliding = []
        attention_only = self._attention_only
        for layer in layers:
            is_sliding = attention_only.get(type(layer))
            if is_sliding is None:
                return self._read_any(layers)
            if layer.is_initialized is not True:
                return NOT_ALLOCATED
            tensors += (layer.keys, layer.values, layer.cumulative_length)
            if is_sliding:
                sliding.append(layer)
        return tensors, sliding

    def _read_any(self, layers: list) -> tuple[list[torch.Tensor], list] | str:
        """read() for a cache with layers of any kind."""
        tensors: list[torch.Tensor] = []
        sliding = []
        for layer in layers:
            plan = self.plan(type(layer))
            if type(plan) is str:
                return plan
            if plan & _ATTENTION:
                if layer.is_initialized is not True:
                    return NOT_ALLOCATED
                tensors += (layer.keys, layer.values, layer.cumulative_length)
                if plan & _SLIDING:
                    sliding.append(layer)
            if plan & _LINEAR:
                why = _linear_tensors(layer, tensors)
                if why is not None:
                    return why
        if not tensors:
            return NOT_ALLOCATED
        return tensors, sliding

    @staticmethod
    def rebind(layers: list, to: dict[int, torch.Tensor]) -> bool:
        """Binds each layer's tensor that is a key of `to` (by id) to its value, wherever the
        layer holds it (an attribute, or a state dict's entry); whether any was."""
        changed = False
        for layer in layers:
            for name in _TENSOR_ATTRIBUTES:
                tensor = getattr(layer, name, None)
                if tensor is not None and id(tensor) in to:
                    setattr(layer, name, to[id(tensor)])
                    changed = True
            for name in _DICT_ATTRIBUTES:
                states = getattr(layer, name, None)
                if type(states) is not dict:
                    continue
                for index, tensor in list(states.items()):
                    if tensor is not None and id(tensor) in to:
                        states[index] = to[id(tensor)]
                        changed = True
        return changed


def _linear_tensors(layer: Any, tensors: list[torch.Tensor]) -> str | None:
    """Appends a linear-attention layer's state tensors and length to `tensors`; or why not. A
    layer with no state at a decode step holds nothing (transformers 5.17 gives a model's MoE and
    MLP layers this kind, and they never allocate one): a cache none of whose layers holds a
    tensor is one the prefill has not allocated (read())."""
    if layer.record_past is not False:
        return (
            "records its past convolution and recurrent states for crop() (assisted decoding), "
            "re-binding them every step, where a graph holds them in place"
        )
    conv, recurrent, previous = layer.conv_states, layer.recurrent_states, layer.has_previous_state
    found = False
    for index in range(layer.number_of_states):
        state = conv.get(index)
        if state is not None:
            if previous.get(index) is not True:
                return NOT_ALLOCATED
            tensors.append(state)
            found = True
        state = recurrent.get(index)
        if state is not None:
            tensors.append(state)
            found = True
    if not found:
        return None
    length = getattr(layer, "cumulative_length_linear", None)  # from transformers 5.24
    if length is not None:
        tensors.append(length)
    return None


def full_windows(sliding: list) -> int | None:
    """How many of the sliding-window layers are full (a decode step's update rolls them), or
    None when their Python lengths differ (they advance together in generate(); a cache whose
    layers were set apart by hand is left eager)."""
    if not sliding:
        return 0
    length = sliding[0].cumulative_length_int
    full = 0
    for layer in sliding:
        if layer.cumulative_length_int != length:
            return None
        full += length >= layer.max_cache_len
    return full


def set_lengths(sliding: list, length: int) -> None:
    """Sets the sliding-window layers' Python length (what their update reads and advances)."""
    for layer in sliding:
        layer.cumulative_length_int = length
