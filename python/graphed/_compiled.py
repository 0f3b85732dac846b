"""What graphed knows of torch.compile, in one place: whether a module holds compiled code, whether
the compiler is at work on this thread now, whether an exception is the compiler refusing a
model, and the one way graphed itself compiles a forward (inductor without CUDA graphs of its
own: graphed's graphs are the graphs).

Why graphed needs to know (docs/architecture.md, "Graphed over compiled code"): torch.compile
traces and compiles a frame the first time it runs with a new guard (a new shape, a new mode on
the stack), and that first run of a key is graphed's sync probe or the first warm-up of a later
key. The compiler synchronizes with the device on its own account (inductor's constant folding,
its benchmarks of kernel choices) and none of that is in the compiled code a graph replays, so
the probe does not count a synchronization made while the compiler is at work on the thread
(`compiler_running`); a synchronization in the model's own code (a graph break leaves it to run
eagerly, in the model's frame) is counted and named as before. Dynamo's guards include the stack
of torch function modes, and graphed's capture runs under its InventoryMode: a runner whose
module holds compiled code runs its warm-ups under that mode as well, so that a later key
compiles in its first warm-up and never under a capture. The compiled code itself never runs
under that mode where graphed can see its entry (`entries_lifting_mode`): each entry a runner's
module holds (a module compiled in place, a torch.compile'd module, a compiled function it keeps)
is called, for the runs under the mode, with the mode lifted off the stack, so that Dynamo traces
and guards exactly as it does for the same code called without graphed: graphed over compiled
code replays what compile alone computes, bitwise, and a call of the compiled code without
graphed (a runner disabled, a region left eager) compiles nothing again. A compiled function
the forward reaches otherwise (a module-level global) is still traced under the mode.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "frames_compiled",
    "compile_options",
    "compiler_refusal",
    "compiler_running",
    "entries_lifting_mode",
    "holds_compiled_code",
]


def compiler_running() -> bool:
    """Whether torch.compile is tracing or compiling a frame on this thread now (Dynamo's compile
    context wraps the trace and the backend's compile, inductor's included)."""
    guards = getattr(torch, "_guards", None)
    context = getattr(guards, "CompileContext", None)
    return context is not None and context.try_get() is not None


def holds_compiled_code(module: Any) -> bool:
    """Whether `module` is a torch.compile'd module, or it or one of its submodules has been
    compiled in place (`nn.Module.compile()`, diffusers' `compile_repeated_blocks`), or it holds
    a compiled function as an attribute of its own (graph_generation's compiled decode step)."""
    if not isinstance(module, torch.nn.Module) or not _dynamo():
        return False  # nothing was compiled in this process
    if any(
        hasattr(value, "_torchdynamo_orig_callable")
        for value in vars(module).values()
        if callable(value) and not isinstance(value, torch.nn.Module)
    ):
        return True
    optimized = getattr(torch._dynamo.eval_frame, "OptimizedModule", ())
    # The submodules by their `_modules` dicts, not `modules()`: a third of its time on a
    # 402-module DiT (a look per capture, in a process that compiled anything).
    pending = [module]
    while pending:
        submodule = pending.pop()
        attributes = submodule.__dict__
        if attributes.get("_compiled_call_impl") is not None:
            return True
        if optimized and isinstance(submodule, optimized):
            return True
        pending.extend(child for child in attributes["_modules"].values() if child is not None)
    return False


# Where a module keeps the compiled code it enters (nn.Module.compile()'s call, a torch.compile'd
# module's wrapped forward), and where graphed's own routers in front of one keep it
# (graph_pipeline's `_inner`, a region's `original`).
_MODULE_ENTRIES = ("_compiled_call_impl", "forward", "_forward")
_ROUTER_ENTRIES = ("_inner", "original")


def _is_compiled_callable(value: Any) -> bool:
    return callable(value) and hasattr(value, "_torchdynamo_orig_callable")


def _entries(module: torch.nn.Module) -> list[tuple[dict, str]]:
    """The (namespace, name) of each compiled callable `module` enters that graphed can see: a
    compiled function among the module's own attributes, each submodule's _MODULE_ENTRIES, and
    the _ROUTER_ENTRIES of a router graphed put there."""
    found = [
        (module.__dict__, name)
        for name, value in module.__dict__.items()
        if name not in _MODULE_ENTRIES and _is_compiled_callable(value)
    ]
    pending = [module]
    while pending:
        submodule = pending.pop()
        attributes = submodule.__dict__
        for name in _MODULE_ENTRIES:
            value = attributes.get(name)
            if _is_compiled_callable(value):
                found.append((attributes, name))
            elif value is not None and not isinstance(value, torch.nn.Module):
                router = getattr(value, "__dict__", {})
                found.extend(
                    (router, inner)
                    for inner in _ROUTER_ENTRIES
                    if _is_compiled_callable(router.get(inner))
                )
        pending.extend(child for child in attributes["_modules"].values() if child is not None)
    return found


class _WithoutMode:
    """A compiled callable called with every torch function mode of `mode_type` lifted off this
    thread's stack (and put back after), so Dynamo neither traces it nor guards on it."""

    def __init__(self, call: Any, mode_type: type) -> None:
        self.call = call
        self.mode_type = mode_type
        self._torchdynamo_orig_callable = getattr(call, "_torchdynamo_orig_callable", call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # inlined by an outer compile: the stack is its own
            return self.call(*args, **kwargs)
        length = torch._C._len_torch_function_stack()
        stack = [torch._C._pop_torch_function_stack() for _ in range(length)][::-1]
        for mode in stack:
            if not isinstance(mode, self.mode_type):
                torch._C._push_on_torch_function_stack(mode)
        try:
            return self.call(*args, **kwargs)
        finally:
            for _ in range(torch._C._len_torch_function_stack()):
                torch._C._pop_torch_function_stack()
            for mode in stack:
                torch._C._push_on_torch_function_stack(mode)


@contextlib.contextmanager
def entries_lifting_mode(module: Any, mode_type: type) -> Iterator[None]:
    """While it is entered, each compiled entry `module` holds (see _entries) runs with the torch
    function modes of `mode_type` lifted off the stack; the entries are put back after."""
    entries = _entries(module) if isinstance(module, torch.nn.Module) and _dynamo() else []
    originals = [namespace[name] for namespace, name in entries]
    for (namespace, name), call in zip(entries, originals, strict=True):
        namespace[name] = _WithoutMode(call, mode_type)
    try:
        yield
    finally:
        for (namespace, name), call in zip(entries, originals, strict=True):
            namespace[name] = call


def frames_compiled() -> int | None:
    """How many frames Dynamo has compiled in this process (0 before torch._dynamo loads; None
    where this torch keeps no such count): a runner looks for compiled code again only when it
    changed, as the look costs about 0.2 ms for a 402-module DiT (a 2-core x86 host) and
    diffusers loads torch._dynamo in every process that imports it."""
    if not _dynamo():
        return 0
    counters = getattr(getattr(torch._dynamo, "utils", None), "counters", None)
    try:
        return int(counters["frames"]["total"])
    except (TypeError, KeyError, ValueError):
        return None


def _dynamo() -> bool:
    """Whether torch._dynamo is loaded (it is once anything was compiled; graphed never imports it
    for a model that compiles nothing)."""
    return "torch._dynamo" in sys.modules


def compiler_refusal(error: BaseException) -> str | None:
    """The compiler's reason when `error` is torch.compile refusing or failing to compile (a graph
    break under fullgraph=True, a backend failure, a recompile limit hit), else None."""
    if not _dynamo():
        return None
    exc = getattr(torch._dynamo, "exc", None)
    kinds = tuple(
        kind
        for kind in (
            getattr(exc, "TorchDynamoException", None),
            getattr(exc, "FailOnRecompileLimitHit", None),  # a plain Exception
        )
        if isinstance(kind, type)
    )
    if not kinds or not isinstance(error, kinds):
        return None
    text = str(error).strip()
    head = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {head}"[:300]


# torch.compile's modes that record CUDA graphs of their own: under graphed's capture they would
# capture inside a capture; graphed's graphs are the graphs.
_GRAPHING_MODES = ("reduce-overhead", "max-autotune")


def compile_options(compile: bool | dict) -> dict | None:
    """The torch.compile options graphed compiles a forward with, from a `compile=` argument:
    None for False; for True, inductor's default mode (its fused kernels, no CUDA graphs of its
    own), one whole graph (`fullgraph=True`: a graph break is a refusal the caller names, not a
    forward split in pieces) and static shapes (one compile per shape, as graphed keeps one graph
    per shape); a dict is laid over those (another `mode`, a `backend`). ValueError for a mode
    that records CUDA graphs of its own, and for anything else that is not a bool or a dict."""
    if compile is False:
        return None
    options = {"fullgraph": True, "dynamic": False}
    if isinstance(compile, dict):
        options.update(compile)
    elif compile is not True:
        raise ValueError(
            f"graphed: compile= takes True, False or a dict of torch.compile options, got "
            f"{type(compile).__name__}"
        )
    mode = options.get("mode")
    cudagraphs = (options.get("options") or {}).get("triton.cudagraphs")
    if mode in _GRAPHING_MODES or cudagraphs:
        raise ValueError(
            f"graphed: compile={compile!r} asks torch.compile for CUDA graphs of its own "
            f"(mode {mode!r}); graphed captures the compiled kernels in its own graphs: leave "
            'mode out (inductor\'s default) or pass "max-autotune-no-cudagraphs"'
        )
    return options
