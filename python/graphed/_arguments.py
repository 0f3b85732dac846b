"""What GraphedForward takes besides the module's own tensors: the arguments of its constructor,
checked before anything is made (the module, what its forward's signature allows, the options),
and graphed's own options of a call (RESERVED_KWARGS), split from the module's kwargs: the four
names are written once, here, and a forward that takes one of them is refused at construction.
Also the refusal a runner without graphs makes of an input on another device, in the words the
core uses on a device (graphed::word_input_error)."""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import torch

from ._native import _graphed_fastcall as _fastcall
from ._tree import refuse_tensors

_log = logging.getLogger("graphed")

__all__ = [
    "CPU_INPUT_CHOICES",
    "NO_HELD",
    "RESERVED_KWARGS",
    "bind_positional",
    "check_callable",
    "check_device",
    "check_keep_alive",
    "check_options",
    "check_reserved",
    "default_name",
    "off_device_reason",
    "pop_options",
    "positional_names",
    "positional_refusal",
    "refuse_off_device",
    "say_inference_only",
    "split_keep_alive",
]

# GraphedForward's own call options, named once: a module whose forward takes a keyword of one of
# these names is refused at construction (see check_reserved), never silently swallowed.
# GraphedForward.__call__ tests for them by these literal names, the fastest test there is
# (tests/python/test_graphed_cpu.py checks that they agree).
RESERVED_KWARGS = ("variant", "keep_alive", "pin", "static_outputs")
_VARIANT, _KEEP_ALIVE, _PIN, _STATIC_OUTPUTS = RESERVED_KWARGS
CPU_INPUT_CHOICES = ("refuse", "to_device")
NO_HELD: tuple = ()


def check_callable(module: Any) -> None:
    """A GraphedForward calls `module(**kwargs)`: anything else is refused at construction, with
    what was passed, rather than at the first call. A module that looks set up for training is
    taken, and said once (say_inference_only)."""
    if callable(module):
        say_inference_only(module)
        return
    text = repr(module)
    shown = text if len(text) <= 60 else text[:57] + "..."
    forward = getattr(module, "forward", None)
    hint = (
        "; it has a `forward` method but no __call__: pass that (GraphedForward(obj.forward, "
        "...)) or make the object an nn.Module"
        if callable(forward)
        else ""
    )
    raise TypeError(
        f"graphed: GraphedForward wraps a callable run as module(**kwargs) (an nn.Module, or a "
        f"function taking keyword arguments); got {type(module).__name__} {shown}, which is not "
        f"callable{hint}"
    )


def default_name(module: Any) -> str:
    """The name a runner of `module` gets where none is given, so that report rows and log lines
    tell runners apart: an nn.Module's class (a compiled module's original class), a function's
    qualified name, a bound method's class and name ("Pipe.step"), a partial's function."""
    if isinstance(module, functools.partial):
        return default_name(module.func)
    original = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
    if isinstance(module, torch.nn.Module) and isinstance(original, torch.nn.Module):
        return type(original).__name__
    if isinstance(module, torch.nn.Module):
        return type(module).__name__
    owner = getattr(module, "__self__", None)
    function = getattr(module, "__func__", None)
    if owner is not None and function is not None:
        return f"{type(owner).__name__}.{getattr(function, '__name__', 'method')}"
    named = getattr(module, "__qualname__", None) or getattr(module, "__name__", None)
    if isinstance(named, str) and named:
        return named.replace("<lambda>", "lambda").replace(".<locals>", "")
    return type(module).__name__


_said_inference_only = False


def say_inference_only(module: Any) -> None:
    """graphed is for inference: every forward it runs runs under no-grad, so its outputs carry no
    autograd history, and a backward through one fails with torch's words ("element 0 of tensors
    does not require grad"), which do not name graphed. Where a wrapped nn.Module is in training
    mode with parameters that require grad and grad mode is on, the caller may mean to train it:
    said once per process (WARNING), with what to do. An eval() module, or one made under
    no_grad, says nothing."""
    global _said_inference_only
    if _said_inference_only or not isinstance(module, torch.nn.Module):
        return
    if not (module.training and torch.is_grad_enabled()):
        return
    if not any(parameter.requires_grad for parameter in module.parameters()):
        return
    _said_inference_only = True
    _log.warning(
        "%s is in training mode and its parameters require grad, but graphed is for inference: "
        "every forward it runs runs under torch.no_grad(), so its outputs carry no autograd "
        "history and a backward through them fails (torch: 'element 0 of tensors does not "
        "require grad'). Call .eval() on the module to serve it, or call the module itself to "
        "train it (docs/api.md, Semantics)",
        type(module).__name__,
    )


