"""What a GraphedForward's graphs baked in besides their inputs, and whether it still holds.

A captured graph reads the module's parameters, buffers and tensor attributes at the addresses
its capture saw, and replays the submodules, hooks and modes the capture ran. Serving code
changes those between calls: a LoRA loader or a quantiser re-assigns a parameter
(`m.weight = nn.Parameter(w)`), a weight loader swaps `.data`, a user replaces a submodule or
adds a hook, an offload hook moves every weight at every call. A replay after any of those would
compute with what is gone, silently.

`BakedState(module)` records it all, by dotted path: every submodule (its identity, class, mode,
hooks and an instance `forward` override), every parameter, buffer and tensor attribute (identity,
data address, dtype, device, shape, strides), every other attribute's Python value (see "Python
values" below), and torch's global forward hooks. It also lists what the native watch checks
before every call (pyext/gf_baked.h): the dicts that hold all of that, the lists and sets among
the Python values, and the tensors' addresses; a swap of two tensors' contents
(`torch.utils.swap_tensors`, which changes no dict) is counted for it (`count_swaps`).

Python values: a forward reads numbers and flags from its module (peft's LoRA layers keep the
adapters' `scaling` dict, `_disable_adapters`, `merged_adapters` and `_active_adapter` there; a
model keeps `self.cfg["scale"]`), and a graph bakes what they were at capture. Each attribute of
each submodule that is not a tensor, a submodule or torch's own bookkeeping is recorded as a value:
scalars (None, bool, int, float, complex, str, bytes, enums, torch dtypes, devices and layouts) as
themselves; dicts, lists, tuples and sets by their items, down to _VALUE_LEVELS levels (the
attribute, its items, theirs), the dicts watched for mutation and the lists and sets compared item
by item; a tensor among the items by its record, its address watched like an attribute's; any other
object by its identity and class (an attention processor swapped is seen; a change inside it is
not). A container longer than _LONGEST_WATCHED items, and anything deeper than the levels, is
recorded by identity and length only. A GraphedForward holds one `Watch`, which owns the life cycle:
it arms the native check, and when the check fires (a call returns CHANGED) it takes a new
BakedState (of the modules that read what the check saw change, the rest carried over: an adapter
switch records its LoRA layers again, not the whole model) and compares: equal (an attribute the
forward set, a mode set to what it was) keeps the graphs; a difference drops them, so the next call
captures what the module is now; a hook that moves weights at every call (`weight_moving_hook`)
disables the runner, which then runs eager. It also settles what a capture's forward itself changed,
and lists for graphed._phases what warm-ups put back (`state_to_keep`). An in-place update at the
same address (`load_state_dict`, `copy_`, a LoRA fused into the same tensor) changes nothing here
and keeps replaying, as it computes what eager does.

What it cannot see: a tensor held deeper than a module attribute (an object in an attribute that
holds a tensor, a closure, a global) is baked in unwatched; pass such tensors as keep_alive, or
reset() after changing them, and use verify mode (graphed._verify) to prove a new model safe.
"""

from __future__ import annotations

import collections
import enum
import functools
import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.modules import module as _module_globals

from . import _step_caches as step_caches
from ._native import _graphed_fastcall as _fastcall
from ._observe import first_few
from ._phases import StateToKeep

_log = logging.getLogger("graphed")

