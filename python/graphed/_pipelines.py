"""graph_pipeline: graphed dropped into a diffusers pipeline (or any object holding nn.Module
components) without replacing the components themselves.

Assigning `pipe.transformer = GraphedForward(pipe.transformer, ...)` runs, but a GraphedForward is
not an nn.Module, and DiffusionPipeline looks at its components through isinstance(m, nn.Module):
`pipe.to(dtype)` skips it (the transformer keeps its dtype while the rest moves), `pipe.dtype` and
`pipe.device` answer from the other components, the config (model_index.json) records
graphed's class instead of the model's, and save_pretrained leaves the transformer out. So here
the component stays in place and only its call goes through a GraphedForward: the slot
nn.Module.__call__ consults first (`_compiled_call_impl`, the one `nn.Module.compile()` fills)
gets a small router that sends an outside call to the GraphedForward and the GraphedForward's own
calls of the module (probe, warm-up, capture, eager) to the module's ordinary call, hooks and all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ._compiled import compile_options
from ._forward import GraphedForward
from ._reentry import ReentryDepth

__all__ = ["graph_pipeline", "ungraph_pipeline"]


class _GraphedCall:
    """What a graphed component's __call__ runs: the GraphedForward for a call from outside, the
    call the module had before (its compiled one, or its plain _call_impl) for a call the
    GraphedForward itself makes while it runs the forward (on this thread)."""

    def __init__(self, module: torch.nn.Module, runner: GraphedForward, compiled: Any) -> None:
        self.runner = runner
        # The compiled call the module had (None: it was not compiled), which graphed._compiled
        # looks through this router to see.
        self.compiled_call = compiled
        self._inner = compiled if compiled is not None else module._call_impl
        self._inside = ReentryDepth()  # the GraphedForward's runs on this thread

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._inside.level:
            return self._inner(*args, **kwargs)
        with self._inside:
            return self.runner(*args, **kwargs)


def _device_of(module: torch.nn.Module) -> torch.device:
    """The device a component computes on: its `device` (diffusers' ModelMixin, transformers'
    PreTrainedModel), else its first parameter's or buffer's."""
    device = getattr(module, "device", None)
    if isinstance(device, torch.device):
        return device
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    raise ValueError("graphed: the component has neither parameters nor buffers; pass device=")


def _module_components(pipe: Any) -> list[str]:
    """The names of `pipe`'s nn.Module components: a diffusers pipeline's registered
    `components`, else the object's own attributes."""
    components = getattr(pipe, "components", None)
    if not isinstance(components, dict):
        components = getattr(pipe, "__dict__", {})
    return [
        name
        for name, value in components.items()
        if isinstance(value, torch.nn.Module) and not name.startswith("_")
    ]


def _not_a_module(pipe: Any, name: str, module: Any) -> TypeError:
    """The refusal of component `name`: what it is on this pipeline, and what could be graphed."""
    pipeline = type(pipe).__name__
    if module is None:
        what = (
            f"the pipeline has no {name!r} component ({pipeline}.{name} is None)"
            if hasattr(pipe, name)
            else f"the pipeline has no {name!r} component ({pipeline} has no attribute {name!r})"
        )
    else:
        what = f"the pipeline's {name!r} is {type(module).__name__}, not an nn.Module"
    candidates = [candidate for candidate in _module_components(pipe) if candidate != name]
    if candidates:
        listed = ", ".join(map(repr, candidates))
        usual = next((c for c in ("transformer", "unet") if c in candidates), candidates[0])
        where = (
            f"its nn.Module components, which graph_pipeline can graph, are {listed} "
            f"(graph_pipeline(pipe, components=({usual!r},)))"
        )
    else:
        where = "it has no nn.Module component graph_pipeline could graph"
    return TypeError(f"graphed: {what}{_library_of(pipe)}; {where}")