def _signature_of_forward(module: Any) -> inspect.Signature | None:
    """The signature calls are bound to: the forward of an nn.Module (of the module torch.compile
    wrapped, whose own forward takes *args), else the callable's own; None where Python cannot
    say (a builtin)."""
    target = getattr(module, "_orig_mod", module)
    forward = getattr(target, "forward", target)
    try:
        return inspect.signature(forward)
    except (TypeError, ValueError):
        return None


def check_reserved(module: Any) -> None:
    """A module whose forward takes a keyword GraphedForward reserves for its options would never
    receive it: refused here, with what to do."""
    forward = getattr(module, "forward", module)
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return
    clash = [name for name in RESERVED_KWARGS if name in parameters]
    if clash:
        raise TypeError(
            f"graphed: the module's forward takes the keyword(s) {', '.join(clash)}, which "
            f"GraphedForward reserves for its own options ({', '.join(RESERVED_KWARGS)}); rename "
            "them in the forward, or wrap the module in one whose forward takes other names"
        )


def check_device(device: Any, who: str) -> None:
    """A TypeError that says what `device=` takes, for a value torch.device cannot take (None,
    say, which torch refuses with a list of its overloads)."""
    if isinstance(device, torch.device | str) or (
        isinstance(device, int) and not isinstance(device, bool)
    ):
        return
    raise TypeError(
        f"{who}: device= names the device its graphs run on: a torch.device, a string such as "
        f"'cuda', 'cuda:0' or 'cpu', or a CUDA device index; got {device!r}. For the same code "
        "with and without a GPU: device='cuda' if torch.cuda.is_available() else 'cpu'"
    )


def check_options(
    cpu_inputs: str, max_entries: Any, warmup_iters: Any, capture_context: Any, churn_limit: Any
) -> None:
    """The constructor's options, refused before anything is made."""
    if cpu_inputs not in CPU_INPUT_CHOICES:
        raise ValueError(
            f"cpu_inputs must be one of {', '.join(map(repr, CPU_INPUT_CHOICES))}, got "
            f"{cpu_inputs!r}"
        )
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be an int of at least 1, got {max_entries!r}")
    if isinstance(warmup_iters, bool) or not isinstance(warmup_iters, int) or warmup_iters < 0:
        raise ValueError(f"warmup_iters must be an int of 0 or more, got {warmup_iters!r}")
    if isinstance(churn_limit, bool) or not isinstance(churn_limit, int) or churn_limit < 0:
        raise ValueError(f"churn_limit must be an int of 0 (no guard) or more, got {churn_limit!r}")
    if capture_context is not None and not callable(capture_context):
        raise TypeError("capture_context must be a callable returning a context manager")


def positional_names(module: Any) -> tuple[tuple[str, ...], str | None]:
    """The names positional arguments bind to, in order, and why a positional argument past them
    cannot be keyed (None when nothing stops it: there are simply too many)."""
    signature = _signature_of_forward(module)
    if signature is None:
        return (), "its forward's signature cannot be read"
    names: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind == inspect.Parameter.POSITIONAL_ONLY:
            return tuple(names), (
                f"its forward's parameter {parameter.name!r} is positional-only, and graphed calls "
                "the forward with keywords"
            )
        if parameter.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
            names.append(parameter.name)
        elif parameter.kind == inspect.Parameter.VAR_POSITIONAL:
            return tuple(names), (
                f"its forward takes *{parameter.name}, which has no names to key the arguments by"
            )
    return tuple(names), None


def bind_positional(
    name: str, names: tuple[str, ...], limit: str | None, args: tuple, kwargs: dict
) -> dict:
    """The kwargs a call of the runner called `name` with positional `args` makes: each bound to
    its parameter's name (`names` and `limit`, from positional_names), before the keywords, as
    Python binds them (so that f(x, t=1) and f(x=x, t=1) share a key)."""
    if len(args) > len(names):
        raise TypeError(positional_refusal(name, names, limit, len(args)))
    bound = dict(zip(names, args, strict=False))
    if not kwargs.keys().isdisjoint(bound):
        twice = next(parameter for parameter in names if parameter in bound and parameter in kwargs)
        raise TypeError(f"{name}: got multiple values for argument {twice!r}")
    bound.update(kwargs)
    return bound


