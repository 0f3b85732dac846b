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
compiles in its first warm-up and never under a capture.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "frames_compiled",
    "compile_options",
    "compiler_refusal",
    "compiled_in_place",
    "compiler_running",
    "holds_compiled_code",
    "see_compiled_graph_calls",
]


def compiler_running() -> bool:
    """Whether torch.compile is tracing or compiling a frame on this thread now (Dynamo's compile
    context wraps the trace and the backend's compile, inductor's included)."""
    guards = getattr(torch, "_guards", None)
    context = getattr(guards, "CompileContext", None)
    return context is not None and context.try_get() is not None


def compiled_in_place(module: torch.nn.Module) -> bool:
    """Whether calling `module` runs compiled code by its own doing: a torch.compile'd module
    (an OptimizedModule), one compiled in place (`nn.Module.compile()`, diffusers'
    `compile_repeated_blocks`: its `_compiled_call_impl`), or one whose instance `forward` is a
    compiled function (`block.forward = torch.compile(block.forward)`, also beneath a region of
    graphed's). What `torch.compiler.disable` made (a function, or an OptimizedModule of a
    DisableContext) is not compiled code."""
    if not _dynamo():
        return False  # nothing was compiled in this process
    return _compiled_here(module, getattr(torch._dynamo.eval_frame, "OptimizedModule", ()))


def _compiled_function(value: Any) -> bool:
    """A function torch.compile made (not one torch.compiler.disable made)."""
    return hasattr(value, "_torchdynamo_orig_callable") and not getattr(
        value, "_torchdynamo_disable", False
    )


def _compiled_here(module: torch.nn.Module, optimized: type | tuple) -> bool:
    attributes = module.__dict__
    call = attributes.get("_compiled_call_impl")
    # graph_pipeline's router takes that slot whether or not the module was compiled.
    call = getattr(call, "compiled_call", call)
    if call is not None:
        return True
    forward = attributes.get("forward")
    if forward is not None and (
        _compiled_function(forward) or _compiled_function(getattr(forward, "__wrapped__", None))
    ):
        return True
    if not isinstance(module, optimized):
        return False
    disable = getattr(torch._dynamo.eval_frame, "DisableContext", ())
    return not isinstance(getattr(module, "dynamo_ctx", None), disable)


def holds_compiled_code(module: Any) -> bool:
    """Whether `module` or one of its submodules is compiled (`compiled_in_place`), or it holds a
    compiled function as an attribute of its own (graph_generation's compiled decode step)."""
    if not isinstance(module, torch.nn.Module) or not _dynamo():
        return False  # nothing was compiled in this process
    if any(
        _compiled_function(value)
        for value in vars(module).values()
        if callable(value) and not isinstance(value, torch.nn.Module)
    ):
        return True
    optimized = getattr(torch._dynamo.eval_frame, "OptimizedModule", ())
    # The submodules by their `_modules` dicts, not `modules()`: a third of its time on a
    # 402-module DiT (a look per capture, in a process that compiled anything). Most hold
    # neither slot, which the loop tells before it calls anything.
    pending = [module]
    while pending:
        submodule = pending.pop()
        attributes = submodule.__dict__
        if (
            attributes.get("_compiled_call_impl") is not None
            or "forward" in attributes
            or isinstance(submodule, optimized)
        ) and _compiled_here(submodule, optimized):
            return True
        pending.extend(child for child in attributes["_modules"].values() if child is not None)
    return False


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


# What sees each call of an inductor-compiled graph on this thread (see_compiled_graph_calls).
_graph_calls = threading.local()


def see_compiled_graph_calls(
    see: Callable[[Sequence, Any], None] | None,
) -> Callable[[Sequence, Any], None] | None:
    """Makes `see(inputs, None)` run before each call of a graph inductor compiled, on this
    thread, and `see((), outputs)` after it (None: nothing runs); returns what ran before, to be
    put back. (The inputs are not held across the call: inductor frees each as soon as its
    kernels are done with it.)

    Why: inductor's code runs its kernels with no torch function in between, so graphed's
    InventoryMode never sees what a compiled graph reads. Dynamo passes each graph every tensor
    it reads as an input, a module-level tensor or one a plain object holds included (fetched
    again at every call, where a graph would keep the capture's), and every compiled graph is
    called through `CompiledFxGraph.__call__` (torch 2.6 and later), which this wraps, once,
    when inductor is loaded; the wrapper costs one thread-local read per compiled call and
    nothing on a replay. A torch without that class is not wrapped: what its compiled graphs read
    is not seen, as before."""
    previous = getattr(_graph_calls, "see", None)
    _graph_calls.see = see
    if see is not None:
        output_code = sys.modules.get("torch._inductor.output_code")
        graph = getattr(output_code, "CompiledFxGraph", None)
        if graph is not None:
            _wrap_graph_call(graph)
    return previous


_wrapping = threading.Lock()


def _wrap_graph_call(graph: type) -> None:
    call = graph.__dict__.get("__call__")
    if call is None or hasattr(call, "graphed_sees"):
        return
    with _wrapping:
        call = graph.__dict__.get("__call__")
        if hasattr(call, "graphed_sees"):
            return

        @functools.wraps(call)
        def seen_call(self: Any, inputs: Sequence[Any]) -> Any:
            see = getattr(_graph_calls, "see", None)
            if see is None:
                return call(self, inputs)
            see(inputs, None)
            outputs = call(self, inputs)
            see((), outputs)
            return outputs

        seen_call.graphed_sees = True
        graph.__call__ = seen_call