# The dicts of a submodule that say what it computes with: its tensors, its children, its hooks
# (a forward hook registered with_kwargs is in _forward_hooks too).
_MODULE_DICTS = ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")
# What an nn.Module keeps in its __dict__ itself: recorded above (tensors, children, hooks, the
# mode) or not read by a forward (backward and state_dict hooks); the rest is the module's own.
_TORCH_ATTRIBUTES = frozenset(vars(torch.nn.Module()))
# Python values that are their own record (immutable, compared by ==); graphed._churn keeps the
# same ones as themselves.
SCALAR_TYPES = (
    type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device,
    torch.layout, torch.memory_format,
)  # fmt: skip
# How deep in a module attribute Python values are recorded and watched (the attribute is level
# 1), and how long a watched container may be (longer: identity and length only). A list or set
# is compared item by item before every call, so its length bounds that cost.
_VALUE_LEVELS = 3
_LONGEST_WATCHED = 64
# accelerate's hooks that move a module's weights at every call (model and sequential offload);
# other accelerate hooks (device_map's AlignDevicesHook without offload) only move inputs.
_OFFLOAD_HOOKS = ("CpuOffload", "UserCpuOffloadHook")
# The captures the watch may throw away in a row with no replay between: at it, the runner runs
# eager (stats()["disabled_cause"] "recapture_limit") with one warning naming what changed. A
# module that changes what its graphs read at every call (a weight re-assigned per call) would
# otherwise pay a capture per call forever. CUDAGraph Trees cap the same case at 128
# (cudagraph_unexpected_rerecord_limit, conservatively large); graphed's captures run in the
# caller's call, so it stops sooner: 8 captures each thrown away before a single replay is no
# adapter rotation (which replays between switches) and no lazy setup (which settles at once).
RECAPTURE_LIMIT = 8
# States of a module remembered (graphed._baked.States), least recently used forgotten first.
_STATES_KEPT = 64


def _where(path: str) -> str:
    return f"'{path}'" if path else "the module itself"


def _tensor_record(kind: str, tensor: torch.Tensor) -> tuple:
    try:
        address = tensor.data_ptr()
    except RuntimeError:  # a tensor without storage (sparse, a functional wrapper)
        address = None
    return (kind, id(tensor), address, tensor.dtype, tensor.device, tuple(tensor.shape),
            tensor.stride() if tensor.layout == torch.strided else None)  # fmt: skip


def _moves_weights(hook: Any) -> bool:
    """Whether an accelerate hook moves the weights at every call."""
    name = type(hook).__name__
    if name in _OFFLOAD_HOOKS:
        return True
    if name == "AlignDevicesHook":
        return (
            bool(getattr(hook, "offload", False)) or getattr(hook, "weights_map", None) is not None
        )
    return any(_moves_weights(inner) for inner in getattr(hook, "hooks", ()) or ())


class _Reads:
    """What one module's record read: the record's keys, the containers and tensors the native
    watch checks for it (each once, by kind), and its tensors by kind for the warm-ups."""

    __slots__ = ("children", "keys", "kinds", "opaque", "values", "watched")

    def __init__(self) -> None:
        self.children = 0  # the id of the module's `_modules` dict
        self.opaque = False  # a container recorded by identity and length only (not watched)
        self.keys: list[str] = []
        self.watched: dict[str, dict[int, Any]] = {"dict": {}, "tensor": {}, "sequence": {}}
        self.kinds: list[tuple[str, str, torch.Tensor]] = []
        # Each attribute value that is a container, by id: (the value, its record, what its record
        # had the watch check), so that the module recorded again reuses it while none changed.
        self.values: dict[int, tuple[Any, Any, _Reads]] = {}


# The path of the pseudo-module that reads torch's global forward hooks.
_GLOBAL_PATH = "<global forward hooks>"


