"""Diffusers' step caches under graphs: which hooks they are, and where a graph can go beneath them.

`transformer.enable_cache(config)` (FirstBlockCache, TaylorSeer, MagCache,
PyramidAttentionBroadcast, FasterCache, SeaCache) registers hooks on blocks or attention modules
through diffusers' hook registry (`module._diffusers_hook`). Each hook decides per call, in Python,
whether the module computes or returns what it cached: by host state (TaylorSeer's and
PyramidAttentionBroadcast's step counters, MagCache's magnitude ratios), or by reading a device
value with `.item()` (FirstBlockCache; MagCache only while it calibrates).
A graph of a forward that contains such a hook would bake one decision in. So a forward carrying
them is never captured whole: it runs in regions (graphed._regions, disabled_cause "step_cache"),
the hooks run as diffusers wrote them, and each cached module's own forward, the one the hook calls
through its function reference (`fn_ref.original_forward`), is a region graphed beneath the hook.
The rest of the forward is graphed as regions too.
A module compiled in place (diffusers' `compile_repeated_blocks`) that carries a step cache or
holds one below it is the exception: a region beneath the hook would sit inside the compiled
frame, where the compiler, which breaks the graph at the hook, would trace graphed's own code. No
region goes inside such a module (`compiled_around`): its compiled code runs as it does without
graphed, and the disabled_reason names it.

A hook is a step cache by where diffusers defines it (the modules of diffusers.hooks named in
_STEP_CACHE_MODULES); any other diffusers hook (group offloading moves weights, layerwise casting
changes dtypes, an unknown one may change what a module computes) is not gone beneath: the watch
refuses it (graphed._hook_refusals). A cached module is graphed beneath its hooks only
where the bottom of its hook chain is the module's own forward, as diffusers' registry leaves it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ._compiled import compiled_in_place

# The diffusers.hooks modules whose hooks are step caches: a decision per call, in the hook, and
# the module's own forward called through the hook's function reference when it computes.
_STEP_CACHE_MODULES = frozenset(
    {
        "first_block_cache",
        "taylorseer_cache",
        "mag_cache",
        "pyramid_attention_broadcast",
        "faster_cache",
        "sea_cache",
    }
)


def hooks_of(module: torch.nn.Module) -> dict[str, Any]:
    """The diffusers hooks registered on `module` itself, by name ({} for none)."""
    registry = vars(module).get("_diffusers_hook")
    hooks = getattr(registry, "hooks", None) if registry is not None else None
    return dict(hooks) if isinstance(hooks, dict) else {}


def is_step_cache(hook: Any) -> bool:
    """Whether a diffusers hook is one of the step caches graphed goes beneath."""
    package, _, name = type(hook).__module__.rpartition(".")
    return package == "diffusers.hooks" and name in _STEP_CACHE_MODULES


def own_forward_reference(module: torch.nn.Module) -> tuple[Any, str] | None:
    """Where the module's hook chain holds the module's own forward: the first hook's function
    reference and its attribute ("original_forward" for a hook with its own new_forward, else
    "forward"), or None when the bottom of the chain is something else (another wrapper)."""
    registry = vars(module).get("_diffusers_hook")
    references = getattr(registry, "_fn_refs", None) if registry is not None else None
    if not references:
        return None
    bottom = references[0]
    attribute = "original_forward" if getattr(bottom, "original_forward", None) else "forward"
    held = getattr(bottom, attribute, None)
    own = getattr(type(module), "forward", None)
    if getattr(held, "__self__", None) is module and getattr(held, "__func__", None) is own:
        return bottom, attribute
    if getattr(held, "module", None) is module and getattr(held, "beneath_hooks", False):
        return bottom, attribute  # a region of graphed's is installed there already
    return None


def is_cached(module: torch.nn.Module) -> bool:
    """Whether `module` carries step-cache hooks only, with its own forward reachable beneath."""
    hooks = hooks_of(module)
    return (
        bool(hooks)
        and all(is_step_cache(hook) for hook in hooks.values())
        and own_forward_reference(module) is not None
    )


def cached_modules(
    modules: torch.nn.Module | Iterable[tuple[str, torch.nn.Module]], own: bool = True
) -> list[tuple[str, str]]:
    """The (path, hook names) of every module of a tree (a module, or its (path, submodule)
    pairs) whose hooks are all step caches graphed can go beneath, the top one ("") only when
    `own`, in the order given."""
    pairs = modules.named_modules() if isinstance(modules, torch.nn.Module) else modules
    return [
        (path, ", ".join(hooks_of(submodule)))
        for path, submodule in pairs
        if (own or path) and is_cached(submodule)
    ]


def _above_cached_paths(module: torch.nn.Module) -> dict[int, tuple[str, torch.nn.Module]]:
    """The modules under `module` (not itself) that have a cached module below them, by id: their
    path and the module, in tree order."""
    found: dict[int, tuple[str, torch.nn.Module]] = {}
    for path, submodule in module.named_modules():
        if not path or not is_cached(submodule):
            continue
        parent, names = module, path.split(".")[:-1]
        for depth, name in enumerate(names):
            parent = getattr(parent, name)
            found.setdefault(id(parent), (".".join(names[: depth + 1]), parent))
    return found


def above_cached(module: torch.nn.Module) -> set[int]:
    """The ids of the modules under `module` that have a cached module below them: their forward
    contains a hook's decision, so they are never regions themselves (graphed._regions descends
    into them)."""
    return set(_above_cached_paths(module))


def compiled_around(module: torch.nn.Module) -> dict[int, str]:
    """The modules of `module`'s tree compiled in place that carry a step cache or have one below
    them, by id: their path ("" for `module` itself, which then is the only one), outermost only,
    in tree order. graphed._regions places no region inside them (see the module docstring)."""
    if compiled_in_place(module) and cached_modules(module):
        return {id(module): ""}
    above = _above_cached_paths(module)
    found: dict[int, str] = {}
    for path, submodule in module.named_modules():
        if not path or any(path.startswith(f"{outer}.") for outer in found.values()):
            continue  # the module itself, or inside a compiled one
        if (id(submodule) in above or is_cached(submodule)) and compiled_in_place(submodule):
            found[id(submodule)] = path
    return found


def looked_through(module: torch.nn.Module, compiled: list[str] | None = None) -> list[str]:
    """The paths of the modules under `module` whose own forward runs eagerly at every call
    because a cached module is below them (a block around a cached attention module), containers
    (nn.ModuleList, nn.ModuleDict) and compiled modules (`compiled_around`'s paths, `compiled`
    when the caller has them) and what they hold left out."""
    if compiled is None:
        compiled = list(compiled_around(module).values())
    if compiled == [""]:
        return []  # the whole forward runs compiled
    return [
        path
        for path, submodule in _above_cached_paths(module).values()
        if type(submodule).forward is not torch.nn.Module.forward
        and not is_cached(submodule)
        and not any(path == outer or path.startswith(f"{outer}.") for outer in compiled)
    ]


# The most a disabled_reason holds (the core's GF_REASON_CAPACITY, ops/gf_runner_internal.h, less
# its terminating zero); a longer one is cut there.
_REASON_BYTES = 511


def reason(
    cached: list[tuple[str, str]],
    eager: list[str] | tuple[str, ...] = (),
    compiled: list[str] | tuple[str, ...] = (),
) -> str:
    """The disabled_reason of a runner whose forward carries step caches (`cached_modules`);
    `eager` names the modules whose own forward runs eagerly around them (`looked_through`),
    `compiled` the compiled modules that hold them (`compiled_around`). Two hooks are named, or
    one when other modules are named too, and only counts where the names would not fit the
    core's reason."""
    for named in (True, False):
        said = _reason(cached, eager, compiled, named)
        if len(said.encode()) <= _REASON_BYTES:
            break
    return said


