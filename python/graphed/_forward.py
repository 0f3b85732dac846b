"""GraphedForward: the model-code face of graphed. It registers the module's forward as an
operator the native core calls back for capture and hands each call to the C entry points
(`graphed._native._graphed_fastcall`), which key, capture, replay or run eager: plain kwargs are
walked in C; the others are flattened here (graphed._tree) and go through the dispatcher."""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import logging
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

from . import _groups, _library, _observe, _phases, _verify
from ._baked import BakedState, weight_moving_hook
from ._device_hooks import hooks_for, resolve_device
from ._memory import MemoryPool, pool_id_of
from ._native import _graphed_fastcall as _fastcall
from ._tree import flatten_kwargs, flatten_output, rebuild_output, refuse_tensors, unflatten

__all__ = ["GraphedForward"]

_log = logging.getLogger("graphed")
_FALLBACK = _fastcall.FALLBACK
_REENTERED = _fastcall.REENTERED
_CHANGED = _fastcall.CHANGED
_models_library = torch.library.Library("graphed_models", "FRAGMENT")
_op_numbers = itertools.count()
_op_lock = threading.Lock()
_runners: weakref.WeakValueDictionary[int, GraphedForward] = weakref.WeakValueDictionary()
_warned_unavailable = False
# GraphedForward's own call options; a module whose forward takes a keyword of one of these names
# is refused at construction (see _check_reserved), never silently swallowed.
RESERVED_KWARGS = ("variant", "keep_alive", "pin", "static_outputs")
_NO_HELD: tuple = ()
# The keep_alive of a call that passes none; the native entry only reads it.
_NO_KEEP_ALIVE: list = []
# Bound once: the call path reads it on every call (torch.compile recognises the function).
_is_compiling = torch.compiler.is_compiling
_PHASE_CAPTURE = _phases.PHASE_CAPTURE
_PHASE_EAGER = _phases.PHASE_EAGER


def _is_callers_error(raised: BaseException) -> bool:
    """An exception of the forward's own (a ValueError, a KeyboardInterrupt) or an out-of-memory,
    as opposed to a RuntimeError a capture raises for what it forbids: the caller gets it as
    eager would raise it, once, and the runner stays enabled (a smaller key may still capture)."""
    return not isinstance(raised, RuntimeError) or isinstance(raised, torch.OutOfMemoryError)


@functools.cache
def _names_from(op_name: str) -> tuple[str, ...]:
    """The names an operator gives its results' positions (stat_names: stats' counters;
    entry_fields: entries' columns), in their order: named once, in the shim."""
    return tuple(getattr(torch.ops.graphed, op_name)())


def runner_stats(runner_id: int) -> dict[str, Any]:
    """stats() of any runner id (GraphedForward and graphed.Runner share it)."""
    counters, backend, reason = torch.ops.graphed.stats(runner_id)
    stats: dict[str, Any] = dict(zip(_names_from("stat_names"), counters, strict=True))
    stats["enabled"] = bool(stats["enabled"])
    stats["backend"] = backend
    stats["disabled_reason"] = reason or None
    return stats


def runner_entries(runner_id: int) -> list[dict[str, Any]]:
    """entries() of any runner id."""
    columns = torch.ops.graphed.entries(runner_id)
    fields = _names_from("entry_fields")
    rows = [dict(zip(fields, row, strict=True)) for row in zip(*columns, strict=True)]
    for row in rows:
        row["pinned"] = bool(row["pinned"])
        row["folded"] = bool(row["folded"])
    return rows


def _check_callable(module: Any) -> None:
    """A GraphedForward calls `module(**kwargs)`: anything else is refused at construction, with
    what was passed, rather than at the first call."""
    if callable(module):
        return
    text = repr(module)
    shown = text if len(text) <= 60 else text[:57] + "..."
    forward = getattr(module, "forward", None)
    hint = (
        "; it has a `forward` method but no __call__: pass that (GraphedForward(obj.forward, "
        "...)) or make the object an nn.Module"
        if callable(forward)
        else ""
    )
    raise TypeError(
        f"graphed: GraphedForward wraps a callable run as module(**kwargs) (an nn.Module, or a "
        f"function taking keyword arguments); got {type(module).__name__} {shown}, which is not "
        f"callable{hint}"
    )


def _check_reserved(module: Any) -> None:
    """A module whose forward takes a keyword GraphedForward reserves for its options would never
    receive it: refused here, with what to do."""
    forward = getattr(module, "forward", module)
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return
    clash = [name for name in RESERVED_KWARGS if name in parameters]
    if clash:
        raise TypeError(
            f"graphed: the module's forward takes the keyword(s) {', '.join(clash)}, which "
            f"GraphedForward reserves for its own options ({', '.join(RESERVED_KWARGS)}); rename "
            "them in the forward, or wrap the module in one whose forward takes other names"
        )


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
CPU_INPUT_CHOICES = ("refuse", "to_device")