class BakedState:
    """What a module's graphs bake in (see the module docstring), by dotted path: recorded whole,
    or again from `previous` where `changed` (what the native watch saw change since `previous`
    was armed: CallState.watch_changes) says: only the modules that read a changed container or
    tensor are recorded again (an adapter switch touches its LoRA layers, not the 180 other
    modules of a DiT; torch's global hooks are recorded again every time), unless a change is
    structural (a submodule added or removed, a module's children replaced whole), which records
    the whole module again.
    `changed_keys` names the records that may differ from `previous` (None: any). What the native
    watch cannot see change is carried over from `previous`, as the watch itself does not fire for
    it: a tensor's shape or strides changed in place over the same storage (`unsqueeze_`, `t_`),
    an object's class swapped."""

    def __init__(
        self,
        module: torch.nn.Module,
        previous: BakedState | None = None,
        changed: list | None = None,
    ) -> None:
        self.delta: dict[str, Any] | None = None  # the records that differ from a base (States)
        self.changed_keys: dict[str, None] | None = None
        self.recorded_paths: list[str] | None = None  # None: the whole module
        self._derived_from: weakref.ref | None = None
        # What the records of values may be reused from: the previous record's, less what changed.
        self._reusable: dict[str, _Reads] = {}
        self._changed_ids = set() if changed is None else {id(item) for item in changed}
        paths = (
            None
            if previous is None or changed is None
            else previous._paths_reading(self._changed_ids)
        )
        if paths is not None:
            if not self._record_again(module, previous, paths | {_GLOBAL_PATH}):
                paths = None  # a module's children were replaced whole
        if paths is None:
            self.changed_keys = self.recorded_paths = self._derived_from = None
            self._record_whole(module)
        del self._reusable, self._changed_ids

    # -- recording ---------------------------------------------------------------------------

    def _record_whole(self, module: torch.nn.Module) -> None:
        self.records: dict[str, tuple] = {}
        self.modules: dict[str, _Reads] = {}
        self.watched: dict[str, dict[int, Any]] = {"dict": {}, "tensor": {}, "sequence": {}}
        self.readers: dict[int, tuple[str, ...]] = {}
        self.structural: set[int] = set()
        self._record_globals()
        for path, submodule in module.named_modules():
            self._record_module(path, submodule)

    def _record_again(self, module: torch.nn.Module, previous: BakedState, paths: set) -> bool:
        """Records `paths` again over a copy of `previous`; False (and a half-made record) when a
        module recorded again holds another `_modules` dict than before (its children were
        replaced whole, which no mutation of the old dict said)."""
        self.records = dict(previous.records)
        self.modules = dict(previous.modules)
        self.watched = {kind: dict(items) for kind, items in previous.watched.items()}
        self.readers = dict(previous.readers)
        self.structural = previous.structural
        self._derived_from = weakref.ref(previous)
        self.recorded_paths = [path for path in self.modules if path in paths]  # tree order
        changed: dict[str, None] = {}
        leaving: dict[int, set[str]] = {}  # by what they read: the paths recorded again
        for path in self.recorded_paths:
            old = self.modules[path]  # replaced in place: the modules keep their order
            for key in old.keys:
                changed[key] = None
                self.records.pop(key, None)  # a key a module set twice is gone after the first
            for items in old.watched.values():
                for ident in items:
                    leaving.setdefault(ident, set()).add(path)
        for ident, gone in leaving.items():  # once per thing read, however many modules read it
            left = tuple(reader for reader in self.readers.get(ident, ()) if reader not in gone)
            if left:
                self.readers[ident] = left
            else:
                self.readers.pop(ident, None)
                for watched in self.watched.values():
                    watched.pop(ident, None)
        for path in self.recorded_paths:
            self._reusable = previous.modules[path].values
            if path == _GLOBAL_PATH:  # torch's global hook dicts, re-bound or not
                self._record_globals()
            else:
                submodule = module.get_submodule(path)
                self._record_module(path, submodule)
                if id(vars(submodule).get("_modules")) != previous.modules[path].children:
                    return False
            changed.update(dict.fromkeys(self.modules[path].keys))
        self.changed_keys = changed
        return True

    def _paths_reading(self, changed_ids: set[int]) -> set[str] | None:
        """The module paths whose records read what changed (by id); None when a change is
        structural."""
        if not changed_ids.isdisjoint(self.structural):
            return None
        paths: set[str] = set()
        for ident in changed_ids:
            paths.update(self.readers.get(ident, ()))
        return paths

    def _record_globals(self) -> None:
        reads = self.modules[_GLOBAL_PATH] = _Reads()
        hooks = [getattr(_module_globals, name) for name in _GLOBAL_HOOKS]
        for dicts in hooks:  # recorded again with every change (_record_again), not structural
            self._watch(reads, "dict", dicts)
        self._set(reads, _GLOBAL_PATH, tuple(tuple(map(id, each.values())) for each in hooks))
        self._remember(_GLOBAL_PATH, reads)

    def _record_module(self, path: str, submodule: torch.nn.Module) -> None:
        reads = _Reads()
        attributes = vars(submodule)
        self._watch(reads, "dict", attributes)
        for name in _MODULE_DICTS:
            if name in attributes:
                self._watch(reads, "dict", attributes[name])
        reads.children = id(attributes.get("_modules"))
        self.structural.add(reads.children)
        override = attributes.get("forward")
        self._set(reads, path or "<module>", (
            "module", id(submodule), type(submodule), submodule.training,
            tuple(map(id, submodule._forward_hooks.values())),
            tuple(map(id, submodule._forward_pre_hooks.values())),
            None if override is None else id(override),
        ))  # fmt: skip
        prefix = f"{path}." if path else ""
        # One pass over the module's own attributes: tensors, and Python values.
        attribute_tensors, values = [], []
        for name, value in attributes.items():
            if name in _TORCH_ATTRIBUTES:
                continue
            (attribute_tensors if isinstance(value, torch.Tensor) else values).append((name, value))
        for kind, tensors in (
            ("parameter", submodule._parameters.items()),
            ("buffer", submodule._buffers.items()),
            ("attribute", attribute_tensors),
        ):
            for name, tensor in tensors:
                key = prefix + name
                if tensor is None:
                    self._set(reads, key, (kind, None))
                    continue
                self._set(reads, key, _tensor_record(kind, tensor))
                self._watch(reads, "tensor", tensor)
                reads.kinds.append((kind, key, tensor))
        for name, value in values:
            self._set(reads, prefix + name, ("value", self._attribute_value(reads, value)))
        self._remember(path, reads)

    def _attribute_value(self, reads: _Reads, value: Any) -> Any:
        """The record of a module attribute's Python value; a container's is the previous
        record's when neither it nor anything its record read changed (an adapter switch
        re-assigns a LoRA layer's active adapters, not its dozen dicts of per-adapter values)."""
        if not isinstance(value, _CONTAINERS):
            return self._value_record(reads, value, 1)
        reused = self._reusable.get(id(value))
        if reused is not None and reused[0] is value:
            part = reused[2]
            # Reused only where the watch covers all of it: a container recorded by identity and
            # length is recorded again, as a whole record would.
            if part.opaque or any(ident in self._changed_ids for items in part.watched.values()
                                  for ident in items):  # fmt: skip
                reused = None
            else:
                record = reused[1]
        if reused is None:
            part = _Reads()
            record = self._value_record(part, value, 1)
        for kind, items in part.watched.items():
            reads.watched[kind].update(items)
        reads.values[id(value)] = (value, record, part)
        return record

    def _set(self, reads: _Reads, key: str, record: Any) -> None:
        self.records[key] = record
        reads.keys.append(key)

    @staticmethod
    def _watch(reads: _Reads, kind: str, item: Any) -> None:
        """Adds `item` to what the watch checks for this module (once)."""
        reads.watched[kind][id(item)] = item

    def _remember(self, path: str, reads: _Reads) -> None:
        """The module's reads, and it among the readers of each thing it reads."""
        self.modules[path] = reads
        for kind, items in reads.watched.items():
            watched = self.watched[kind]
            for ident, item in items.items():
                watched[ident] = item
                self.readers[ident] = (*self.readers.get(ident, ()), path)

    def _value_record(self, reads: _Reads, value: Any, level: int) -> Any:
        """A Python value's record (see "Python values" in the module docstring); the containers
        it reaches are added to what the native watch checks for the module."""
        if isinstance(value, SCALAR_TYPES):
            return value
        if isinstance(value, torch.Tensor):
            self._watch(reads, "tensor", value)  # its address is watched like an attribute's
            return _tensor_record("item", value)
        kind = type(value)
        if not isinstance(value, _CONTAINERS):
            return ("object", kind, id(value))
        if level > _VALUE_LEVELS or len(value) > _LONGEST_WATCHED:
            reads.opaque = True
            return ("container", kind, id(value), len(value))
        deeper = level + 1
        if isinstance(value, dict):
            self._watch(reads, "dict", value)
            return (kind, tuple((self._value_record(reads, key, deeper),
                                 self._value_record(reads, item, deeper))
                                for key, item in value.items()))  # fmt: skip
        if isinstance(value, (list, set)):
            self._watch(reads, "sequence", value)
        items = tuple(self._value_record(reads, item, deeper) for item in value)
        return (kind, frozenset(items) if isinstance(value, (set, frozenset)) else items)

    # -- what the native watch checks, and the warm-ups put back ------------------------------

    @property
    def dicts(self) -> list[dict]:
        return list(self.watched["dict"].values())

    @property
    def tensors(self) -> list[torch.Tensor]:
        return list(self.watched["tensor"].values())

    @property
    def sequences(self) -> list[list | set]:
        return list(self.watched["sequence"].values())

    @property
    def by_kind(self) -> dict[str, list[tuple[str, torch.Tensor]]]:
        """The module's tensors by kind, for what a capture's warm-ups put back (graphed._phases):
        each tensor once, under the first path it is found at, as module.named_parameters()
        does."""
        found: dict[str, list[tuple[str, torch.Tensor]]] = {
            "parameter": [],
            "buffer": [],
            "attribute": [],
        }
        seen: set[int] = set()
        for reads in self.modules.values():
            for kind, key, tensor in reads.kinds:
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    found[kind].append((key, tensor))
        return found

    # -- comparing ---------------------------------------------------------------------------

    def keys_changed_since(self, before: BakedState) -> Any:
        """The record keys that may differ from `before`'s: those recorded again when this record
        was made from it, else every key of both."""
        derived = self._derived_from
        if derived is not None and derived() is before and self.changed_keys is not None:
            return self.changed_keys
        return {**before.records, **self.records}

    def differences(self, other: BakedState, limit: int = 4) -> list[str]:
        """The dotted paths whose record differs between two states (at most `limit`, then a
        count of the rest), in the module's order."""
        changed = [
            path
            for path in other.keys_changed_since(self)
            if self.records.get(path) != other.records.get(path)
        ]
        if len(changed) > limit:
            changed = [*changed[:limit], f"and {len(changed) - limit} more"]
        return changed


