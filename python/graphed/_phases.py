"""What a forward sees of why graphed runs it: the native core runs the module's forward to probe
for synchronizing operators, to warm up, to be captured, or eagerly (torch.ops.graphed.
forward_phase() says which). Three eager-semantics promises hang on that:

- Capture-aware code (`if not torch.cuda.is_current_stream_capturing(): <a host sync>`, as
  transformers' mask builder does) takes its capture branch in the probe and the warm-ups too, so
  they run what the capture records and the probe does not fail on a sync the capture would skip.
  torch.compile, while it compiles a frame there, gets torch's own answer (graphed._compiled).
  The answer changes for this thread only; code that imported the function by name before the
  process made its first CUDA runner keeps torch's own answer.
- Warm-ups leave no trace in tensor state: module buffers, tensor attributes of its submodules
  and keep_alive tensors that a warm-up writes in place (a cache position counter, a StaticCache
  an attribute owns) are put back after each warm-up, so after the first call they have advanced
  once, as eagerly. The cost is one copy of those tensors taken before the warm-ups of each
  capture, and one copy back per warm-up for each tensor that changed (its version counter says
  so); nothing is copied on replays. What cannot be put back is named once, in a warning: a
  parameter written in place (too large to copy), and a Python attribute a forward rebinds
  (`self.step += 1`), which a replay, running no Python, would never change again; such a forward
  should keep its state in tensors.
- Non-tensor outputs follow from the key: a Python number a forward returns is kept in the output
  template and returned by every replay of its graph. Its runs before a capture (the probe and
  the warm-ups) must all return the same one; a forward whose value differs between runs of one
  key (a call counter, a value read from module state) cannot be replayed, so the capture fails
  with the output path named (the runner runs eager from then on, agreed across a group, and
  warns once).

And one promise to a process group: the sync probe never stops a forward halfway. The backend
runs it under torch's sync-debug mode "warn"; the warnings that reach Python (every operator
called from Python reports there) are counted here instead of shown, and the probe fails once
the forward has returned, so every rank has run all of its collectives before the ranks agree.
A synchronization made while torch.compile compiles a frame the forward reached is the
compiler's, not the forward's, and is not counted (graphed._compiled says why and what else a
runner over compiled code does).

Note [One recorded run per capture]: a capture's inventory (graphed._inventory) is recorded by
one run under the InventoryMode, a TorchFunctionMode whose own cost per torch call (about 2 us on
a 2-core x86 host, whatever the mode does) was most of what the inventory added to a first call
when the probe and the capture both ran under it. The first run before a capture (the sync
probe, or a later key's warm-up) records the reads, and follows weakly what it makes; the
capture then runs without the mode and takes that record, unless the record cannot stand for it:
something the recording run made outlived it (a cache the forward keeps in a global or an
attribute, which the capture would read from outside), a run staged a host constant (the capture
stages its own), or the forward runs compiled code (whose frames are guarded on the mode). Then
the capture records its own reads under the mode, as every capture did before. The record is
the capture's own for everything else: the warm-ups and the capture run on the same static
inputs, with the state put back between them.

What one runner's forwards carry from one run to the next (the warm-ups' snapshot, the templates
of the runs before a capture, the reads recorded for the capture, whether a lost change was
named) is a `ForwardRuns`, one per
GraphedForward and not per thread: its forward operator runs only under the runner's lock (the
core holds it for the probe, the warm-ups, the capture and an eager run; the dispatched path for
a traced call), so no two of its runs overlap, on any thread.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from ._compiled import compiler_running, frames_compiled, holds_compiled_code
from ._inventory import Inventory, storages, synchronizing_call, where_outside_libraries
from ._native import _graphed_fastcall as _fastcall
from ._observe import first_few
from ._tree import TreeSpec

# Why the core runs a forward (ops/gf_host.h's gf_forward_phase), named once, by the extension.
PHASE_EAGER = _fastcall.PHASE_EAGER
PHASE_PROBE = _fastcall.PHASE_PROBE
PHASE_WARMUP = _fastcall.PHASE_WARMUP
PHASE_CAPTURE = _fastcall.PHASE_CAPTURE

# What an exception of the forward was, for CallState.record_error: a failure of the capture (a
# RuntimeError a capture raises for what it forbids), an error of the forward's own (a ValueError,
# a KeyboardInterrupt: the caller gets it as eager would raise it, once, and the runner stays
# enabled), or the device out of memory while the runner warmed up or captured (the call runs
# eager instead, and that key is held back: ops/gf_backoff.h).
_CAPTURE_FAILURE, _OWN_ERROR, _OUT_OF_DEVICE_MEMORY = 0, 1, 2


def error_kind(raised: BaseException, phase: int) -> int:
    if isinstance(raised, torch.OutOfMemoryError):
        return _OWN_ERROR if phase == PHASE_EAGER else _OUT_OF_DEVICE_MEMORY
    return _CAPTURE_FAILURE if isinstance(raised, RuntimeError) else _OWN_ERROR


# What torch's sync-debug mode "warn" says for each synchronizing operator (named once, in C).
_SYNC_WARNING = _fastcall.SYNC_WARNING

_log = logging.getLogger("graphed")
_PACKAGE_DIR = os.path.dirname(__file__)
# Per thread, because each is about the thread: `as_if_capturing` is what
# is_current_stream_capturing answers on this thread (the core runs this thread's forward for a
# capture; another thread's forward is not captured), and `syncs_found` collects the sync warnings
# of this thread's probe (the warnings hook is process-wide; another thread's warnings are shown).
_local = threading.local()
_installed_lock = threading.Lock()
_installed = False


def _capture_aware(original):
    def is_current_stream_capturing() -> bool:
        # Not to torch.compile: Dynamo refuses to compile while a capture is under way (it asks
        # this function), and a probe or a warm-up is where graphed lets a forward compile.
        if getattr(_local, "as_if_capturing", False) and not compiler_running():
            return True
        return original()

    is_current_stream_capturing.__doc__ = original.__doc__
    is_current_stream_capturing.__wrapped__ = original
    return is_current_stream_capturing


def install_capture_awareness() -> None:
    """Makes torch.cuda.is_current_stream_capturing answer True on a thread whose forward graphed
    is probing or warming up for a capture (idempotent)."""
    global _installed
    with _installed_lock:
        if _installed:
            return
        wrapped = _capture_aware(torch.cuda.is_current_stream_capturing)
        torch.cuda.is_current_stream_capturing = wrapped
        torch.cuda.graphs.is_current_stream_capturing = wrapped
        _installed = True


class StateToKeep(NamedTuple):
    """What a forward may change besides its inputs, as GraphedForward lists it for a capture:
    `restored` (buffers, tensor attributes, keep_alive tensors: copied before the warm-ups and put
    back after each), `parameters` ((name, parameter) pairs: too large to copy, so an in-place
    write is only named) and `rebound`: what the forward re-assigned of the module since it was
    last asked (a Python attribute rebound, a value a dict, list or set holds, a tensor replaced),
    which nothing can put back for a replay: named too. graphed._watch answers it, as it
    sees any mutation of the module's dicts for the cost of a check, where a pass comparing every
    submodule's attributes after each run cost 1.5 to 1.9 ms for the big benchmark DiT's 402
    submodules (a 2-core x86 host); its argument is True after the first run, whose changes are a
    lazy setup. None when no module is watched."""

    restored: list[torch.Tensor]
    parameters: list[tuple[str, torch.Tensor]]
    rebound: Callable[[bool], list[str]] | None
    # Every tensor the watch follows (those above and the tensors the module's containers hold):
    # what a capture's inventory counts as module state (graphed._inventory).
    watched: list[torch.Tensor] = []


class _Snapshot:
    """Copies of state tensors taken before a capture's warm-ups, put back after each one; and
    what cannot be put back (a parameter written in place, found by its version counter; what the
    forward re-assigned of the module, from StateToKeep.rebound)."""

    def __init__(self, state: StateToKeep) -> None:
        # (tensor, its version then, its copy); the version is None for an inference tensor (a
        # cache made under torch.inference_mode), which has none and is always put back.
        self.saved: list[tuple[torch.Tensor, int | None, torch.Tensor]] = []
        seen: set[int] = set()
        with torch.no_grad():
            for tensor in state.restored:
                if id(tensor) in seen or tensor.numel() == 0:
                    continue
                if isinstance(tensor, torch.nn.Parameter):
                    continue  # a keep_alive module's weights: watched as parameters below
                seen.add(id(tensor))
                if tensor.is_inference():
                    with torch.inference_mode():
                        self.saved.append((tensor, None, tensor.clone()))
                else:
                    self.saved.append((tensor, tensor._version, tensor.clone()))
        self.parameters = [
            (name, parameter, parameter._version)
            for name, parameter in state.parameters
            if not parameter.is_inference()
        ]
        self.rebound = state.rebound
        self.first_run = True

    def restore(self) -> tuple[bool, list[str]]:
        """Puts the state tensors back; returns whether any was, and the names of what changed
        that cannot be."""
        put_back = False
        with torch.no_grad():
            for tensor, version, copy in self.saved:
                if version is None:
                    with torch.inference_mode():
                        tensor.copy_(copy)
                elif tensor._version != version:
                    tensor.copy_(copy)
                    put_back = True
        lost = [
            name for name, parameter, version in self.parameters if parameter._version != version
        ]
        first_run, self.first_run = self.first_run, False
        if self.rebound is not None:
            lost += self.rebound(first_run)
        return put_back, lost


# The hook that counts sync warnings is shared by every probe in flight: the first to begin puts
# it (and a filter that lets the warning through) in front, the last to end takes them out
# again, leaving alone whatever else changed meanwhile. Each probing thread counts into its own
# list (_local.syncs_found); other threads' warnings are shown as they would have been.
_hook_lock = threading.Lock()
_hook_users = 0
_shown_before: Any = None
_sync_filter: Any = None


def _count_or_show(message, category, filename, lineno, file=None, line=None):
    found = getattr(_local, "syncs_found", None)
    if found is not None and str(message).startswith(_SYNC_WARNING):
        if compiler_running():
            # torch.compile's own work (inductor's constant folding, its kernel benchmarks) while
            # it compiles a frame the forward reached: not the compiled code a graph replays.
            _local.compiler_synced = True
            return
        # An operator graphed's InventoryMode called for the forward: the forward's own line.
        own = str(filename).startswith(_PACKAGE_DIR)
        found.append(
            where_outside_libraries() + synchronizing_call() if own else f"{filename}:{lineno}"
        )
        return
    _shown_before(message, category, filename, lineno, file, line)


def _install_hook() -> None:
    global _hook_users, _shown_before, _sync_filter
    with _hook_lock:
        _hook_users += 1
        if _hook_users > 1:
            return
        _shown_before = warnings.showwarning
        warnings.showwarning = _count_or_show
        warnings.filterwarnings("always", message=_SYNC_WARNING)
        _sync_filter = warnings.filters[0]


def _remove_hook() -> None:
    global _hook_users, _sync_filter
    with _hook_lock:
        _hook_users -= 1
        if _hook_users > 0:
            return
        if warnings.showwarning is _count_or_show:
            warnings.showwarning = _shown_before
        if _sync_filter in warnings.filters:
            warnings.filters.remove(_sync_filter)
            mutated = getattr(warnings, "_filters_mutated", None)
            if mutated is not None:
                mutated()
        _sync_filter = None


@contextlib.contextmanager
def _counting_syncs() -> Iterator[list[str]]:
    """Collects, as "file:line", where this thread's forward synchronized while it runs; torch's
    sync warnings from this thread are not shown, every other warning is. The filter in front
    lets the warning through whatever filters the process had before (`-W error`, an ignore
    filter). The warnings module is process-wide: code that replaces `warnings.showwarning` or
    the filters while a probe runs (`catch_warnings` in another thread, or in the forward) can
    hide a synchronization from the probe; the capture then fails on it instead, which disables
    the runner all the same (and, with a group, on every rank)."""
    outer = getattr(_local, "syncs_found", None)
    outer_compiler = getattr(_local, "compiler_synced", False)
    found: list[str] = []
    _local.syncs_found = found
    _local.compiler_synced = False  # whether the compiler synchronized (it compiled) meanwhile
    _install_hook()
    try:
        yield found
    finally:
        _remove_hook()
        _local.syncs_found = outer
        _local.compiler_synced = outer_compiler


def _probe_verdict(found: list[str]) -> None:
    """Fails the probe, after its forward returned, when the forward synchronized."""
    if found:
        more = f" and {len(found) - 1} more time(s)" if len(found) > 1 else ""
        raise RuntimeError(
            f"graphed: the forward {_SYNC_WARNING} at {found[0]}{more}, found by graphed's sync "
            "probe; a captured graph cannot hold a host synchronization: take it out of the "
            "forward (or skip it when torch.cuda.is_current_stream_capturing()), pass a value "
            "the host needs as a kwarg, or leave this module eager (or let graphed run it in "
            "regions, its default)"
        )


class ForwardRuns:
    """What one runner's forwards carry from one run to the next (see the module docstring): the
    snapshot its warm-ups put back, the output templates of the runs before a capture, and
    whether what cannot be put back was named. GraphedForward holds one and its forward operator
    alone uses it, under the runner's lock."""

    def __init__(self, name: str, call_state: Any, device_type: str, module: Any) -> None:
        self.name = name
        self.module = module  # what the forward runs (its compiled code is looked for)
        self.call_state = call_state  # the GraphedForward's CallState (pyext/gf_call_state.h)
        self.inventory = Inventory(name, device_type)
        # The capture whose forward returned and whose inventory waits for its outputs.
        self.capture_in_flight: tuple[Any, list[torch.Tensor]] | None = None
        # The reads the first run before a capture recorded (Note [One recorded run per capture]),
        # and whether the capture may take them: None until that run returned.
        self.recorded: Any = None
        self.recorded_stands: bool | None = None
        self.snapshot: _Snapshot | None = None
        self.templates: list[Any] | None = None
        self.side_effects_named = False
        # Whether the forward runs compiled code (graphed._compiled): the module holds it, or the
        # compiler was seen at work in one of its runs.
        self.compiled = False
        self.frames_looked_at: int | None = -1  # graphed._compiled.frames_compiled at the last look

    @contextlib.contextmanager
    def forward_in_phase(
        self, phase: int, state: Callable[[], StateToKeep], inputs: list[torch.Tensor]
    ) -> Iterator[None]:
        """Runs one forward of the core as `phase` requires: capture-aware answers during probe
        and warm-ups, and state tensors put back after each warm-up. `state` is called only when
        a capture's warm-ups start, and for the capture's inventory; what a warm-up changed that
        cannot be put back is named (name_side_effects), and a warm-up that changed nothing says
        so to the core (kept_state). A capture, an eager run (after a failed probe) or a forward
        that raised ends it, so that the next capture's warm-ups copy the state as it is then.
        The first run before a capture runs under the InventoryMode (graphed._inventory) and
        records the capture's reads (Note [One recorded run per capture]); the other warm-ups
        do once a run staged a host constant or the forward runs compiled code."""
        inventory = self.inventory
        if phase == PHASE_EAGER:
            self.snapshot = self.recorded = None
            yield
            return
        if phase == PHASE_CAPTURE:
            with self._capturing(state, inputs):
                yield
            return
        if self.snapshot is None and not self.compiled:
            # Before a capture's runs: at the first, and after anything compiled since the last.
            frames = frames_compiled()
            if frames is None or frames != self.frames_looked_at:
                self.frames_looked_at = frames
                self.compiled = holds_compiled_code(self.module)
        # The first run before a capture records its reads (Note [One recorded run per capture]).
        known = self._first_run_before_capture(state, inputs) if self.snapshot is None else None
        # A runner over compiled code warms up under the mode too: Dynamo guards on the stack of
        # torch function modes, and a warm-up without the capture's mode would compile a frame
        # the capture could not use, so the capture would compile again (graphed._compiled).
        staged = (
            known is not None
            or phase != PHASE_WARMUP
            or inventory.stages_constants
            or self.compiled
        )
        key = self.call_state.key
        mode = inventory.mode(key, known, capturing=False) if staged else contextlib.nullcontext()
        snapshot = self.snapshot
        outer = getattr(_local, "as_if_capturing", False)
        _local.as_if_capturing = True
        try:
            if phase == PHASE_PROBE:
                with _counting_syncs() as found, mode:
                    yield
                    self.compiled = self.compiled or _local.compiler_synced
                _probe_verdict(found)
            else:
                with mode:
                    yield
            if staged:
                inventory.end_run()
            if known is not None:
                self.recorded, self.recorded_stands = mode.reads, None
        except BaseException:
            self.snapshot = self.recorded = None
            raise
        finally:
            _local.as_if_capturing = outer
            # Before restore, which records the module again: whether the module is watched and
            # the watch saw the forward change nothing, not even a lazy setup.
            unseen_by_watch = snapshot.rebound is not None and not self.call_state.watch_fired()
            put_back, changed = snapshot.restore()
            if changed:
                self.name_side_effects(changed)
        if unseen_by_watch and not put_back and not changed:
            self.kept_state()

    def _first_run_before_capture(
        self, state: Callable[[], StateToKeep], inputs: list[torch.Tensor]
    ) -> set[int] | None:
        """Takes the snapshot the capture's warm-ups put back; returns the storages the run
        records the capture's reads against (_known), or None where the capture will record its
        own anyway (a host constant staged, compiled code)."""
        kept = state()
        self.snapshot = _Snapshot(kept)
        self.recorded = None
        if self.inventory.stages_constants or self.compiled:
            return None
        return self._known(kept, inputs)

    @contextlib.contextmanager
    def _capturing(
        self, state: Callable[[], StateToKeep], inputs: list[torch.Tensor]
    ) -> Iterator[None]:
        """The capture's forward: without the mode where the run before it recorded the reads
        and that record stands, else under the mode, recording its own (Note [One recorded run
        per capture]); its inventory is finished with its outputs (check_template)."""
        inventory = self.inventory
        self.snapshot = None
        recorded, self.recorded = self.recorded, None
        key = self.call_state.key
        if (
            recorded is not None
            and self.recorded_stands
            and not inventory.stages_constants
            and not self.compiled
        ):
            inventory.staging.begin(key, capturing=True)
            yield
            self.capture_in_flight = recorded, inputs
            return
        mode = inventory.mode(key, self._known(state(), inputs), capturing=True)
        with mode:
            yield
        self.capture_in_flight = mode.reads, inputs

    @staticmethod
    def _known(kept: StateToKeep, inputs: list[torch.Tensor]) -> set[int]:
        """What a capture's inventory counts as neither made nor external: the storages of the
        inputs and of the state the watch follows."""
        parameters = (tensor for _, tensor in kept.parameters)
        return storages(itertools.chain(inputs, kept.restored, parameters, kept.watched))

    def kept_state(self) -> None:
        """Tells the core that the warm-up that just ran changed nothing: it may answer the
        capturing call with that warm-up's outputs (Note [The first call from its last warm-up],
        ops/gf_warm_up_answer.c). Not where the state is unknown (a callable that is not a
        module, whose attributes no watch sees), and not in a distributed job
        (torch.distributed initialized): a rank whose copies failed would replay the graph, and
        its collectives, where its peers did not."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if not distributed:
            self.call_state.record_kept_state()

    def name_side_effects(self, names: list[str]) -> None:
        """Warns once what a warm-up (or a capture's forward) changed that graphed cannot put
        back."""
        if self.side_effects_named:
            return
        self.side_effects_named = True
        _log.warning(
            "runner '%s': the forward changed %s while graphed warmed it up for a "
            "capture, which graphed cannot put back (a parameter written in place, or a Python "
            "attribute rebound); replays run no Python, so such state stays as the capture left "
            "it while eager would change it at every call. Keep per-call state in buffers or "
            "keep_alive tensors, which graphed puts back, or leave this module eager",
            self.name,
            first_few(names),
        )

    def check_template(self, phase: int, template: Any, outputs: list[torch.Tensor]) -> None:
        """Records the output template of each run before a capture and, at the capture, raises
        the capture failure that names the first non-tensor output that differed between runs
        of the key (see the module docstring); a capture's inventory is finished here, with its
        outputs (graphed._inventory)."""
        in_flight, self.capture_in_flight = self.capture_in_flight, None
        if in_flight is not None and phase == PHASE_CAPTURE:
            reads, inputs = in_flight
            self.inventory.finish_capture(reads, self.call_state, inputs, outputs)
        if phase in (PHASE_PROBE, PHASE_WARMUP):
            if self.recorded is not None and self.recorded_stands is None:
                # The run that recorded the reads: whether anything it made outlived it.
                self.recorded_stands = self.recorded.survivors(outputs) == 0
            if self.templates is None:
                self.templates = []
            self.templates.append(template)
            return
        runs = self.templates
        if phase not in (PHASE_CAPTURE, PHASE_EAGER) or runs is None:
            return
        self.templates = None
        if phase == PHASE_EAGER:
            return
        now = _comparable(template)
        for earlier in map(_comparable, runs):
            try:
                same = bool(earlier == now)
            except Exception:  # a value whose == is no truth value: it cannot be compared, so kept
                same = True
            if not same:
                where = (
                    _first_difference(earlier, now, "output")
                    if not isinstance(template, TreeSpec)
                    else "output"
                )
                raise RuntimeError(
                    f"graphed: the forward's non-tensor {where} differs between runs of one key "
                    "before its capture; a graph would return the capture's value on every "
                    "replay. Return it as a tensor, make it follow from the arguments, or leave "
                    "this module eager"
                )


def _first_difference(before: Any, now: Any, path: str) -> str:
    """The path of the first leaf two plain output templates differ at (graphed's walker builds
    them from dict, list and tuple; anything else is named as a whole)."""
    if type(before) is type(now) and isinstance(before, (list, tuple)) and len(before) == len(now):
        for index, (old, new) in enumerate(zip(before, now, strict=True)):
            if old != new:
                return _first_difference(old, new, f"{path}[{index}]")
    if type(before) is type(now) and isinstance(before, dict) and before.keys() == now.keys():
        for key in before:
            if before[key] != now[key]:
                return _first_difference(before[key], now[key], f"{path}[{key!r}]")
    return f"{path} ({before!r}, then {now!r})"


def _comparable(template: Any) -> Any:
    """What two runs' templates are compared by: the walked result inside a plain template (the
    C walker's, read by the extension, which alone knows its form), the structure of a TreeSpec
    (graphed._tree), else itself."""
    if isinstance(template, TreeSpec):
        return template.root
    walked = _fastcall.walked_of(template)
    return template if walked is None else walked