def _signature_of_forward(module: Any) -> inspect.Signature | None:
    """The signature calls are bound to: the forward of an nn.Module (of the module torch.compile
    wrapped, whose own forward takes *args), else the callable's own; None where Python cannot
    say (a builtin)."""
    target = getattr(module, "_orig_mod", module)
    forward = getattr(target, "forward", target)
    try:
        return inspect.signature(forward)
    except (TypeError, ValueError):
        return None


def _positional_names(module: Any) -> tuple[tuple[str, ...], str | None]:
    """The names positional arguments bind to, in order, and why a positional argument past them
    cannot be keyed (None when nothing stops it: there are simply too many)."""
    signature = _signature_of_forward(module)
    if signature is None:
        return (), "its forward's signature cannot be read"
    names: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind == inspect.Parameter.POSITIONAL_ONLY:
            return tuple(names), (
                f"its forward's parameter {parameter.name!r} is positional-only, and graphed calls "
                "the forward with keywords"
            )
        if parameter.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
            names.append(parameter.name)
        elif parameter.kind == inspect.Parameter.VAR_POSITIONAL:
            return tuple(names), (
                f"its forward takes *{parameter.name}, which has no names to key the arguments by"
            )
    return tuple(names), None


def _check_keep_alive(tensors: list[torch.Tensor]) -> None:
    """The Python path's check of keep_alive tensors: the one every path makes (the extension's
    `refusal`)."""
    for index, tensor in enumerate(tensors):
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            continue  # subclasses go through the dispatcher, where their modes see them
        refused = _fastcall.refusal(tensor)
        if refused is not None:
            error_type, why = refused
            raise error_type(f"graphed: keep_alive[{index}] {why}")


def _define_op(schema_tail: str, implementation: Callable) -> str:
    """Registers graphed_models::<name>(...) for every backend (and its fake) and returns its
    qualified name."""
    with _op_lock:
        name = f"op{next(_op_numbers)}"
        _models_library.define(name + schema_tail)
        _models_library.impl(name, implementation, "CompositeExplicitAutograd")
        torch.library.register_fake(f"graphed_models::{name}", implementation, lib=_models_library)
    return f"graphed_models::{name}"


def _pop_options(kwargs: dict) -> tuple[Any, Any, bool, bool]:
    """Takes GraphedForward's own options (variant, keep_alive, pin, static_outputs) out of a
    call's kwargs, with their defaults where absent."""
    return (
        kwargs.pop("variant", None),
        kwargs.pop("keep_alive", ()),
        kwargs.pop("pin", False),
        kwargs.pop("static_outputs", False),
    )


_Method = TypeVar("_Method", bound=Callable[..., Any])