def _modules_at(
    module: torch.nn.Module, paths: list[str] | None
) -> list[tuple[str, torch.nn.Module]]:
    """(path, submodule) of `module`'s tree, or of those of `paths` only."""
    if paths is None:
        return list(module.named_modules())
    return [(path, module.get_submodule(path)) for path in paths if path != _GLOBAL_PATH]


def weight_moving_hook(
    modules: Iterable[tuple[str, torch.nn.Module]],
) -> tuple[str, str] | None:
    """The first hook among `modules` ((path, submodule), as named_modules() gives them) that
    moves its weights at every call (accelerate's model or sequential CPU offload, diffusers'
    group offloading) or may change what a forward computes from call to call (any other
    diffusers hook that is not a step cache graphed goes beneath: graphed._step_caches), as
    (what it is, what to do); None when there is none."""
    for path, submodule in modules:
        attributes = vars(submodule)
        hook = attributes.get("_hf_hook")
        if hook is not None and _moves_weights(hook):
            name = type(hook).__name__
            return f"accelerate's {name} hook on {_where(path)} moves its weights at every call", (
                _OFFLOAD_ADVICE
            )
        hooks = step_caches.hooks_of(submodule)
        if not hooks or step_caches.is_cached(submodule):
            continue
        names = ", ".join(hooks)
        if any(type(each).__module__.endswith(".group_offloading") for each in hooks.values()):
            return f"diffusers' {names} hook(s) on {_where(path)} move its weights", _OFFLOAD_ADVICE
        return (
            f"diffusers' {names} hook(s) on {_where(path)} may change what the forward computes "
            "from call to call, and graphed cannot graph beneath them",
            "To graph this module remove those hooks (its _diffusers_hook.remove_hook(name)), or "
            "graph the modules below them instead",
        )
    return None


