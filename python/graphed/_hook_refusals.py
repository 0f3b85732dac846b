"""The hooks a graph cannot go beneath, refused when a GraphedForward's watch is armed.

Beside graphed._step_caches, which says which diffusers hooks graphed goes beneath: a hook that
moves its module's weights at every call (accelerate's model or sequential CPU offload, diffusers'
group offloading) or any other diffusers hook, which may change what a forward computes from call
to call, would leave a graph replaying what its capture saw; the runner is disabled (cause
"watch") and calls run eager. A forward that carries step caches only runs in regions instead
(cause "step_cache"), each cached module graphed beneath its hook. graphed._watch asks
(`refusal`) each time it arms, of the modules its record made again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from . import _step_caches as step_caches

# accelerate's hooks that move a module's weights at every call (model and sequential offload);
# other accelerate hooks (device_map's AlignDevicesHook without offload) only move inputs.
_OFFLOAD_HOOKS = ("CpuOffload", "UserCpuOffloadHook")
_OFFLOAD_ADVICE = (
    "To graph this module keep it on the device (for a diffusers pipeline, pipe.to(device) "
    "instead of enable_model_cpu_offload, enable_sequential_cpu_offload or "
    "enable_group_offload), and wrap it after removing the hooks"
)


def refusal(
    module: torch.nn.Module, modules: list[tuple[str, torch.nn.Module]], own: bool
) -> tuple[str, str] | None:
    """Why `module`'s runner cannot graph its forward whole, by the hooks among `modules` ((path,
    submodule) of its tree): (disabled_reason, disabled_cause), or None when nothing is refused.
    `own`: whether the runner's forward is the module's own (its top module may then be a
    cached one)."""
    refused = _refused_hook(modules)
    if refused is not None:
        what, advice = refused
        reason = f"{what}, and a graph replays what its capture saw; calls run eager. "
        return reason + advice, "watch"
    # A region of a cached module runs beneath the module's own hooks (graphed._regions).
    cached = step_caches.cached_modules(modules, own)
    if cached:
        compiled = list(step_caches.compiled_around(module).values())
        eager = step_caches.looked_through(module, compiled)
        return step_caches.reason(cached, eager, compiled), "step_cache"  # in regions
    return None


def _refused_hook(
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


def _where(path: str) -> str:
    return f"'{path}'" if path else "the module itself"


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
