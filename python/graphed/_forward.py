"""GraphedForward: the model-code face of graphed, and its call path. It gives its runner the
module's forward as a direct hook the native core calls for capture and hands each call to the C
entry points (`graphed._native._graphed_fastcall`), which key, capture, replay or run eager: plain
kwargs are walked in C; the others are flattened here (graphed._tree) and go through the
dispatcher. Composed in from beside it: the watch (graphed._watch), what the core's forwards carry
between runs (graphed._phases), verify mode (graphed._verify), the operators and the runner
registry (graphed._ops), the arguments (graphed._arguments), the nn.Module face
(graphed._module_methods).

Not goals: training (forwards run under no_grad; a graph records no autograd history); dynamic
shapes within one key (each input dtype and shape is a key with a graph of its own); concurrent
replay of one runner (calls from several threads take turns under the runner's lock); a runner
over two devices (it serves the device it was made for, and refuses inputs and moves elsewhere).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from . import _arguments, _eager, _groups, _library, _observe, _ops, _phases, _regions, _verify
from ._churn import KeysWithoutGraphs, NewKeys
from ._device_hooks import hooks_for
from ._memory import MemoryPool
from ._module_methods import ModuleMethods
from ._native import _graphed_fastcall as _fastcall
from ._options import RunnerOptions
from ._reentry import ReentryDepth
from ._tree import flatten_kwargs, flatten_output, kwargs_of, rebuild_output
from ._watch import Watch

__all__ = ["GraphedForward"]

_log = logging.getLogger("graphed")
_FALLBACK = _fastcall.FALLBACK
_REENTERED = _fastcall.REENTERED
_CHANGED = _fastcall.CHANGED
_RUN_EAGER = _fastcall.RUN_EAGER
# Bound once, for the call path (and every name of it below).
_pop_options = _arguments.pop_options
_split_keep_alive = _arguments.split_keep_alive
_NO_HELD = _arguments.NO_HELD
# The keep_alive of a call that passes none; the native entry only reads it.
_NO_KEEP_ALIVE: list = []
_is_compiling = torch.compiler.is_compiling  # bound, torch.compile still recognises it
_PHASE_CAPTURE = _phases.PHASE_CAPTURE
_PHASE_EAGER = _phases.PHASE_EAGER
_DIFFERED = _fastcall.Differed
_run_eagerly = _eager.run_eagerly
_DISABLED, _HELD_BACK, _REENTERED_CALL = _eager.DISABLED, _eager.HELD_BACK, _eager.REENTERED
# GraphedForward's default churn_limit (ops/gf_churn.h).
CHURN_LIMIT = _fastcall.CHURN_LIMIT


class GraphedForward(ModuleMethods, _ops.RunnerReports):
    """Replays captured device graphs of `module`'s forward.

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
        name: str | None = None,
        enabled: bool = True,
        capture_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        backend: str | None = None,
        cpu_inputs: str = "refuse",
        verify: int | None = None,
        verify_tolerance: tuple[float, float] | None = None,
        verify_every: int | None = None,
        memory_pool: MemoryPool | None = None,
        churn_limit: int = CHURN_LIMIT,
        regions: bool = True,
    ) -> None:
        """Wraps `module` (any callable taking keyword arguments) for `device`. docs/api.md's
        table gives each option in full:

        max_entries: graphs kept (LRU; pinned never evicted). warmup_iters: forwards run before
        each first capture. group: a process group over which capture outcomes are agreed.
        name: in logs and stats. enabled=False: every call eager. capture_context: entered
        around the runs graphed makes for probe, warm-up and capture. backend: a registered
        backend for this runner alone (None: graphed.backend()). Positional arguments are bound
        to the forward's parameters by name and keyed as those keywords. cpu_inputs: "refuse"
        (a CPU tensor input of a device runner is a ValueError naming it) or "to_device" (copied
        to the device first, for forwards that move such inputs themselves). verify=N compares
        each of the first N calls of every graph with eager (bitwise, or within
        verify_tolerance=(rtol, atol)); a difference disables the runner, names the output path
        and returns eager's result; verify_every=K then compares one call in K in serving (None
        reads $GRAPHED_VERIFY / $GRAPHED_VERIFY_EVERY). memory_pool: a graphed.MemoryPool shared
        with other runners of the device. churn_limit: after that many new keys in a row with no
        call of an existing graph, a new key runs eagerly until it comes a second time (0: off).
        regions=False keeps the whole runner eager when its capture fails; by default the
        forward then runs eagerly and the submodules it calls are graphed one by one."""
        _library.load_library()
        _arguments.check_callable(module)
        _arguments.check_reserved(module)
        name = _arguments.default_name(module) if name is None else name  # rows told apart
        options = RunnerOptions.of(  # every parameter but the module, by its name
            **{key: value for key, value in locals().items() if key not in ("self", "module")}
        )
        self._start(module, options, module)

    @classmethod
    def from_options(
        cls, module: Callable[..., Any], options: RunnerOptions, forward: Callable[..., Any]
    ) -> GraphedForward:
        """A GraphedForward of `module` made with `options` (another's `.options`, copied with
        dataclasses.replace) that runs `forward` in place of the module's call, while `module`
        stays what the watch watches: a region's (graphed._regions), whose forward is the one the
        region replaced. A subclass's own __init__ is not run."""
        _library.load_library()
        _arguments.check_callable(forward)
        _arguments.check_reserved(module)
        runner = cls.__new__(cls)
        runner._start(module, options, forward)
        return runner

    def _start(
        self, module: Callable[..., Any], options: RunnerOptions, forward: Callable[..., Any]
    ) -> None:
        """The per-runner state, then the runner itself (graphed._ops) and what it starts with:
        its watch, and the Python answer when it starts disabled."""
        self.module = module
        self.options = options
        self.device, self.name, self.group = options.device, options.name, options.group
        self.memory_pool = options.memory_pool
        self._positional_names, limit = _arguments.positional_names(module)
        # The kwargs a positional call makes: (args, kwargs) -> kwargs (_arguments.bind_positional).
        self._bind_positional = functools.partial(
            _arguments.bind_positional, self.name, self._positional_names, limit
        )
        # What the host's forward and eager runs call: the module, or a region's original
        # forward (graphed._regions); `module` stays what the watch watches.
        self._forward_call = forward
        self._regions: _regions.Regions | None = None
        # The call in flight, set by both C entry points under the runner's lock (gf_fastcall.c).
        self._call_state = _fastcall.CallState(rebuild_output)
        self._watch = Watch(self._call_state, own_forward=forward is module)
        self._runs = _phases.ForwardRuns(self.name, self._call_state, self.device.type, module)
        # The kwargs of the latest calls without a graph, for the churn guard's warning.
        self._new_keys = NewKeys(kwargs_of)
        # How deep this runner's forward runs on this thread now (graphed._reentry).
        self._forwards_here = ReentryDepth()
        # Disabled for good (_turn_off), settled once (_settle_disable), next call makes regions.
        self._disabled = self._disable_settled = self._split_due = False
        # What compares the calls the entries sample with eager (none without verify options).
        self._verifier = _verify.Verifier.of(options.verification, self._call_state)
        self._registration = self._make_runner(options)
        self._registration.log.describe_churn = self._new_keys.describe
        self._id = self._registration.runner_id
        stats = self.stats()
        # Where graphs are unavailable the core's device check and churn guard never run: the eager
        # runs make them (_run_module; graphed._eager, whose record is all it reads of this runner).
        graphless = _observe.graphs_unavailable(stats)
        self._checks_devices = graphless and self.device.type != "cpu"
        churn_limit = options.churn_limit if graphless else 0
        self._keys_without_graphs = KeysWithoutGraphs(self.name, self._new_keys, churn_limit)
        self._eager = _eager.EagerRun(
            forward,
            module,
            options,
            self._registration,
            self._forwards_here,
            self._watch,
            self._runs,
            self._new_keys,
            self._keys_without_graphs,
            self._checks_devices,
        )
        self._verifier.arm(self, self._eager)
        if self.group is not None:
            _groups.release_before_teardown()
        if not stats["enabled"]:
            self._settle_disable()
        self._watch.arm(self)

    def _make_runner(self, options: RunnerOptions) -> _ops.Registration:
        # With a group, the shim agrees over it by its registered name (graphed._groups).
        group_name = None if self.group is None else _groups.group_name_of(self.group)
        hooks_for(self.device.type).on_runner_created()
        return _ops.make_runner(
            self,
            GraphedForward._run_module,
            GraphedForward._turn_off,
            self._call_state,
            group_name=group_name,
            **options.create_keywords(),
        )

    # -- the call path ---------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the module with `kwargs` through the graph of their key, capturing it first if
        needed. Four keyword names are graphed's own options, not the module's: `variant` (one
        more value of the key), `keep_alive` (tensors, or a module's parameters and buffers, held
        by the entry a capture creates), `pin` (True keeps that entry from eviction) and
        `static_outputs` (True returns the graph's own output buffers, which the next replay
        overwrites). Returns what the module returns, with fresh tensors."""
        if self._disabled:
            # A runner disabled for good, answered in Python.
            return self._call_disabled(args, kwargs)
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
            held_tensors, held_objects = _split_keep_alive(keep_alive)
        else:
            variant, pin, static_outputs = None, False, False
            held_tensors, held_objects = _NO_KEEP_ALIVE, _NO_HELD
        if args:
            kwargs = self._bind_positional(args, kwargs)
        if _is_compiling():
            return _run_eagerly(self._eager, kwargs, _eager.COMPILING)
        while True:
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
            if result is not _CHANGED:
                break
            # What the graphs baked in may have changed (graphed._watch): look, then call again.
            self._watch.follow_change(self)
        if result is _FALLBACK:
            options = (held_tensors, pin, static_outputs, held_objects)
            result = self._call_flat(kwargs, variant, options)
        if result is _RUN_EAGER:
            # A new key the core holds back (ops/gf_churn.h, gf_backoff.h): run here, not through
            # the host's forward (about 60 us a call more on the H200's host).
            return _run_eagerly(self._eager, kwargs, _HELD_BACK, variant=variant)
        if result is _REENTERED:
            # A call from inside this instance's own forward (the forward calls its GraphedForward
            # again): eager, as the forward would run without graphed (see gf_fastcall.c).
            return _run_eagerly(self._eager, kwargs, _REENTERED_CALL)
        if type(result) is _DIFFERED:
            # A call verify mode compared with eager differed (graphed._verify).
            return self._verifier.differed(self, kwargs, result)
        return result

    def _call_flat(self, kwargs: dict, variant: Any, options: tuple) -> Any:
        """The Python path: kwargs the C walker hands back (FALLBACK), flattened here and called
        through the dispatcher, where modes and tensor subclasses see the call; a call without
        tensors runs the module. `options` are call_flat's four before the kwargs (the held
        tensors, pin, static_outputs, the held objects)."""
        tensors, key, spec = flatten_kwargs(kwargs, variant)
        if not tensors:
            return _run_eagerly(self._eager, kwargs, _eager.NO_TENSORS)
        _arguments.check_keep_alive(options[0])
        return _fastcall.call_flat(self._id, self._call_state, key, tensors, spec, *options, kwargs)

    def _call_disabled(self, args: tuple, kwargs: dict) -> Any:
        """A call of a runner disabled for good, answered here: the module runs eagerly without
        entering the core (no runner lock, no dispatcher, no decoding), through the one eager
        route (graphed._eager), after the C walker's refusals by kwarg path; kwargs the walker
        hands back take the Python path (_call_flat) as before. The first such call of a runner
        whose capture failed makes its regions (graphed._regions)."""
        variant, keep_alive, pin, static_outputs = _pop_options(kwargs)
        held_tensors, held_objects = _split_keep_alive(keep_alive)
        if args:
            kwargs = self._bind_positional(args, kwargs)
        if _is_compiling():
            return _run_eagerly(self._eager, kwargs, _eager.COMPILING)
        if self._forwards_here.level:
            return _run_eagerly(self._eager, kwargs, _REENTERED_CALL)
        if not self._disable_settled:
            self._settle_disable()
        if self._split_due:
            self._split_due = False
            self._regions = self._eager.regions = _regions.split_into_regions(self)
        flat = _fastcall.flatten(kwargs, variant)
        if flat is _FALLBACK:
            options = (held_tensors, pin, static_outputs, held_objects)
            result = self._call_flat(kwargs, variant, options)
            if result is _REENTERED:
                return _run_eagerly(self._eager, kwargs, _REENTERED_CALL)
            return result
        tensors = flat[1]
        if not tensors:
            return _run_eagerly(self._eager, kwargs, _eager.NO_TENSORS)
        _arguments.check_keep_alive(held_tensors)
        return _run_eagerly(self._eager, kwargs, _DISABLED, tensors)

    def _run_module(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The body of the forward operator the core calls for probe, warm-up, capture and eager
        runs (under the runner's lock): rebuilds the kwargs of the call in flight, runs the
        module and records the output template of this run in the call state (the entry point
        gives it to the entry a capture makes, or rebuilds an eager call's outputs with it)."""
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
        source = state.key if type(tree) is dict else tree
        kwargs = kwargs_of(source, inputs)
        phase = state.phase
        if self._disabled and not self._disable_settled:  # the call that disabled the runner
            self._settle_disable()
        if phase == _PHASE_CAPTURE or phase == _PHASE_EAGER:
            # A call without a graph: the churn guard names what changes among them (and, when
            # the guard started on this call, says so now that it is recorded).
            self._new_keys.record(source, inputs)
            log = self._registration.log
            if log.churn_pending is not None:
                log.say_churn()
        watch, runs = self._watch, self._runs
        settles_state = watch.baked is not None and phase in (_PHASE_CAPTURE, _PHASE_EAGER)
        if settles_state and phase == _PHASE_CAPTURE:
            watch.before_capture(self.module)
        try:
            if self._checks_devices and phase == _PHASE_EAGER:
                _arguments.refuse_off_device(
                    kwargs, inputs, self.device, self.options.inputs_to_device
                )
            with (
                self._forwards_here,
                _eager.run_context(self._eager, not self._disabled),
                runs.forward_in_phase(
                    phase, lambda: watch.state_to_keep(state.held, self.module), inputs
                ),
            ):
                result = self._forward_call(**kwargs)
            # An output graphed cannot rebuild is the forward's own error too: a TypeError the
            # caller gets once, as raised, rather than a failed capture wrapping it.
            plain = _fastcall.output_template(result)
            template, tensors = plain if plain is not None else flatten_output(result)
        except BaseException as raised:
            # The fact, once: the core decides what an error of the forward's own means (without
            # a group the caller gets it and the forward is not run again; with one it is a
            # capture failure, and the eager run after it runs this forward again, so that its
            # collectives pair with the peers').
            state.record_error(raised, _phases.error_kind(raised, phase))
            _log.debug("the forward of %s raised", self.name, exc_info=True)
            raise
        state.record_template(template)
        runs.check_template(phase, template, tensors)
        if settles_state:
            changed = watch.settle(self.module)
            if changed:
                runs.name_side_effects(changed)
        return tensors

    # -- introspection and control -------------------------------------------------------

    def __repr__(self) -> str:
        stats = self.stats()
        state = "enabled" if stats["enabled"] else f"disabled: {stats['disabled_reason']}"
        module = type(self.module).__name__
        return (
            f"GraphedForward({module}, name={self.name!r}, device={self.device}, "
            f"backend={stats['backend']}, graphs={stats['graphs']}, captures={stats['captures']}, "
            f"replays={stats['replays']}, {state})"
        )

    def disable(self, reason: str, cause: str = "user") -> None:
        """Disables graph replay for the rest of the process; calls run eager. `cause` is what
        stats()["disabled_cause"] says (graphed itself passes "verify", "watch", ...)."""
        torch.ops.graphed.disable(self._id, str(reason), cause)
        self._settle_disable()

    def _turn_off(self) -> None:
        """The runner's "disabled" event (graphed._observe, inside the core's call that
        disabled it): the switch to the Python answer (_call_disabled), and nothing else."""
        self._disabled = True

    def _settle_disable(self) -> None:
        """Once disabled for good, on the call path (the eager run of the call that disabled it,
        the next call, disable()): nothing is watched, and the cause code decides whether the
        forward runs in regions (made by the next call), whose warning says why; else the
        disable's own warning is said."""
        if self._disable_settled:
            return
        self._disabled = True
        self._watch.stop()
        self._verifier.stop()
        try:
            self._split_due = self.options.regions and _regions.splits_into_regions(self)
            if self._split_due:  # its warning says the disable's reason
                self._registration.log.disable_pending = None
                _regions.say_split(self)
            self._disable_settled = True
        finally:
            self._registration.log.say_disabled()

    def regions(self) -> list[dict[str, Any]]:
        """The submodules considered as regions, in tree order, when the forward runs in regions
        ([] when it runs whole): each a dict of "path" (dotted, from this module), "state"
        ("graphed", "eager", "split": its children are regions, "pending": not called yet),
        "reason" (why eager or split: the region's disabled_reason, which names the file and
        line of a synchronization, or why graphed refused it) and "stats" (its runner's
        stats(), or None)."""
        return [] if self._regions is None else self._regions.describe()

    @property
    def region_tree(self) -> _regions.Regions | None:
        """The regions this runner's forward runs in (graphed._regions), or None."""
        return self._regions

    def release_group(self, reason: str) -> None:
        """Lets go of the process group before it ends (graphed._groups calls it when the group
        is destroyed and at interpreter exit): drops every graph, which may use the group's
        communicator, and disables the runner with `reason`; calls run eager from then on."""
        if self.group is None:
            return
        self.disable(reason, "group_released")
        self.reset()
        self.group = None

    def reset(self) -> None:
        """Drops every captured graph and its buffers; the next call captures again."""
        _fastcall.reset(self._id, True)

    def _follow_change(self) -> None:
        """What the graphs baked in may have changed (graphed._module_methods): look."""
        self._watch.follow_change(self)

    @property
    def runner_id(self) -> int:
        return self._id
