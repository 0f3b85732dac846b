"""graph_generation: transformers' `model.generate(...)` with its decode steps replayed from graphs.

generate() calls the model once per new token with kwargs a graph can hold: `input_ids` of one
token a row, a 4D attention mask as long as the cache, `use_cache`, `return_dict`. One kwarg it
cannot: the `StaticCache` object holding the keys and values (`cache` from transformers 5.24,
`past_key_values` before; graphed refuses an object holding tensors among the kwargs, naming its
path). A static cache's tensors never move (StaticLayer allocates them once and writes in place,
its length included, as a device tensor), so the decode step needs no cache among its inputs: the
graph reads and writes those tensors where they are. What this file does, and only that:

- `model.forward` (an instance attribute, as accelerate's hooks set it) routes a decode step on
  a static cache to a GraphedForward of the step, the cache taken out of the kwargs; the output
  gets the cache back. Everything else (the prefill, a dynamic cache, a sliding-window layer,
  whose host-side length a graph would bake in) runs the model's own forward, eagerly.
- One set of cache tensors per shape ("held"; the layers' keys, values and lengths of one batch
  size and cache length) is what the graph of that shape reads and writes; its entry holds them
  (keep_alive) and an integer naming the set is its variant. generate(cache_implementation=
  "static") makes a new StaticCache per request: at its first decode step the request's tensors
  are copied into the held ones and its layers re-bound to them ("adopted"), so every request of
  a shape replays one graph, and the cache generate returns or the caller holds is one
  consistent object. The cache last bound is tracked by a weak reference: if it is still alive
  when another cache adopts the held tensors, it first gets copies of its own ("copied out"), so
  it never sees another request's values. A set is taken from another thread only once its
  cache is gone: generate() reads the cache between decode steps too (its length, for the mask),
  where an adoption on another thread could change it; requests of one shape in flight on
  several threads at once each get a set and a graph (see GraphedGeneration._held_for).
- `model.get_compiled_call` returns the model's plain call: generate() would otherwise wrap the
  decode step in torch.compile on a GPU with a static cache, and compile would trace past the
  graph.
- graphed's probe and warm-up forwards before a capture are runs eager would not make, and each
  advances the cache's length and writes keys and values: graphed puts back every keep_alive
  tensor a warm-up wrote (graphed._phases), and the step's keep_alive are the layers' keys,
  values and lengths, so the capturing step leaves the cache as eager leaves it.
- What it needs of transformers (the cache kwarg of the forward, StaticLayer and its tensors, the
  model's get_compiled_call) is checked where it is used: a missing import or cache parameter
  raises at graph_generation, and a decode step that runs eagerly because something could not be
  found warns once, naming the transformers version and what is missing; none runs eager
  silently.

`GraphedGeneration.remove()` puts both attributes back.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import sys
import threading
import warnings
import weakref
from collections import OrderedDict
from typing import Any

import torch

from ._cache_layers import NOT_ALLOCATED, CacheLayers, full_windows, set_lengths
from ._compiled import compile_options, compiler_refusal
from ._forward import GraphedForward
from ._inventory import user_frame
from ._observe import graphs_unavailable

__all__ = ["GraphedGeneration", "graph_generation"]

# The forward's cache parameter: transformers 5.24 names it `cache` (and deprecates the older
# name), 5.17 `past_key_values`. The first one the model's forward takes is the one passed.
_CACHE_KWARGS = ("cache", "past_key_values")
# Names for the held sets, the variant of their graphs' keys; never reused.
_serials = itertools.count(1)


def _user_stacklevel() -> int:
    """The stacklevel, for a warnings.warn in the function that calls this, of the innermost frame
    outside graphed, torch and transformers: the user's generate() or model call, wherever the
    decode step that warns was reached from."""
    transformers = sys.modules.get("transformers")
    also = (os.path.dirname(transformers.__file__),) if transformers is not None else ()
    return user_frame(also)[1] - 1  # the frame of this function does not count


class _Transformers:
    """What graph_generation uses of transformers, found once; ImportError naming the version
    and the name when it is not there."""

    def __init__(self) -> None:
        try:
            import transformers
            from transformers import cache_utils
        except ImportError as missing:
            raise ImportError(
                "graphed: graph_generation needs transformers (pip install transformers)"
            ) from missing
        self.version = getattr(transformers, "__version__", "of unknown version")
        found = {}
        for name in ("Cache", "StaticCache", "StaticLayer"):
            found[name] = getattr(cache_utils, name, None)
            if not isinstance(found[name], type):
                raise ImportError(
                    f"graphed: transformers {self.version} has no transformers.cache_utils.{name}, "
                    "which graph_generation needs to recognize a static cache"
                )
        self.cache, self.static_cache, self.static_layer = (
            found["Cache"],
            found["StaticCache"],
            found["StaticLayer"],
        )
        self.layers = CacheLayers(cache_utils)


def _one_token_a_row(kwargs: dict) -> bool:
    """A decode step: the forward extends each sequence by one position."""
    tokens = kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
        return isinstance(tokens, torch.Tensor) and tokens.dim() == 3 and tokens.shape[1] == 1
    return isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[1] == 1


def _shape_of(tensors: list[torch.Tensor]) -> tuple:
    return tuple((tuple(tensor.shape), tensor.dtype, tensor.device) for tensor in tensors)


class _Held:
    """One shape's cache tensors, those its decode graph reads and writes: the layers' tensors in
    graphed._cache_layers' order, their shape, the cache bound to them now (a weak reference)
    and the thread that last stepped it, the stream that last used them (CUDA) and the variant
    naming them."""

    __slots__ = ("owner", "serial", "shape", "stream", "thread", "tensors")

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.shape = _shape_of(tensors)
        self.owner: weakref.ref | None = None
        self.thread = threading.get_ident()
        self.stream: Any = None
        self.serial = next(_serials)

    def owner_alive(self) -> bool:
        return self.owner is not None and self.owner() is not None

    def bound(self, tensors: list[torch.Tensor]) -> bool:
        """Whether these are the held tensors themselves (a cache bound to them)."""
        return len(tensors) == len(self.tensors) and all(
            mine is theirs for mine, theirs in zip(self.tensors, tensors, strict=True)
        )


class _DecodeStep(torch.nn.Module):
    """What the decode graph captures: the model's own forward on the cache of the call in flight
    (set per call, per thread), its output without the cache (generate gets it back outside)."""

    # The model's forward is called as bound before graph_generation replaced it, so a region
    # installed as the model's `forward` would never be reached: when a decode step cannot be
    # captured whole, the regions are the model's own submodules (graphed._regions).
    REGIONS_LOOK_THROUGH = ("model",)

    def __init__(self, model: torch.nn.Module, forward: Any, compiled: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self._model_forward = forward
        # graph_generation(compile=True): the forward compiled (graphed._compiled), until the
        # compiler refuses it (then the plain forward, said once with the compiler's reason).
        self._compiled_forward = torch.compile(forward, **compiled) if compiled else None
        self.compile_refused: str | None = None
        # The sliding windows' Python length each compiled regime (how many windows are full)
        # was compiled with: see forward.
        self._compiled_lengths: dict[tuple, int] = {}
        self._in_flight = threading.local()
        # Output type -> the fields that held the cache (put back after a replay, which runs no
        # Python): `cache` from transformers 5.24, `past_key_values` before.
        self.cache_fields: dict[type, tuple[str, ...]] = {}

    def forward(self, **kwargs: Any) -> Any:
        in_flight = self._in_flight
        cache, name = in_flight.cache, in_flight.name
        # The sliding windows' Python length as the step began: graphed's probe and warm-ups run
        # this forward more than once, and each run's update advances it.
        length = in_flight.length
        compiled = self._compiled_forward
        if compiled is not None and in_flight.sliding:
            # The compiled step sees one length per regime, the first it met: a decode step's
            # update reads the length only for whether the window is full (the regime, part of
            # the graph's key; the write position is the layer's length tensor), and Dynamo
            # would otherwise guard on the int and compile again at every step. The graph baked
            # in the capture's length the same way; the caller sets what eager leaves after.
            regime = (in_flight.full, getattr(in_flight.sliding[0], "max_cache_len", None))
            length = self._compiled_lengths.setdefault(regime, length)
        set_lengths(in_flight.sliding, length)
        output = None
        if compiled is not None:
            try:
                output = compiled(**kwargs, **{name: cache})
            except Exception as error:  # the compiler's refusal only; anything else is raised
                reason = compiler_refusal(error)
                if reason is None:
                    raise
                self._compiled_forward = None
                self.compile_refused = reason
                set_lengths(in_flight.sliding, in_flight.length)
        if output is None:
            output = self._model_forward(**kwargs, **{name: cache})
        fields = tuple(key for key, value in output.items() if value is cache)
        self.cache_fields[type(output)] = fields
        return type(output)(**{key: value for key, value in output.items() if key not in fields})


class GraphedGeneration:
    """The handle graph_generation returns: the decode steps' GraphedForward (`graphed`), their
    counters, and `remove()`."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_entries: int,
        compile: bool | dict = False,
        **options: Any,
    ) -> None:
        compiled = compile_options(compile)  # before the model is changed: a ValueError first
        if "forward" in vars(model) or "get_compiled_call" in vars(model):
            raise ValueError(
                "graphed: this model's forward (or get_compiled_call) is already replaced on the "
                "instance (graph_generation applied twice, or another library's hook); remove that "
                "first (the GraphedGeneration graph_generation returned: its .remove())"
            )
        self._api = _Transformers()
        parameters = inspect.signature(model.forward).parameters
        taken = [name for name in _CACHE_KWARGS if name in parameters]
        if not taken:
            raise ValueError(
                f"graphed: {type(model).__name__}.forward (transformers {self._api.version}) "
                f"takes none of {', '.join(map(repr, _CACHE_KWARGS))}, the cache parameters "
                f"graph_generation knows; its parameters: {', '.join(parameters)}"
            )
        self._cache_kwarg = taken[0]
        # The others, in the order looked at: a caller may still pass the deprecated name.
        self._cache_aliases = tuple(name for name in _CACHE_KWARGS if name != taken[0])
        if not callable(getattr(type(model), "get_compiled_call", None)):
            warnings.warn(
                f"graphed: {type(model).__name__} (transformers {self._api.version}) has no "
                "get_compiled_call, through which generate() compiles the decode step on a GPU "
                "and graph_generation turns that off: if this generate() compiles the step "
                "another way, the compiled step runs instead of the graph; pass "
                "disable_compile=True to generate()",
                RuntimeWarning,
                stacklevel=3,
            )
        self.model = model
        self._model_forward = model.forward
        self._step = _DecodeStep(model, self._model_forward, compiled=compiled)
        options.setdefault("name", type(model).__name__)  # the model's, not the decode step's
        self.graphed = GraphedForward(self._step, max_entries=max_entries, **options)
        self._max_held = max_entries
        self._held: OrderedDict[int, _Held] = OrderedDict()  # by serial, least recent first
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        # The last cache whose decode steps were found ungraphable (its layers' kinds, an
        # offloading or dynamic cache): its next steps run eagerly without another look.
        self._declined: weakref.ref | None = None
        # Streams to order the held tensors' work by: only where a CUDA device answers (on a machine
        # without one, asking for a stream would hide graphed's own error behind torch's).
        self._on_cuda = self.graphed.device.type == "cuda" and torch.cuda.is_available()
        self.eager_forwards = 0
        self.api_mismatches = 0
        self.cache_adoptions = 0
        self.cache_copies_out = 0
        # A CPU runner where no graph can replay (a laptop): a decode step is the model's own
        # forward, and no cache is adopted into held tensors for a graph. (A device runner
        # without its device still goes through the GraphedForward, which refuses an input off
        # the device as the device would.)
        self._graphless = self.graphed.device.type == "cpu" and graphs_unavailable(
            self.graphed.stats()
        )

        @functools.wraps(self._model_forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._forward(args, kwargs)

        model.forward = forward
        model.get_compiled_call = lambda compile_config=None: model.__call__

    # -- routing ---------------------------------------------------------------------------

    def _forward(self, args: tuple, kwargs: dict) -> Any:
        name, cache = self._cache_kwarg, kwargs.get(self._cache_kwarg)
        if cache is None:
            name, cache = next(
                ((alias, kwargs[alias]) for alias in self._cache_aliases if alias in kwargs),
                (name, None),
            )
        if args or kwargs.get("return_dict") is False or not _one_token_a_row(kwargs):
            if "decoder_input_ids" in kwargs:
                self._say_once(
                    "decode steps of an encoder-decoder model (decoder_input_ids) run eagerly: "
                    "graph_generation graphs decoder-only models' steps",
                    UserWarning,
                )
            return self._eager(args, kwargs, cache)
        if self._graphless:
            return self._eager(args, kwargs, cache)
        if cache is None:
            if kwargs.get("use_cache"):
                self._mismatch(
                    f"a forward of one token a row with use_cache=True (generate()'s decode step) "
                    f"came with no cache as {' or '.join(map(repr, _CACHE_KWARGS))} (its kwargs: "
                    f"{', '.join(kwargs)}): graph_generation finds no cache to graph"
                )
            return self._eager(args, kwargs, None)
        declined = self._declined
        if declined is not None and declined() is cache:
            # A cache left eager by design (said once): no look at its layers again, so that a
            # declined decode step costs what generate() costs without graphed.
            return self._eager(args, kwargs, cache)
        # Under the lock: which set a cache is bound to, and which a new cache takes (_held_for).
        with self._lock:
            read = self._layer_tensors(cache)
            sliding = () if read is None else read[1]
            full = self._windows(sliding, kwargs) if sliding else 0
            held = None if read is None or full is None else self._held_for(cache, read[0])
        if held is None:
            return self._eager(args, kwargs, cache)
        # One graph per regime of the windows: a step's update writes at the length until a
        # window is full, and rolls it after.
        variant = held.serial | (full << 40)
        length = sliding[0].cumulative_length_int if sliding else 0
        step_kwargs = {key: value for key, value in kwargs.items() if key != name}
        in_flight = self._step._in_flight
        in_flight.cache, in_flight.name = cache, name
        in_flight.sliding, in_flight.length, in_flight.full = sliding, length, full
        try:
            output = self.graphed(variant=variant, keep_alive=held.tensors, **step_kwargs)
            self._say_refusal()
        finally:
            in_flight.cache = in_flight.name = None
            in_flight.sliding = ()
            if self._on_cuda:
                held.stream = torch.cuda.current_stream(self.graphed.device)
        if sliding:
            # What eager's update leaves: one more (a replay runs no Python). A step that raised
            # keeps what its last run left, as eager's would.
            set_lengths(sliding, length + 1)
        for field in self._step.cache_fields.get(type(output), (name,)):
            output[field] = cache
        return output

    def _windows(self, sliding: list, kwargs: dict) -> int | None:
        """How many of a decode step's sliding windows are full (its graph's regime), or None
        (said once) where the step would read their Python length inside the forward: without
        generate()'s position_ids and prepared mask (a dict of masks or a 4D one) the model
        computes both from it, and a graph would bake them in."""
        mask = kwargs.get("attention_mask")
        if not isinstance(kwargs.get("position_ids"), torch.Tensor) or not (
            isinstance(mask, dict) or (isinstance(mask, torch.Tensor) and mask.dim() == 4)
        ):
            self._say_once(
                "decode steps on a cache with sliding-window layers run eagerly when called "
                "without position_ids and a prepared (4D, or per layer kind) attention mask, "
                "as generate() passes them: the model would compute both from the window's "
                "Python length, which a graph would bake in",
                UserWarning,
            )
            return None
        full = full_windows(sliding)
        if full is None:
            self._say_once(
                "decode steps on a cache whose sliding-window layers have different lengths "
                "(set apart by hand) run eagerly",
                UserWarning,
            )
        return full

    def _eager(self, args: tuple, kwargs: dict, cache: Any) -> Any:
        """The model's own forward; after the work of another stream on the held tensors when
        `cache` is bound to them (a prefill on it writes them)."""
        self.eager_forwards += 1
        bound = None
        if cache is not None and self._held:
            with self._lock:
                bound = next(
                    (h for h in self._held.values() if h.owner and h.owner() is cache), None
                )
        if bound is None or not self._on_cuda:
            return self._model_forward(*args, **kwargs)
        self._wait_for(bound)
        try:
            return self._model_forward(*args, **kwargs)
        finally:
            bound.stream = torch.cuda.current_stream(self.graphed.device)

    def _say_refusal(self) -> None:
        """Says once that the compiler refused the decode step, which runs graphed without
        compile from then on, with the compiler's reason."""
        refused = self._step.compile_refused
        if refused is not None:
            self._say_once(
                f"torch.compile refused the decode step ({refused}); it runs graphed without "
                "compile",
                UserWarning,
            )

    def _mismatch(self, what: str) -> None:
        """A decode step runs eagerly because something of transformers' was not found: counted,
        and said once per kind."""
        self.api_mismatches += 1
        self._say_once(
            f"{what}; every such decode step runs eagerly (stats()['api_mismatches'] counts them)",
            RuntimeWarning,
        )

    def _say_once(self, what: str, category: type[Warning]) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(
                f"graphed: graph_generation with transformers {self._api.version}: {what}",
                category,
                stacklevel=_user_stacklevel(),
            )

    # -- the cache -------------------------------------------------------------------------

    def _layer_tensors(self, cache: Any) -> tuple[list[torch.Tensor], list] | None:
        """The tensors of a decode step's cache a graph can hold, in graphed._cache_layers'
        order, and its sliding-window layers; or None, said once per reason (see
        _why_not_graphable)."""
        layer_why = None
        try:
            layers = cache.layers
            if cache.offloading is False and type(layers) is list and layers:
                read = self._api.layers.read(layers)
                if type(read) is not str:
                    return read
                layer_why = read
            missing = None
        except AttributeError as error:
            missing = error.name or str(error)
        why, mismatch = self._why_not_graphable(cache, missing, layer_why)
        if why is not None and not mismatch and why != NOT_ALLOCATED:
            try:  # left eager by design, for good: the next steps skip this look
                self._declined = weakref.ref(cache)
            except TypeError:  # a cache that takes no weak reference is looked at each step
                pass
        if mismatch:
            self._mismatch(f"a decode step on a {type(cache).__name__} {why}")
        elif why is not None:
            self._say_once(
                f"decode steps on a {type(cache).__name__} run eagerly: it {why}", UserWarning
            )
        return None

    def _why_not_graphable(
        self, cache: Any, missing: str | None, layer_why: str | None = None
    ) -> tuple[str | None, bool]:
        """Why a decode step's cache is not graphed, and whether that is an API mismatch (what
        graph_generation looks for is not there) rather than a cache it leaves eager by design:
        a dynamic one (it grows), an offloading one (it moves its tensors), one with layers of a
        kind graphed._cache_layers does not hold (each named with why), one whose layers say why
        not (`layer_why`: a linear-attention layer recording its past), one the prefill has not
        allocated."""
        static_layer = self._api.static_layer
        layers = getattr(cache, "layers", None)
        if not isinstance(cache, self._api.static_cache) and not (
            isinstance(layers, list | tuple) and any(isinstance(x, static_layer) for x in layers)
        ):
            # Any other Cache (a DynamicCache, an encoder-decoder model's EncoderDecoderCache,
            # which has no `layers` of its own) is said once too.
            if isinstance(cache, self._api.cache):
                return (
                    "is not a static cache: only decode steps on a StaticCache are graphed "
                    '(generate(..., cache_implementation="static"), or a StaticCache passed)',
                    False,
                )
            return None, False
        if missing is not None:
            return f"has no `{missing}` (a StaticCache's or its StaticLayer's)", True
        if type(layers) is not list or not layers:
            return f"has no list of layers as `layers` (found {type(layers).__name__})", True
        if not isinstance(cache.offloading, bool):
            return f"has an `offloading` of {type(cache.offloading).__name__}, not a bool", True
        if cache.offloading:
            return "offloads its layers, moving their tensors, which a graph holds in place", False
        plans = {type(x).__name__: self._api.layers.plan(type(x)) for x in layers}
        if not any(type(plan) is int and plan for plan in plans.values()):
            # A StaticCache with no layer graph_generation recognizes: StaticLayer has moved.
            return (
                f"has layers of kinds {', '.join(sorted(plans))}, none of them a kind "
                "graph_generation holds (a transformers.cache_utils.StaticLayer, "
                "StaticSlidingWindowLayer or LinearAttentionLayer)",
                True,
            )
        declined = sorted(name for name, plan in plans.items() if type(plan) is str)
        if declined:
            why = "; ".join(f"a {name} {plans[name]}" for name in declined)
            return (
                f"has layers of kinds {', '.join(declined)}, which are not graphed ({why})",
                False,
            )
        if layer_why is not None and layer_why != NOT_ALLOCATED:
            return f"has a linear-attention layer that {layer_why}", False
        return NOT_ALLOCATED, False

    def _checked(self, cache: Any, tensors: list[Any]) -> bool:
        """A new cache's layer tensors are tensors (warned otherwise)."""
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                self._mismatch(
                    f"a decode step on a {type(cache).__name__} whose layers hold a "
                    f"{type(tensor).__name__} where a tensor (keys, values, a length or a state) "
                    "was looked for"
                )
                return False
        return True

    def _held_for(self, cache: Any, tensors: list[torch.Tensor]) -> _Held | None:
        """The held set this cache's decode step replays on, with the cache bound to it: found
        (the cache is bound already), adopted (its values copied in, its layers re-bound), or
        made of the cache's own tensors (no set of its shape can be taken). None for tensors the
        graph cannot hold. Called under the lock.

        Which set a new cache takes, so that one graph serves a shape across requests, on any
        thread, and no request sees another's values: the least recently used set of its shape
        whose cache is gone (generate() drops the one it made when it returns); else one whose
        cache is still alive but was last stepped on this thread (that cache is given copies of
        its own first; it is not in a step now, and generate() reads a cache between its steps
        only on the thread that steps it); else a new set, a graph of its own (requests of one
        shape in flight on several threads at once each need one)."""
        me = threading.get_ident()
        for held in self._held.values():
            if held.tensors[0] is tensors[0] and held.bound(tensors):
                if held.owner is None or held.owner() is not cache:
                    held.owner = weakref.ref(cache)
                held.thread = me
                self._held.move_to_end(held.serial)
                return held
        if not self._checked(cache, tensors):
            return None
        shape = _shape_of(tensors)
        free = same_thread = None
        for held in self._held.values():  # least recently used first
            if held.shape != shape:
                continue
            if not held.owner_alive():
                free = held
                break
            if same_thread is None and held.thread == me:
                same_thread = held
        held = free or same_thread
        if held is None:
            held = _Held(tensors)
            self._held[held.serial] = held
            while len(self._held) > self._max_held:
                self._held.popitem(last=False)  # the cache bound to it keeps its tensors
        else:
            self._held.move_to_end(held.serial)
            self._adopt(held, cache, tensors)
        held.owner = weakref.ref(cache)
        held.thread = me
        return held

    def _adopt(self, held: _Held, cache: Any, tensors: list[torch.Tensor]) -> None:
        """Copies `cache`'s values into the held tensors and re-binds its layers to them, after
        giving the cache bound to them before, if alive, copies of its own."""
        self._wait_for(held)
        previous = held.owner() if held.owner is not None else None
        with torch.no_grad():
            if previous is not None and previous is not cache:
                copies = {id(tensor): tensor.clone() for tensor in held.tensors}
                if self._api.layers.rebind(previous.layers, copies):
                    self.cache_copies_out += 1
                    if held.stream is not None:
                        # The previous owner's own work, if it runs on its stream, follows the copy.
                        held.stream.wait_stream(torch.cuda.current_stream(self.graphed.device))
            for mine, theirs in zip(held.tensors, tensors, strict=True):
                mine.copy_(theirs)
            self._api.layers.rebind(
                cache.layers,
                {id(theirs): mine for mine, theirs in zip(held.tensors, tensors, strict=True)},
            )
        self.cache_adoptions += 1

    def _wait_for(self, held: _Held) -> None:
        """The current stream waits for the work of another stream that used the held tensors."""
        if held.stream is not None:
            current = torch.cuda.current_stream(self.graphed.device)
            if held.stream != current:
                current.wait_stream(held.stream)

    # -- the handle ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The decode runner's stats() (graphs, captures, replays, ...) and this handle's counts:
        `eager_forwards` (the model's forwards that ran eagerly without reaching it: prefills,
        other caches), `api_mismatches` (decode steps among those that ran eagerly because
        something graph_generation looks for in transformers was not found; warned once),
        `held_caches` (the sets of cache tensors the graphs hold: one per shape, and one more for
        each request of that shape in flight at once on another thread), `cache_adoptions`
        (caches copied into those and re-bound to them: one per request on a cache generate()
        made) and `cache_copies_out` (caches still alive given
        copies of their own when another adopted the held tensors)."""
        return {
            **self.graphed.stats(),
            "eager_forwards": self.eager_forwards,
            "api_mismatches": self.api_mismatches,
            "held_caches": len(self._held),
            "cache_adoptions": self.cache_adoptions,
            "cache_copies_out": self.cache_copies_out,
        }

    def remove(self) -> None:
        """Puts the model's forward and get_compiled_call back and drops the graphs (the caches
        bound to the held tensors keep them)."""
        vars(self.model).pop("forward", None)
        vars(self.model).pop("get_compiled_call", None)
        self.graphed.reset()
        with self._lock:
            self._held.clear()


def graph_generation(
    model: torch.nn.Module,
    *,
    device: torch.device | str | int,
    max_entries: int = 4,
    regions: bool = False,
    compile: bool | dict = False,
    **options: Any,
) -> GraphedGeneration:
    """Makes `model.generate(...)` replay a graph at every decode step on a static cache
    (`cache_implementation="static"`, or a `StaticCache` passed as the cache); the prefill runs
    eagerly. Changes `model` in place (see GraphedGeneration.remove) and returns the handle.
    `device` and the other options are GraphedForward's, but `regions` is off by default here: a
    decode step that cannot be captured whole runs eagerly, since graphing the model's parts
    around it measured slower than eager (0.54x eager's decode tokens/s on a tiny Llama, H200).

    One graph serves every request of a shape (batch size, cache length, dtype), from any
    thread: the graph holds one set of cache tensors per shape (one more for each request of it
    in flight at once on another thread), and a request on
    another cache of that shape (a new one generate() makes for
    `cache_implementation="static"`, or one passed) has its values copied into them at its first
    decode step and its layers re-bound to them. A cache still alive when another takes the
    tensors over first gets copies of its own, so passing one StaticCache and `reset()`ting it
    between requests is the cheapest (no copy), and `cache_implementation="static"` costs one
    copy of the cache per request. `max_entries` bounds the graphs and the sets of tensors
    held. Raises ImportError without
    transformers' StaticLayer and ValueError for a forward with no cache parameter it knows; a
    decode step that runs eagerly because something else was not found warns once.

    compile=True replays compiled code: the decode step's forward is compiled by torch.compile
    (inductor's kernels, one whole graph, static shapes, no CUDA graphs of its own) once per
    shape, on its first decode step, before graphed probes it, and graphed captures the compiled
    kernels; the sliding windows' Python lengths stay outside what is compiled, as they stay
    outside the graphs. A step the compiler refuses runs graphed without compile, said once with
    the compiler's reason. A dict of torch.compile options is laid over those defaults (another
    inductor mode without CUDA graphs, a backend); a mode that records CUDA graphs of its own is
    a ValueError."""
    return GraphedGeneration(
        model, device=device, max_entries=max_entries, regions=regions, compile=compile, **options
    )
