"""What a GraphedForward's graphs baked in besides their inputs: the record the watch compares.

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
(`torch.utils.swap_tensors`, which changes no dict) is counted for it (graphed._watch.count_swaps).

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
recorded by identity and length only. What a record is for (arming the native check, comparing
when it fires, keying the module's states, refusing hooks) is graphed._watch's: this file only
records and compares. An in-place update at the same address (`load_state_dict`, `copy_`, a LoRA
fused into the same tensor) changes no record and keeps replaying, as it computes what eager does.

What it cannot see: a tensor held deeper than a module attribute (an object in an attribute that
holds a tensor, a closure, a global) is baked in unwatched; pass such tensors as keep_alive, or
reset() after changing them, and use verify mode (graphed._verify) to prove a new model safe.
"""

from __future__ import annotations

import enum
import weakref
from typing import Any

import torch
from torch.nn.modules import module as _module_globals

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
# The kinds of record that hold a tensor at a path, and the Python values recorded by their items.
_TENSOR_KINDS = ("parameter", "buffer", "attribute")
_CONTAINERS = (dict, list, tuple, set, frozenset)


def _tensor_record(kind: str, tensor: torch.Tensor) -> tuple:
    try:
        address = tensor.data_ptr()
    except RuntimeError:  # a tensor without storage (sparse, a functional wrapper)
        address = None
    return (kind, id(tensor), address, tensor.dtype, tensor.device, tuple(tensor.shape),
            tensor.stride() if tensor.layout == torch.strided else None)  # fmt: skip


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

    # -- what the native watch checks, the warm-ups put back, the hooks are looked for in ----

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

    def recorded_modules(self, module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
        """(path, submodule) of `module`'s tree, or of the paths this record recorded again only
        (recorded_paths)."""
        paths = self.recorded_paths
        if paths is None:
            return list(module.named_modules())
        return [(path, module.get_submodule(path)) for path in paths if path != _GLOBAL_PATH]

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

    def tensor_replaced_since(self, before: BakedState) -> bool:
        """Whether a parameter, buffer or tensor attribute at a path both records hold differs (a
        tensor re-assigned, moved, retyped); an adapter added or removed adds or removes paths."""
        for path in self.keys_changed_since(before):
            record, old = self.records.get(path), before.records.get(path)
            if (
                old is not None
                and record is not None
                and old != record
                and record[0] in _TENSOR_KINDS
            ):
                return True
        return False