_OFFLOAD_ADVICE = (
    "To graph this module keep it on the device (for a diffusers pipeline, pipe.to(device) "
    "instead of enable_model_cpu_offload, enable_sequential_cpu_offload or "
    "enable_group_offload), and wrap it after removing the hooks"
)


_swaps_counted = False
_swaps_lock = threading.Lock()


def count_swaps() -> None:
    """Wraps torch.utils.swap_tensors (once, when the first watch is armed) so that each swap is
    counted for the native watch, which then fires once: a swap gives a parameter's Python object
    another TensorImpl (nn.Module._apply does so for some conversions, load_state_dict under
    torch.__future__'s swap setting) without touching any dict the watch sees, and the TensorImpl
    the watch read may then be freed. torch's own callers look the function up on torch.utils at
    each call; code that imported it by name before keeps the unwrapped one."""
    global _swaps_counted
    with _swaps_lock:
        if _swaps_counted:
            return
        swap = torch.utils.swap_tensors

        @functools.wraps(swap)
        def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
            try:
                return swap(t1, t2)
            finally:
                _fastcall.note_swap()

        torch.utils.swap_tensors = swap_tensors
        _swaps_counted = True


def _tensor_replaced(before: BakedState, now: BakedState) -> bool:
    """Whether a parameter, buffer or tensor attribute at a path both records hold differs (a
    tensor re-assigned, moved, retyped); an adapter added or removed adds or removes paths."""
    for path in now.keys_changed_since(before):
        record, old = now.records.get(path), before.records.get(path)
        if old is not None and record is not None and old != record and record[0] in _TENSOR_KINDS:
            return True
    return False