def _check_call_routing() -> None:
    """graph_pipeline reaches a component's calls through the slot nn.Module.__call__ consults
    first (`_compiled_call_impl`): a torch without it would never call the router, and every
    call would run eager unseen, so it is refused instead, naming torch's version."""
    if "_compiled_call_impl" not in vars(torch.nn.Module) or not hasattr(
        torch.nn.Module, "_wrapped_call_impl"
    ):
        raise RuntimeError(
            f"graphed: graph_pipeline routes a component's calls through "
            f"torch.nn.Module._compiled_call_impl, which torch {torch.__version__} does not "
            "have; wrap the component's calls yourself (GraphedForward(pipe.transformer, ...)) "
            "or use a torch graphed supports"
        )


def _library_of(pipe: Any) -> str:
    """ " (diffusers X.Y.Z)" for a pipeline of diffusers, so that a refusal names the release whose
    components it read; "" for any other object."""
    if not type(pipe).__module__.startswith("diffusers"):
        return ""
    try:
        from importlib import metadata

        return f" (diffusers {metadata.version('diffusers')})"
    except Exception:  # noqa: BLE001 - the version is a courtesy in an error message
        return ""


def _compile_component(module: torch.nn.Module, options: dict) -> None:
    """Compiles a component in place, as diffusers documents it: its repeated blocks one by one
    (`compile_repeated_blocks`, regional compilation: one compile serves every block of a kind),
    else the whole module (`nn.Module.compile()`)."""
    if getattr(module, "_repeated_blocks", None) and callable(
        getattr(module, "compile_repeated_blocks", None)
    ):
        module.compile_repeated_blocks(**options)
    else:
        module.compile(**options)


def graph_pipeline(
    pipe: Any,
    components: Iterable[str] = ("transformer",),
    *,
    compile: bool | dict = False,
    **options: Any,
) -> dict[str, GraphedForward]:
    """Makes each named nn.Module component of `pipe` replay graphs: its calls go through a
    GraphedForward(component, **options) (device= defaults to the component's device, name= to
    the component's name), while the component itself stays the pipeline's, so that the registry,
    `.config`, `.dtype`, `.device`, `pipe.to(...)` and save_pretrained see the model as before.
    Returns the GraphedForward of each component by name (their stats(), entries(), reset()).
    A component graphed already is refused; `ungraph_pipeline` undoes this.

    compile=True compiles each component first, as diffusers documents it (its repeated blocks
    by regional compilation where it declares them, else the whole module), in inductor's
    default mode without CUDA graphs of its own: the compile happens in the first call, inside
    graphed's probe (the compiler's own synchronizations are not counted), and graphed captures
    the compiled kernels under one whole-forward graph. A dict of torch.compile options is laid
    over those defaults (graphed._compiled.compile_options)."""
    _check_call_routing()
    compiled = compile_options(compile)
    names = (components,) if isinstance(components, str) else tuple(components)
    modules: dict[str, torch.nn.Module] = {}
    for name in names:
        module = getattr(pipe, name, None)
        if not isinstance(module, torch.nn.Module):
            raise _not_a_module(pipe, name, module)
        if isinstance(module.__dict__.get("_compiled_call_impl"), _GraphedCall):
            raise ValueError(
                f"graphed: the pipeline's {name!r} is graphed already; "
                "graphed.ungraph_pipeline(pipe) undoes it first"
            )
        modules[name] = module
    runners: dict[str, GraphedForward] = {}
    for name, module in modules.items():
        settings = {"name": name, **options}
        if "device" not in settings:
            settings["device"] = _device_of(module)
        if compiled is not None:
            _compile_component(module, compiled)
        runner = GraphedForward(module, **settings)
        compiled_call = module.__dict__.get("_compiled_call_impl")
        module._compiled_call_impl = _GraphedCall(module, runner, compiled_call)
        runners[name] = runner
    return runners


def ungraph_pipeline(pipe: Any, components: Iterable[str] = ("transformer",)) -> None:
    """Gives each named component its call back (compiled again if it was), dropping its graphs;
    a component that is not graphed is left as it is."""
    names = (components,) if isinstance(components, str) else tuple(components)
    for name in names:
        module = getattr(pipe, name, None)
        routed = getattr(module, "__dict__", {}).get("_compiled_call_impl")
        if isinstance(routed, _GraphedCall):
            module._compiled_call_impl = routed.compiled_call
            routed.runner.reset()
