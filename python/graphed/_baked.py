"""What a GraphedForward's graphs baked in besides their inputs, and whether it still holds.

A captured graph reads the module's parameters, buffers and tensor attributes at the addresses
its capture saw, and replays the submodules, hooks and modes the capture ran. Serving code
changes those between calls: a LoRA loader or a quantiser re-assigns a parameter
(`m.weight = nn.Parameter(w)`), a weight loader swaps `.data`, a user replaces a submodule or
adds a hook, an offload hook moves every weight at every call. A replay after any of those would
compute with what is gone, silently.

`BakedState(module)` records it all, by dotted path: every submodule (its identity, class, mode,
hooks and an instance `forward` override), every parameter, buffer and tensor attribute (identity,
data address, dtype, device, shape, strides), and torch's global forward hooks. It also lists what
the native watch checks before every call (pyext/gf_baked.h): the dicts that hold all of that and
the tensors' addresses. When the watch fires, GraphedForward takes a new BakedState and compares:
equal (an attribute the forward set, a mode set to what it was) keeps the graphs; a difference
drops them, so the next call captures what the module is now; a hook that moves weights at every
call (`weight_moving_hook`) disables the runner, which then runs eager. An in-place update at the
same address (`load_state_dict`, `copy_`, a LoRA fused into the same tensor) changes nothing here
and keeps replaying, as it computes what eager does.

What it cannot see: a tensor held deeper than a module attribute (an object in an attribute that
holds a tensor, a closure, a global) is baked in unwatched; pass such tensors as keep_alive, or
reset() after changing them, and use verify mode (graphed._verify) to prove a new model safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.modules import module as _module_globals

# The dicts of a submodule that say what it computes with: its tensors, its children, its hooks
# (a forward hook registered with_kwargs is in _forward_hooks too).
_MODULE_DICTS = ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")
# accelerate's hooks that move a module's weights at every call (model and sequential offload);
# other accelerate hooks (device_map's AlignDevicesHook without offload) only move inputs.
_OFFLOAD_HOOKS = ("CpuOffload", "UserCpuOffloadHook")


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


class BakedState:
    """What a module's graphs bake in (see the module docstring), by dotted path."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.records: dict[str, tuple] = {}
        self.dicts: list[dict] = [getattr(_module_globals, name) for name in _GLOBAL_HOOKS]
        self.tensors: list[torch.Tensor] = []
        # The same walk, by kind, for what a capture's warm-ups put back (graphed._phases): each
        # tensor once, under the first path it is found at, as module.named_parameters() does.
        self.by_kind: dict[str, list[tuple[str, torch.Tensor]]] = {
            "parameter": [],
            "buffer": [],
            "attribute": [],
        }
        self.modules: list[tuple[str, torch.nn.Module]] = []
        self._seen: set[int] = set()
        self.records["<global forward hooks>"] = tuple(
            tuple(map(id, hooks.values())) for hooks in self.dicts
        )
        for path, submodule in module.named_modules():
            self._record_module(path, submodule)

    def _record_module(self, path: str, submodule: torch.nn.Module) -> None:
        self.modules.append((path, submodule))
        attributes = vars(submodule)
        self.dicts.append(attributes)
        self.dicts.extend(attributes[name] for name in _MODULE_DICTS if name in attributes)
        override = attributes.get("forward")
        self.records[path or "<module>"] = (
            "module", id(submodule), type(submodule), submodule.training,
            tuple(map(id, submodule._forward_hooks.values())),
            tuple(map(id, submodule._forward_pre_hooks.values())),
            None if override is None else id(override),
        )  # fmt: skip
        prefix = f"{path}." if path else ""
        for kind, tensors in self._tensors_of(submodule, attributes):
            for name, tensor in tensors:
                key = prefix + name
                if tensor is None:
                    self.records[key] = (kind, None)
                    continue
                self.records[key] = _tensor_record(kind, tensor)
                self.tensors.append(tensor)
                if id(tensor) not in self._seen:
                    self._seen.add(id(tensor))
                    self.by_kind[kind].append((key, tensor))

    @staticmethod
    def _tensors_of(submodule: torch.nn.Module, attributes: dict) -> Iterator[tuple[str, Any]]:
        yield "parameter", submodule._parameters.items()
        yield "buffer", submodule._buffers.items()
        yield (
            "attribute",
            [
                (name, value)
                for name, value in attributes.items()
                if isinstance(value, torch.Tensor)
            ],
        )

    def differences(self, other: BakedState, limit: int = 4) -> list[str]:
        """The dotted paths whose record differs between two states (at most `limit`, then a
        count of the rest), in the module's order."""
        changed = [
            path
            for path in {**self.records, **other.records}
            if self.records.get(path) != other.records.get(path)
        ]
        if len(changed) > limit:
            changed = [*changed[:limit], f"and {len(changed) - limit} more"]
        return changed


def weight_moving_hook(module: torch.nn.Module) -> str | None:
    """A sentence naming the first hook that moves the module's weights at every call (accelerate's
    model or sequential CPU offload) or changes what a forward computes from call to call
    (diffusers' hook registry: group offloading, caches that skip blocks by step), or None."""
    for path, submodule in module.named_modules():
        attributes = vars(submodule)
        hook = attributes.get("_hf_hook")
        if hook is not None and _moves_weights(hook):
            name = type(hook).__name__
            return f"accelerate's {name} hook on {_where(path)} moves its weights at every call"
        registry = attributes.get("_diffusers_hook")
        names = list(getattr(registry, "hooks", {}) or {}) if registry is not None else []
        if names:
            return (
                f"diffusers' {', '.join(names)} hook(s) on {_where(path)} change what the forward "
                "computes or where its weights are from call to call"
            )
    return None