_TENSOR_KINDS = ("parameter", "buffer", "attribute")
_CONTAINERS = (dict, list, tuple, set, frozenset)
_ABSENT = ("absent",)  # a record key a state does not have


class States:
    """The states of what a runner's graphs read besides the call (its module's records:
    parameters and buffers by identity and address, Python values, hooks, modes), each with the
    tag the core keys its graphs by (gf_runner_select_state), so that a module switched back to a
    state seen before (an adapter rotation: set_adapters, disable_lora, enable_lora) replays the
    graphs of that state at once instead of capturing again. Two states are the same only when
    every record is equal; a tag is never given to another state (the graphs keyed by it may
    still be resident), and the least recently used of more than _STATES_KEPT states is
    forgotten (coming back, it is a new state)."""

    def __init__(self) -> None:
        self._tags: collections.OrderedDict[Any, int] = collections.OrderedDict()
        self._next = 1
        # The records of the first state: every state is told by how it differs from them, so
        # that a switch compares the records it changed, not the whole module's.
        self._base: dict[str, Any] | None = None

    def _delta(self, before: BakedState, now: BakedState) -> dict[str, Any]:
        """The records where `now` differs from the first state (_ABSENT where it has none)."""
        base = self._base
        if before.delta is not None and now.keys_changed_since(before) is now.changed_keys:
            delta = dict(before.delta)
            keys = now.changed_keys
        else:
            delta, keys = {}, {**base, **now.records}
        for key in keys:
            record = now.records.get(key, _ABSENT)
            if record == base.get(key, _ABSENT):
                delta.pop(key, None)
            else:
                delta[key] = record
        now.delta = delta
        return delta

    def select(self, before: BakedState, now: BakedState) -> tuple[int, bool] | None:
        """The tag of the state `now` is in and whether it was seen before, `before` (the state
        the graphs so far were captured in) remembered first as the first state (tag 0); None
        when a record cannot be compared as a whole (the graphs are dropped instead)."""
        try:
            if not self._tags:
                self._base, before.delta = before.records, {}
                self._tags[frozenset()] = 0
            state = frozenset(self._delta(before, now).items())
            tag = self._tags.get(state)
        except TypeError:  # a record that cannot be hashed
            return None
        if tag is not None:
            self._tags.move_to_end(state)
            return tag, True
        tag, self._next = self._next, self._next + 1
        self._tags[state] = tag
        if len(self._tags) > _STATES_KEPT:
            self._tags.popitem(last=False)
        return tag, False