class _ModuleMethod:
    """A GraphedForward method that exists only while the wrapped callable is an nn.Module: for
    any other callable the attribute lookup raises AttributeError, so that __getattr__ asks the
    callable itself, as it does for every name GraphedForward lacks."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = method
        self.__name__ = method.__name__
        self.__doc__ = method.__doc__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if not isinstance(instance.__dict__.get("module"), torch.nn.Module):
            raise AttributeError(self.__name__)
        return types.MethodType(self._method, instance)


def _module_method(method: _Method) -> _Method:
    return cast(_Method, _ModuleMethod(method))


def _method_moving_to_kind(kind: str) -> Any:
    """GraphedForward.cuda and its kin (xpu, ipu, mtia): module.<kind>(device), for the runner's
    device only (see GraphedForward.to)."""

    def method(self: GraphedForward, device: Any = None) -> GraphedForward:
        return self._to_kind(kind, device)

    method.__name__ = method.__qualname__ = kind
    method.__doc__ = f"module.{kind}(device), for the runner's device only (see `to`)."
    return _module_method(method)


def _same_device(target: torch.device, runner: torch.device) -> bool:
    target, runner = resolve_device(target), resolve_device(runner)
    if target.type != runner.type:
        return False
    if target.type == "cpu" or target.index is None or runner.index is None:
        return True
    return target.index == runner.index


def _device_of_kind(kind: str, device: Any) -> torch.device:
    """The device `module.cuda(device)` (and xpu, ipu, mtia) moves to: an index, a device or
    None (the current one)."""
    if device is None:
        return torch.device(kind)
    if isinstance(device, int):
        return torch.device(kind, device)
    return torch.device(device)


def _device_of_legacy_type(dst_type: Any) -> torch.device | None:
    """The device `module.type(dst_type)` moves to: None for a dtype, else the device of the
    legacy tensor type ("torch.cuda.HalfTensor" or the class)."""
    if isinstance(dst_type, torch.dtype):
        return None
    name = dst_type if isinstance(dst_type, str) else f"{dst_type.__module__}.{dst_type.__name__}"
    return torch.device("cuda" if name.startswith("torch.cuda.") else "cpu")


class GraphedForward:
    """Replays captured device graphs of `module`'s keyword-only forward.

    Calls are keyed by the structure of their kwargs (every non-tensor value, `variant`, and each
    tensor's dtype, device and shape); the first call of a key captures, later ones copy the live
    tensors into static buffers and replay. With no graph-capable device, or after any failure,
    calls run eager.
    """

    def __init__(
        self,
        module: Callable[..., Any],
        *,
        device: torch.device | str | int,
        max_entries: int = 16,
        warmup_iters: int = 2,
        group: Any = None,
        name: str = "graphed",
        enabled: bool = True,
        capture_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        backend: str | None = None,
        cpu_inputs: str = "refuse",
        verify: int | None = None,
        verify_tolerance: tuple[float, float] | None = None,
        memory_pool: MemoryPool | None = None,
    ) -> None:
        """Wraps `module` (any callable taking keyword arguments) for `device`.

        max_entries bounds the cached graphs (least recently used evicted first, pinned never);
        warmup_iters forwards run before each first capture; `group` (a process group) makes
        capture outcomes agreed across its ranks; `name` appears in logs and stats; enabled=False
        runs every call eagerly; capture_context, if given, is entered around the forwards graphed
        runs for probe, warm-up and capture. Advanced: `backend` names a registered backend for
        this runner alone (a test plugin's "emulated"); None, the default, is the one chosen at
        load (graphed.backend()).

        Positional arguments are bound to the forward's parameters by name, read from its
        signature here, and keyed as those keywords. cpu_inputs says what a CPU tensor input of a
        runner on another device gets: "refuse" (the default: a ValueError naming it, since the
        forward would see a device tensor where eager sees a CPU one) or "to_device" (copied to
        the runner's device before the call, for forwards that move such inputs there
        themselves, as diffusers' rotary embeddings do; eager calls of a disabled runner get the
        CPU tensors, as without graphed).

        verify=N runs the module eagerly beside each of the first N calls every graph serves (its
        capturing call included) and compares the outputs, bitwise, or within verify_tolerance
        (rtol, atol) when given: a difference disables the runner, naming the output path and the
        largest difference in disabled_reason, warns, and returns eager's result. None reads
        $GRAPHED_VERIFY (0 when unset). The way to prove a new model safe to graph; each verified
        call runs the forward twice, so a forward that advances state (a cache) reports a
        difference by design (graphed._verify).

        memory_pool (a graphed.MemoryPool of this device) makes this runner's graphs, warm-ups
        and probe allocate from that pool, shared with the other runners made on it, so that
        the components of one pipeline reserve about what the largest needs (graphed._memory);
        None, the default, gives the runner a pool of its own."""
        _library.load_library()
        _check_callable(module)
        _check_reserved(module)
        if cpu_inputs not in CPU_INPUT_CHOICES:
            raise ValueError(
                f"cpu_inputs must be one of {', '.join(map(repr, CPU_INPUT_CHOICES))}, got "
                f"{cpu_inputs!r}"
            )
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int of at least 1, got {max_entries!r}")
        if isinstance(warmup_iters, bool) or not isinstance(warmup_iters, int) or warmup_iters < 0:
            raise ValueError(f"warmup_iters must be an int of 0 or more, got {warmup_iters!r}")
        if capture_context is not None and not callable(capture_context):
            raise TypeError("capture_context must be a callable returning a context manager")
        self.module = module
        self.device = resolve_device(torch.device(device))
        self._hooks = hooks_for(self.device.type)
        self.name = name
        self.group = group
        self._capture_context = capture_context
        self._known_disabled = False
        self._positional_names, self._positional_limit = _positional_names(module)
        self._verify = _verify.Verification.of(verify, verify_tolerance)
        self._side_effects_named = False
        self._inputs_to_device = cpu_inputs == "to_device" and self.device.type != "cpu"
        # The call in flight, set by both C entry points under the runner's lock (see
        # pyext/gf_fastcall.c); each cache entry holds its own output template.
        self._call_state = _fastcall.CallState(rebuild_output)
        self_ref = weakref.ref(self)

        def run_module(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            runner = self_ref()
            if runner is None:
                raise RuntimeError("graphed: the GraphedForward of this operator is gone")
            return runner._run_module(inputs)

        self._forward_op = _define_op("(Tensor[] inputs) -> Tensor[]", run_module)
        # With a group, the shim agrees over it by its registered name (see graphed._groups).
        group_name = _groups.group_name_of(group) if group is not None else None
        self._log, observer_op = _observe.observer_for(name)
        self._hooks.on_runner_created()
        self._id = torch.ops.graphed.create(
            name,
            self._forward_op,
            self.device,
            max_entries,
            warmup_iters,
            enabled,
            None,
            observer_op,
            group_name,
            backend,
            pool_id_of(memory_pool),
        )
        self.memory_pool = memory_pool
        _runners[self._id] = self
        if group is not None:
            _groups.track(self._id, self)
        self._finalizer = weakref.finalize(self, torch.ops.graphed.destroy, self._id)
        graphless = self._warn_if_unavailable()
        self._baked: BakedState | None = None
        self._watch_module()
        # No graph will run on a device the backend cannot serve, so the core's device check (made
        # on the way to a graph) never would: the eager run makes it (_run_module), so that code
        # refused on the device is refused without it too.
        self._checks_devices = graphless and self.device.type != "cpu"
        if self._verify is not None:
            # The verifying call is a subclass's __call__, so that the plain one reads no flag.
            self.__class__ = _VerifyingGraphedForward

    # -- the call path ---------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the module with `kwargs` through the graph of their key, capturing it first if
        needed. Four keyword names are graphed's own options, not the module's: `variant` (one
        more value of the key), `keep_alive` (tensors, or a module's parameters and buffers, held
        by the entry a capture creates), `pin` (True keeps that entry from eviction) and
        `static_outputs` (True returns the graph's own output buffers, which the next replay
        overwrites). Returns what the module returns, with fresh tensors."""
        # The options are read out of **kwargs rather than declared as keyword parameters:
        # CPython matches every keyword of a call against each declared name, by identity and
        # then by string comparison, which cost about 1.3 us a call at 64 kwargs (a 2-core x86
        # host, emulated backend); four lookups cost about 0.1 us.
        if (
            "variant" in kwargs
            or "keep_alive" in kwargs
            or "pin" in kwargs
            or ("static_outputs" in kwargs)
        ):
            variant, keep_alive, pin, static_outputs = _pop_options(kwargs)
            held_tensors, held_objects = self._split_keep_alive(keep_alive)
        else:
            variant, pin, static_outputs = None, False, False
            held_tensors, held_objects = _NO_KEEP_ALIVE, _NO_HELD
        if args:
            kwargs = self._bind_positional(args, kwargs)
        if _is_compiling():
            # torch.compile or torch.export is tracing the caller: it sees the module itself
            # (its weights, its operations), with no opaque call in between.
            return self.module(**kwargs)
        flat = None
        while True:
            try:
                result = _fastcall.call(
                    self._id,
                    kwargs,
                    variant,
                    pin,
                    static_outputs,
                    self._call_state,
                    held_tensors,
                    held_objects,
                )
            except ValueError:
                # A CPU input is refused before any forward runs; with cpu_inputs="to_device"
                # the call is made again below with it on the device. Any other error stands.
                if not self._inputs_to_device:
                    raise
                flat = flatten_kwargs(kwargs, variant)
                if not any(tensor.device.type == "cpu" for tensor in flat[0]):
                    raise
                result = _FALLBACK
            if result is not _CHANGED:
                break
            # What the graphs baked in may have changed (graphed._baked): look, then call again.
            self._follow_change()
        if result is _FALLBACK:
            tensors, key, spec = flat if flat is not None else flatten_kwargs(kwargs, variant)
            if not tensors:
                return self._eager(kwargs)
            if self._inputs_to_device:
                tensors = self._staged_on_device(tensors)
            _check_keep_alive(held_tensors)
            result = _fastcall.call_flat(
                self._id,
                self._call_state,
                key,
                tensors,
                spec,
                held_tensors,
                pin,
                static_outputs,
                held_objects,
            )
        if result is _REENTERED:
            # A call from inside this instance's own forward (the forward calls its GraphedForward
            # again): eager, as the forward would run without graphed (see gf_fastcall.c).
            return self._eager(kwargs)
        return result

    def _bind_positional(self, args: tuple, kwargs: dict) -> dict:
        """The kwargs a call with positional arguments makes: each bound to its parameter's name,
        before the keywords, as Python binds them (so that f(x, t=1) and f(x=x, t=1) share a
        key)."""
        names = self._positional_names
        if len(args) > len(names):
            raise TypeError(self._positional_refusal(len(args)))
        bound = dict(zip(names, args, strict=False))
        if not kwargs.keys().isdisjoint(bound):
            twice = next(name for name in names if name in bound and name in kwargs)
            raise TypeError(f"{self.name}: got multiple values for argument {twice!r}")
        bound.update(kwargs)
        return bound

    def _positional_refusal(self, given: int) -> str:
        names = self._positional_names
        if not names and self._positional_limit is None:
            return (
                f"{self.name}: the forward is keyword-only; got {given} positional argument(s): "
                "pass them by name"
            )
        why = self._positional_limit or f"its forward takes {len(names)}"
        return (
            f"{self.name}: got {given} positional argument(s), and graphed binds at most "
            f"{len(names)} ({', '.join(names) or 'none'}): {why}; pass the others by name"
        )

    def _staged_on_device(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """cpu_inputs="to_device": the CPU tensors of a call, copied to the runner's device."""
        return [
            tensor.to(self.device) if tensor.device.type == "cpu" else tensor for tensor in tensors
        ]

    def _run_module(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The body of the forward operator the core calls for probe, warm-up, capture and eager
        runs: rebuilds the kwargs of the call in flight, runs the module and records the output
        template of this run in the call state (the entry point gives it to the entry a capture
        makes, or rebuilds an eager call's outputs with it)."""
        state = self._call_state
        tree = state.tree
        if tree is None:
            raise RuntimeError(
                f"{self.name}: this runner's forward was reached without a GraphedForward call in "
                "flight (torch.ops.graphed.forward with a key this GraphedForward never saw); call "
                "the GraphedForward once with these kwargs first"
            )
        # A dict is the kwargs the C walker took, decoded from the call's key (a snapshot made
        # before any forward ran); anything else is the TreeSpec of the Python path.
        inputs = list(inputs)
        kwargs = (
            _fastcall.decode(state.key, inputs) if type(tree) is dict else unflatten(tree, inputs)
        )
        phase = state.phase
        settles_state = self._baked is not None and phase in (_PHASE_CAPTURE, _PHASE_EAGER)
        if settles_state and phase == _PHASE_CAPTURE and self._call_state.watch_fired():
            # The probe or the warm-ups changed what the watch sees (a lazy setup): the capture's
            # forward is judged against the module as they left it.
            self._record_baked()
        try:
            if self._checks_devices and phase == _PHASE_EAGER:
                self._refuse_off_device(kwargs, inputs)
            with (
                self._context_for_forward(),
                _phases.forward_in_phase(phase, self, self._state, self._name_side_effects),
            ):
                result = self.module(**kwargs)
            # An output graphed cannot rebuild is the forward's own error too: a TypeError the
            # caller gets once, as raised, rather than a failed capture wrapping it.
            plain = _fastcall.output_template(result)
            template, tensors = plain if plain is not None else flatten_output(result)
        except BaseException as raised:
            # The fact, once: the core decides what an error of the forward's own means (without
            # a group the caller gets it and the forward is not run again; with one it is a
            # capture failure, and the eager run after it runs this forward again, so that its
            # collectives pair with the peers').
            state.record_error(raised, _is_callers_error(raised))
            _log.debug("the forward of %s raised", self.name, exc_info=True)
            raise
        state.record_template(template)
        _verify.check_template_of_key(self, phase, template)
        if settles_state:
            self._settle_after_forward()
        return tensors

    def _refuse_off_device(self, kwargs: dict, tensors: list[torch.Tensor]) -> None:
        """A runner without graphs (a device="cuda" runner on a machine without a GPU): the
        ValueError the core raises on a device for an input on another device, by its kwarg path,
        so that code refused there is refused here too."""
        if any(self._off_device(tensor) is not None for tensor in tensors):
            refuse_tensors(kwargs, self._off_device)

    def _off_device(self, tensor: torch.Tensor) -> str | None:
        """What the core's device check and its wording (graphed::word_input_error) say of
        `tensor`, or None when it is on the runner's device. Without an index the runner's device
        matches every index of its type, as the core's check does for a device it could not
        resolve."""
        device, runner = tensor.device, self.device
        if device.type == "cpu" and self._inputs_to_device:
            return None
        if device.type == runner.type and (
            runner.index is None or device.index is None or device.index == runner.index
        ):
            return None
        option = (
            ", or let GraphedForward(..., cpu_inputs='to_device') copy CPU inputs there for a "
            "forward that moves them itself"
            if device.type == "cpu"
            else ""
        )
        return (
            f"is on {device}; the runner is on {runner}: move the tensor there before the call "
            f"(tensor.to('{runner}')){option}. Graphs are unavailable here, so calls run eager, "
            f"but inputs are checked as a runner on {runner} checks them; to run on this "
            f"machine's {device} instead, make the runner for it (GraphedForward(..., "
            f"device='{device}'))"
        )

    def _eager(self, kwargs: dict) -> Any:
        with torch.no_grad(), self._context_if_outer_capture():
            return self.module(**kwargs)

    # -- helpers ---------------------------------------------------------------------------

    def _state(self) -> _phases.StateToKeep:
        """What a forward may change besides its inputs, for graphed._phases to put back after
        each warm-up (or name): the module's buffers and its submodules' tensor attributes, the
        call's keep_alive tensors, and its parameters and submodules, as the record of what the
        graphs bake in lists them (current: the call's watch did not fire, or re-recorded)."""
        held = [item for item in self._call_state.held if isinstance(item, torch.Tensor)]
        baked = self._baked
        if baked is None:
            return _phases.StateToKeep(held, [], [])
        restored = [tensor for kind in ("buffer", "attribute") for _, tensor in baked.by_kind[kind]]
        return _phases.StateToKeep(
            [*restored, *held], list(baked.by_kind["parameter"]), list(baked.modules)
        )

    def _name_side_effects(self, names: list[str]) -> None:
        """Warns once what a warm-up changed that graphed cannot put back (graphed._phases)."""
        if self._side_effects_named:
            return
        self._side_effects_named = True
        _log.warning(
            "runner '%s': the forward changed %s while graphed warmed it up for a "
            "capture, which graphed cannot put back (a parameter written in place, or a Python "
            "attribute rebound); replays run no Python, so such state stays as the capture left "
            "it while eager would change it at every call. Keep per-call state in buffers or "
            "keep_alive tensors, which graphed puts back, or leave this module eager",
            self.name,
            ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else ""),
        )

    # -- what the graphs baked in (graphed._baked) ---------------------------------------------

    def _watch_module(self) -> None:
        """Records what the graphs bake in besides their inputs and arms the native watch of it;
        a hook that moves the weights at every call disables the runner instead."""
        module = self.module
        state = self._call_state
        if not isinstance(module, torch.nn.Module) or not self.stats()["enabled"]:
            state.unwatch()
            self._baked = None
            return
        hook = weight_moving_hook(module)
        if hook is not None:
            state.unwatch()
            self._baked = None
            reason = (
                f"{hook}, and a graph replays the addresses its capture saw; calls run eager. "
                "To graph this module keep it on the device (for a diffusers pipeline, "
                "pipe.to(device) instead of enable_model_cpu_offload or "
                "enable_sequential_cpu_offload), and wrap it after removing the hooks"
            )
            # Said once: the disable's own report (graphed._observe) names the reason.
            self.disable(reason)
            return
        self._record_baked()
        if state.watch_fired():
            # A tensor whose address torch will not say (see pyext/gf_baked.h): no watch can
            # hold, and a graph of it cannot be kept right.
            self.disable(
                "graphed cannot watch the addresses of the module's tensors (a tensor torch will "
                "not give an address for); calls run eager"
            )

    def _follow_change(self) -> None:
        """The watch fired: compares the module with what the graphs baked in; drops the graphs
        when anything they rely on differs, so that the call captures again."""
        recorded = self._baked
        self._watch_module()
        if recorded is None or self._baked is None:
            return
        changed = recorded.differences(self._baked)
        if changed:
            self.reset()
            _log.info(
                "runner '%s': %s changed since the graphs were captured; they are "
                "dropped and captured again",
                self.name,
                ", ".join(changed),
            )

    def _record_baked(self) -> BakedState:
        """Records the module as it is now and arms the watch of it."""
        self._baked = BakedState(self.module)
        self._call_state.watch(self._baked.dicts, self._baked.tensors)
        return self._baked

    def _settle_after_forward(self) -> None:
        """After the forward ran for a capture (or eagerly inside the core): what it baked in is
        the module as the forward left it. A capture's forward that re-assigned what the graphs
        read is named once, since the graphs captured before it read what it replaced. Nothing is
        recorded again when the watch says nothing changed (the usual case: two reads)."""
        if not self._call_state.watch_fired():
            return
        recorded = self._baked
        after = self._record_baked()
        changed = recorded.differences(after) if recorded is not None else []
        if changed:
            self._name_side_effects(changed)

    def _context_for_forward(self) -> contextlib.AbstractContextManager:
        if self._capture_context is None:
            return contextlib.nullcontext()
        if not self._known_disabled and not self.stats()["enabled"]:
            self._known_disabled = True
        if not self._known_disabled or self._outer_capture_active():
            return self._capture_context()
        return contextlib.nullcontext()

    def _context_if_outer_capture(self) -> contextlib.AbstractContextManager:
        if self._capture_context is not None and self._outer_capture_active():
            return self._capture_context()
        return contextlib.nullcontext()

    def _outer_capture_active(self) -> bool:
        return self._hooks.outer_capture_active()

    @staticmethod
    def _split_keep_alive(keep_alive: Any) -> tuple[list[torch.Tensor], tuple]:
        """Splits keep_alive into the tensors the native entry holds for its life and the objects
        the entry's output template holds (the others, and the tensors again)."""
        if keep_alive is None or (type(keep_alive) in (tuple, list) and not keep_alive):
            return [], _NO_HELD
        if isinstance(keep_alive, torch.nn.Module):
            tensors = [*keep_alive.parameters(), *keep_alive.buffers()]
            return tensors, tuple(tensors)
        if isinstance(keep_alive, torch.Tensor):
            return [keep_alive], (keep_alive,)
        held_tensors: list[torch.Tensor] = []
        others: list[Any] = []
        items = keep_alive.values() if isinstance(keep_alive, dict) else keep_alive
        if not isinstance(items, (tuple, list, type({}.values()))):
            items = (keep_alive,)
        for item in items:
            if isinstance(item, torch.Tensor):
                held_tensors.append(item)
            elif isinstance(item, torch.nn.Module):
                held_tensors.extend([*item.parameters(), *item.buffers()])
            else:
                others.append(item)
        # The tensors ride in the held objects too, so that the forward graphed runs for a capture
        # can name them (CallState.held) for graphed._phases to put back after each warm-up.
        return held_tensors, (*others, *held_tensors)

    def _warn_if_unavailable(self) -> bool:
        """Whether graphs are unavailable to this runner (no backend, or a device the backend
        cannot serve); the first such runner of the process logs why."""
        global _warned_unavailable
        reason = self.disabled_reason
        if not reason.startswith("graphs unavailable"):
            return False
        if not _warned_unavailable:
            _warned_unavailable = True
            _log.warning("calls run eager: %s", reason)
        return True

    # -- introspection and control -------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of this runner: resident `graphs` (and `pinned` ones), `captures`,
        `replays`, `evictions`, `eager_calls`, `pool_bytes` (static inputs and outputs),
        `graph_bytes` (device memory the resident captures took, where the backend can say),
        `shared_input_bytes` (static inputs one graph shares with another), `pool_reserved_bytes`
        (what the runner's graph pool reserves on the device now, shared by the runners of one
        memory pool; -1 when the backend cannot say), `enabled`, `backend` and `disabled_reason`
        (a sentence, or None)."""
        return runner_stats(self._id)

    def entries(self) -> list[dict[str, Any]]:
        """The cached graphs, most recently used first: `key` (hex of the call's key bytes),
        `shapes` (the inputs' dtypes and shapes), `replays`, `static_bytes`, `device_bytes`
        (device memory in use that the capture took; -1 when unknown), `reserved_bytes` (what it
        added to the memory the allocator reserves; -1 when unknown), `pinned`, `folded` (a replay
        is one launch), `written_back` (inputs the forward writes in place) and
        `shared_input_bytes`."""
        return runner_entries(self._id)

    @property
    def num_graphs(self) -> int:
        """How many graphs are cached now."""
        return self.stats()["graphs"]

    @property
    def disabled_reason(self) -> str:
        """Why calls run eager ("" while graphs are in use)."""
        return self.stats()["disabled_reason"] or ""

    def __repr__(self) -> str:
        stats = self.stats()
        state = "enabled" if stats["enabled"] else f"disabled: {stats['disabled_reason']}"
        module = type(self.module).__name__
        return (
            f"GraphedForward({module}, name={self.name!r}, device={self.device}, "
            f"backend={stats['backend']}, graphs={stats['graphs']}, captures={stats['captures']}, "
            f"replays={stats['replays']}, {state})"
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this object lacks: the wrapped module answers, as it would
        # without graphed (gf.config, gf.dtype, gf.weight). The nn.Module methods that return
        # the module (eval, to, half, ...) are this object's own, below, for an nn.Module.
        if name.startswith("__") or name in ("module", "_id"):
            raise AttributeError(name)
        return getattr(self.__dict__["module"], name)

    def disable(self, reason: str) -> None:
        """Disables graph replay for the rest of the process; calls run eager."""
        torch.ops.graphed.disable(self._id, str(reason))
        self._known_disabled = True
        self._call_state.unwatch()
        self._baked = None

    def release_group(self, reason: str) -> None:
        """Lets go of the process group before it ends (graphed._groups calls it when the group
        is destroyed and at interpreter exit): drops every graph, which may use the group's
        communicator, and disables the runner with `reason`; calls run eager from then on."""
        if self.group is None:
            return
        self.disable(reason)
        self.reset()
        self.group = None

    def reset(self) -> None:
        """Drops every captured graph and its buffers; the next call captures again."""
        _fastcall.reset(self._id)

    @property
    def runner_id(self) -> int:
        return self._id

    # -- the nn.Module methods that return the module ------------------------------------------
    # (torch/nn/modules/module.py). Each is applied to the wrapped module and returns this
    # GraphedForward, so that `gf = GraphedForward(m, device=...).eval()` keeps the graphed. The
    # graphs are dropped (reset) when the call changed what they baked in: a submodule's mode, or
    # a parameter's or buffer's address, dtype, device or layout. A move off the runner's device
    # is refused before anything changes. Defined last in the class: `float` and `type` would
    # shadow the builtins in the class body below them.

    def _after_change(self, change: Callable[[], Any]) -> GraphedForward:
        """Applies `change`, then drops the graphs if it changed anything they baked in: the
        same comparison a call makes when the watch fires (graphed._baked)."""
        change()
        self._follow_change()
        return self

    def _moving(
        self, call: str, target: torch.device | None, change: Callable[[], Any]
    ) -> GraphedForward:
        if target is not None and not _same_device(target, self.device):
            raise ValueError(
                f"graphed: runner '{self.name}': {call} would move the module to {target}, off "
                f"the device this GraphedForward runs on ({self.device}); the module was left as "
                f"it was. A GraphedForward serves one device: to run on {target}, move the module "
                f"there and make a new GraphedForward for that device (GraphedForward(module, "
                f'device="{target}")); the graphs of this one stay on {self.device}'
            )
        return self._after_change(change)

    @_module_method
    def train(self, mode: bool = True) -> GraphedForward:
        """module.train(mode); returns this GraphedForward, its graphs dropped if a submodule's
        mode changed."""
        return self._after_change(lambda: self.module.train(mode))

    @_module_method
    def eval(self) -> GraphedForward:
        """module.eval(); returns this GraphedForward, its graphs dropped if a submodule's mode
        changed."""
        return self._after_change(self.module.eval)

    @_module_method
    def requires_grad_(self, requires_grad: bool = True) -> GraphedForward:
        """module.requires_grad_(requires_grad); returns this GraphedForward with its graphs:
        graphed runs forwards under no_grad, so nothing a graph holds depends on the flag."""
        self.module.requires_grad_(requires_grad)
        return self

    @_module_method
    def apply(self, fn: Callable[[torch.nn.Module], None]) -> GraphedForward:
        """module.apply(fn); returns this GraphedForward with its graphs dropped (`fn` may change
        anything a graph holds)."""
        self.module.apply(fn)
        self.reset()
        return self

    @_module_method
    def to(self, *args: Any, **kwargs: Any) -> GraphedForward:
        """module.to(...) (a dtype, the runner's device, a memory format, a tensor); returns this
        GraphedForward, its graphs dropped if a parameter or buffer changed. ValueError, with the
        module left as it was, for another device."""
        target, _, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        return self._moving("to(...)", target, lambda: self.module.to(*args, **kwargs))

    def _to_kind(self, kind: str, device: Any) -> GraphedForward:
        """module.cuda(device) and its kin (xpu, ipu, mtia), for the runner's device only."""
        target = _device_of_kind(kind, device)
        return self._moving(f"{kind}()", target, lambda: getattr(self.module, kind)(device))

    cuda = _method_moving_to_kind("cuda")
    xpu = _method_moving_to_kind("xpu")
    ipu = _method_moving_to_kind("ipu")
    mtia = _method_moving_to_kind("mtia")

    @_module_method
    def cpu(self) -> GraphedForward:
        """module.cpu(), for a runner on the CPU only (see `to`)."""
        return self._moving("cpu()", torch.device("cpu"), self.module.cpu)

    @_module_method
    def to_empty(self, *, device: Any, recurse: bool = True) -> GraphedForward:
        """module.to_empty(device=..., recurse=...), for the runner's device only (see `to`)."""
        target = None if device is None else torch.device(device)
        return self._moving(
            "to_empty()", target, lambda: self.module.to_empty(device=device, recurse=recurse)
        )

    @_module_method
    def type(self, dst_type: Any) -> GraphedForward:
        """module.type(dst_type); a legacy tensor type of another device is refused (see `to`)."""
        target = _device_of_legacy_type(dst_type)
        return self._moving("type()", target, lambda: self.module.type(dst_type))

    @_module_method
    def float(self) -> GraphedForward:
        """module.float(); returns this GraphedForward, its graphs dropped if anything changed."""
        return self._after_change(self.module.float)

    @_module_method
    def double(self) -> GraphedForward:
        """module.double(); returns this GraphedForward, its graphs dropped if anything changed."""
        return self._after_change(self.module.double)

    @_module_method
    def half(self) -> GraphedForward:
        """module.half(); returns this GraphedForward, its graphs dropped if anything changed."""
        return self._after_change(self.module.half)

    @_module_method
    def bfloat16(self) -> GraphedForward:
        """module.bfloat16(); returns this GraphedForward, its graphs dropped if anything
        changed."""
        return self._after_change(self.module.bfloat16)

    @_module_method
    def share_memory(self) -> GraphedForward:
        """module.share_memory(); returns this GraphedForward, its graphs dropped (the tensors
        move to shared memory)."""
        return self._after_change(self.module.share_memory)


class _VerifyingGraphedForward(GraphedForward):
    """A GraphedForward made with verify=N (graphed._verify): each of the first N calls a graph
    serves is compared with an eager run of the same call."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = GraphedForward.__call__(self, *args, **kwargs)
        served = self._call_state.served
        verification = self._verify
        if verification is None or not 0 < served <= verification.calls:
            return result
        call = dict(kwargs)
        _pop_options(call)
        if args:
            call = self._bind_positional(args, call)
        expected = self._eager(call)
        difference = verification.difference(result, expected)
        if difference is None:
            return result
        reason = f"verify: call {served} of a graph differed from eager {difference}"
        # Said once: the disable's own report (graphed._observe) names the reason.
        self.disable(reason)
        return expected