def _reason(
    cached: list[tuple[str, str]],
    eager: list[str] | tuple[str, ...],
    compiled: list[str] | tuple[str, ...],
    named: bool,
) -> str:
    shown_count = (1 if eager or compiled else 2) if named else 0
    shown = ", ".join(f"{hooks} on '{path}'" for path, hooks in cached[:shown_count])
    more = f" and {len(cached) - shown_count} more" if len(cached) > shown_count else ""
    if not shown:
        shown, more = f"on {_modules(len(cached))}", ""
    if list(compiled) == [""]:
        return (
            f"the forward carries diffusers' step cache hooks ({shown}{more}), which decide at "
            "every call whether a module computes, and the module is compiled around them "
            "(torch.compile), where graphed cannot go beneath them: it runs compiled, without "
            "graphs. Compile its repeated blocks instead (compile_repeated_blocks) to have the "
            "modules around them graphed, or leave the cache off to graph it whole"
        )
    said = (
        f"the forward carries diffusers' step cache hooks ({shown}{more}), which decide at every "
        "call whether a module computes, so it runs in regions: the hooks run as diffusers wrote "
        "them, each cached module's own forward graphed beneath its hook"
    )
    if compiled:
        said += (
            f"; {_some(compiled, 'compiled ', 'holding them', named)} run compiled, without "
            "graphs beneath their hooks"
        )
    if not eager:
        return said
    return (
        f"{said}; {_some(eager, '', 'around them', named)} run their own Python eagerly, so "
        "on a launch-bound model graphs without the cache may be faster (docs/api.md, 'Step "
        "caches')"
    )


def _some(paths: list[str] | tuple[str, ...], kind: str, relation: str, named: bool) -> str:
    """ "the <kind>modules <relation> ('first' and N more)" when `named`, else with their count."""
    if not named:
        return f"the {_modules(len(paths), kind)} {relation}"
    more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
    return f"the {kind}modules {relation} ('{paths[0]}'{more})"


def _modules(count: int, kind: str = "") -> str:
    return f"{count} {kind}module" if count == 1 else f"{count} {kind}modules"