def positional_refusal(name: str, names: tuple[str, ...], limit: str | None, given: int) -> str:
    """Why a call with `given` positional arguments cannot be bound to `names` (the forward's,
    with `limit` from positional_names), for the runner called `name`."""
    if not names and limit is None:
        return (
            f"{name}: the forward is keyword-only; got {given} positional argument(s): "
            "pass them by name"
        )
    why = limit or f"its forward takes {len(names)}"
    return (
        f"{name}: got {given} positional argument(s), and graphed binds at most "
        f"{len(names)} ({', '.join(names) or 'none'}): {why}; pass the others by name"
    )


def check_keep_alive(tensors: list[torch.Tensor]) -> None:
    """The Python path's check of keep_alive tensors: the one every path makes (the extension's
    `refusal`)."""
    for index, tensor in enumerate(tensors):
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            continue  # subclasses go through the dispatcher, where their modes see them
        refused = _fastcall.refusal(tensor)
        if refused is not None:
            error_type, why = refused
            raise error_type(f"graphed: keep_alive[{index}] {why}")


def pop_options(kwargs: dict) -> tuple[Any, Any, bool, bool]:
    """Takes GraphedForward's own options (RESERVED_KWARGS) out of a call's kwargs, with their
    defaults where absent."""
    return (
        kwargs.pop(_VARIANT, None),
        kwargs.pop(_KEEP_ALIVE, ()),
        kwargs.pop(_PIN, False),
        kwargs.pop(_STATIC_OUTPUTS, False),
    )


def split_keep_alive(keep_alive: Any) -> tuple[list[torch.Tensor], tuple]:
    """Splits keep_alive into the tensors the native entry holds for its life and the objects
    the entry's output template holds (the others, and the tensors again)."""
    if keep_alive is None or (type(keep_alive) in (tuple, list) and not keep_alive):
        return [], NO_HELD
    if isinstance(keep_alive, torch.nn.Module):
        tensors = [*keep_alive.parameters(), *keep_alive.buffers()]
        return tensors, tuple(tensors)
    if isinstance(keep_alive, torch.Tensor):
        return [keep_alive], (keep_alive,)
    held_tensors: list[torch.Tensor] = []
    others: list[Any] = []
    items = keep_alive.values() if isinstance(keep_alive, dict) else keep_alive
    if not isinstance(items, (tuple, list, type({}.values()))):
        items = (keep_alive,)
    for item in items:
        if isinstance(item, torch.Tensor):
            held_tensors.append(item)
        elif isinstance(item, torch.nn.Module):
            held_tensors.extend([*item.parameters(), *item.buffers()])
        else:
            others.append(item)
    # The tensors ride in the held objects too, so that the forward graphed runs for a capture
    # can name them (CallState.held) for graphed._phases to put back after each warm-up.
    return held_tensors, (*others, *held_tensors)


def off_device_reason(tensor: torch.Tensor, runner: torch.device, takes_cpu: bool) -> str | None:
    """What the core's device check and its wording (graphed::word_input_error) say of `tensor`
    for a runner on `runner` (`takes_cpu`: cpu_inputs="to_device"), or None when it may be
    passed. Without an index the runner's device matches every index of its type, as the core's
    check does for a device it could not resolve."""
    device = tensor.device
    if device.type == "cpu" and takes_cpu:
        return None
    if device.type == runner.type and (
        runner.index is None or device.index is None or device.index == runner.index
    ):
        return None
    option = (
        ", or let GraphedForward(..., cpu_inputs='to_device') copy CPU inputs there for a "
        "forward that moves them itself"
        if device.type == "cpu"
        else ""
    )
    return (
        f"is on {device}; the runner is on {runner}: move the tensor there before the call "
        f"(tensor.to('{runner}')){option}. Graphs are unavailable here, so calls run eager, "
        f"but inputs are checked as a runner on {runner} checks them; to run on this "
        f"machine's {device} instead, make the runner for it (GraphedForward(..., "
        f"device='{device}'))"
    )


def refuse_off_device(
    kwargs: dict, tensors: list[torch.Tensor], runner: torch.device, takes_cpu: bool
) -> None:
    """A runner without graphs (a device="cuda" runner on a machine without a GPU): the
    ValueError the core raises on a device for an input on another device, by its kwarg path, so
    that code refused there is refused here too."""

    def why(tensor: torch.Tensor) -> str | None:
        return off_device_reason(tensor, runner, takes_cpu)

    if any(why(tensor) is not None for tensor in tensors):
        refuse_tensors(kwargs, why)