class Watch:
    """The watch of one GraphedForward's module: arm, check, compare, settle (see the module
    docstring). The check itself is native (the call state's watch, pyext/gf_baked.h); the
    record it compares with is `baked` (None while nothing is watched: a callable that is not an
    nn.Module, or a runner disabled). Methods that act on the runner take it as an argument (it
    answers module, name, stats(), disable(reason, cause) and _drop_graphs()), so the watch holds
    no reference to it."""

    def __init__(self, call_state: Any) -> None:
        self._call_state = call_state
        self.baked: BakedState | None = None
        # The graphs dropped for a change in a row with no replay between (RECAPTURE_LIMIT), and
        # the runner's hits and captures when the last were dropped.
        self._drops_in_a_row = 0
        self._hits_at_drop = -1
        self._captures_at_drop = -1
        self.states = States()

    def arm(self, runner: Any) -> None:
        """Records what the graphs bake in besides their inputs and arms the native check of it;
        a hook that moves the weights at every call disables the runner instead."""
        module = runner.module
        if not isinstance(module, torch.nn.Module) or not runner.stats()["enabled"]:
            self.stop()
            return
        count_swaps()
        baked = self.record(module)
        # Hooks are looked for where the record changed (a hook added sets its module's
        # attributes), or everywhere when it was made whole.
        modules = _modules_at(module, baked.recorded_paths)
        refused = weight_moving_hook(modules)
        # A region of a cached module runs beneath the module's own hooks (graphed._regions).
        own = runner._forward_call is module
        cached = [] if refused else step_caches.cached_modules(modules, own)
        if refused is not None or cached:
            self.stop()
            if refused is not None:
                what, advice = refused
                reason = f"{what}, and a graph replays what its capture saw; calls run eager. "
                # Said once: the disable's own report (graphed._observe) names the reason.
                runner.disable(reason + advice, "watch")
            else:
                eager = step_caches.looked_through(module)
                runner.disable(step_caches.reason(cached, eager), "step_cache")  # in regions
            return
        if self._call_state.watch_fired():
            # A tensor whose address torch will not say (see pyext/gf_baked.h): no watch can
            # hold, and a graph of it cannot be kept right.
            runner.disable(
                "graphed cannot watch the addresses of the module's tensors (a tensor torch will "
                "not give an address for); calls run eager",
                "watch",
            )

    def stop(self) -> None:
        """No check before calls (a disabled runner replays nothing)."""
        self._call_state.unwatch()
        self.baked = None

    def record(self, module: torch.nn.Module) -> BakedState:
        """Records the module as it is now (again only where the check saw a change since the
        last record) and arms the check of it."""
        previous = self.baked
        changed = self._call_state.watch_changes() if previous is not None else None
        self.baked = BakedState(module, previous, changed)
        self._call_state.watch(self.baked.dicts, self.baked.tensors, self.baked.sequences)
        return self.baked

    def follow_change(self, runner: Any) -> None:
        """The check fired (or a module method ran): compares the module with what the graphs
        baked in; when anything they rely on differs, the calls are keyed in the module's new
        state (States): a state seen before replays its graphs, a new one captures, the graphs
        of the others stay resident within max_entries. Where a state cannot be told (a record
        that cannot be compared whole) the graphs are dropped instead."""
        recorded = self.baked
        self.arm(runner)
        if recorded is None or self.baked is None:
            return
        changed = recorded.differences(self.baked)
        if not changed:
            return
        # A tensor replaced at its path (a weight re-assigned, the module moved or retyped): the
        # graphs of every state are dropped, as no state before will come back.
        replaced = _tensor_replaced(recorded, self.baked)
        if replaced:
            self.states = States()
            _fastcall.select_state(runner.runner_id, 0, True)
        selected = None if replaced else self.states.select(recorded, self.baked)
        seen = selected is not None and selected[1]
        if not seen and self._past_recapture_limit(runner):
            self.stop()
            runner.disable(
                f"{', '.join(changed)} changed again before any graph replayed, "
                f"{RECAPTURE_LIMIT} times in a row: a graph replays what its capture read, so "
                "each change cost a capture that never served a call; calls run eager. Change "
                "such state in place (copy_, fill_), or pass what changes per call as a kwarg",
                "recapture_limit",
            )
            return
        what = first_few(changed)
        if selected is None:
            runner._drop_graphs()  # a churn guard that started stays: a change is no new traffic
            _log.info(
                "runner '%s': %s changed since the graphs were captured; they are dropped and "
                "captured again",
                runner.name,
                what,
            )
            return
        _fastcall.select_state(runner.runner_id, selected[0], not seen)
        _log.info(
            "runner '%s': %s changed; %s",
            runner.name,
            what,
            "the module is back in a state its graphs were captured in, which replay"
            if seen
            else "the new state is captured on its first call, the graphs of the states before "
            "stay (within max_entries)",
        )

    def _past_recapture_limit(self, runner: Any) -> bool:
        """Counts one more drop of the graphs; True at RECAPTURE_LIMIT in a row with no replay
        between (the graphs captured before the first of them counted: at most RECAPTURE_LIMIT
        captures serve no call)."""
        stats = runner.stats()
        hits, captures = stats["hits"], stats["captures"]  # hits: calls served by an older graph
        if hits != self._hits_at_drop:
            self._drops_in_a_row = 0
        if captures != self._captures_at_drop:  # a drop after no capture cost none
            self._drops_in_a_row += 1
        self._hits_at_drop, self._captures_at_drop = hits, captures
        return self._drops_in_a_row >= RECAPTURE_LIMIT

    def before_capture(self, module: torch.nn.Module) -> None:
        """Before the capture's forward: the probe or the warm-ups changed what the check sees
        (a lazy setup), so the capture is judged against the module as they left it."""
        if self.baked is not None and self._call_state.watch_fired():
            self.record(module)

    def settle(self, module: torch.nn.Module) -> list[str]:
        """After the forward ran for a capture (or eagerly inside the core): what the graphs
        baked in is the module as the forward left it. Returns what the forward re-assigned of
        what the graphs read (the graphs captured before it read what it replaced: named once
        by the caller). Nothing is recorded again when the check says nothing changed (the usual
        case: two reads)."""
        if not self._call_state.watch_fired():
            return []
        recorded = self.baked
        after = self.record(module)
        return recorded.differences(after) if recorded is not None else []

    def state_to_keep(self, held: tuple, module: torch.nn.Module) -> StateToKeep:
        """What a forward may change besides its inputs, for graphed._phases to put back after
        each warm-up (or name): the module's buffers and its submodules' tensor attributes, the
        call's keep_alive tensors (among `held`), and its parameters, as the record lists them
        (current: the check did not fire, or re-recorded); what the forward re-assigns of the
        module is what the watch sees (rebound)."""
        tensors = [item for item in held if isinstance(item, torch.Tensor)]
        baked = self.baked
        if baked is None:
            return StateToKeep(tensors, [], None)
        restored = [tensor for kind in ("buffer", "attribute") for _, tensor in baked.by_kind[kind]]
        return StateToKeep(
            [*restored, *tensors],
            list(baked.by_kind["parameter"]),
            lambda after_first_run: self._rebound(module, after_first_run),
            baked.tensors,
        )

    def _rebound(self, module: torch.nn.Module, first_run: bool) -> list[str]:
        """The paths of what the forward re-assigned of `module` (a Python attribute, a tensor,
        a value a dict, list or set holds) since the record was made, which is then made again;
        nothing after the first run (a lazy setup) or when the check did not fire (two reads)."""
        if not self._call_state.watch_fired():
            return []
        recorded = self.baked
        after = self.record(module)
        if first_run or recorded is None:
            return []
        return recorded.differences(after, limit=len(after.records))
