"""The nn.Module methods that return the module, on a GraphedForward (torch/nn/modules/module.py).

`gf = GraphedForward(m, device=...).eval()` must keep the graphed object, not the bare module, so
each method here is applied to the wrapped module and returns the GraphedForward. The graphs are
dropped (reset) when the call changed what they baked in: a submodule's mode, or a parameter's or
buffer's address, dtype, device or layout, found by the same comparison a call makes when the
watch fires (graphed._baked). A move off the runner's device is refused before anything changes:
a GraphedForward serves one device. For a wrapped callable that is not an nn.Module these names
do not exist (AttributeError, so that __getattr__, here too, asks the callable itself): every name
the GraphedForward lacks is the wrapped callable's.

GraphedForward inherits ModuleMethods; what the mixin needs of it is listed on the class.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

from ._device_hooks import resolve_device

__all__ = ["ModuleMethods"]

_Method = TypeVar("_Method", bound=Callable[..., Any])
_Self = TypeVar("_Self", bound="ModuleMethods")


class _ModuleMethod:
    """A GraphedForward method that exists only while the wrapped callable is an nn.Module: for
    any other callable the attribute lookup raises AttributeError, so that __getattr__ asks the
    callable itself, as it does for every name GraphedForward lacks."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = method
        self.__name__ = method.__name__
        self.__doc__ = method.__doc__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if not isinstance(instance.__dict__.get("module"), torch.nn.Module):
            raise AttributeError(self.__name__)
        return types.MethodType(self._method, instance)


def _module_method(method: _Method) -> _Method:
    return cast(_Method, _ModuleMethod(method))


def _method_moving_to_kind(kind: str) -> Any:
    """ModuleMethods.cuda and its kin (xpu, ipu, mtia): module.<kind>(device), for the runner's
    device only (see ModuleMethods.to)."""

    def method(self: _Self, device: Any = None) -> _Self:
        return self._to_kind(kind, device)

    method.__name__ = method.__qualname__ = kind
    method.__doc__ = f"module.{kind}(device), for the runner's device only (see `to`)."
    return _module_method(method)


def _same_device(target: torch.device, runner: torch.device) -> bool:
    target, runner = resolve_device(target), resolve_device(runner)
    if target.type != runner.type:
        return False
    if target.type == "cpu" or target.index is None or runner.index is None:
        return True
    return target.index == runner.index


def _device_of_kind(kind: str, device: Any) -> torch.device:
    """The device `module.cuda(device)` (and xpu, ipu, mtia) moves to: an index, a device or
    None (the current one)."""
    if device is None:
        return torch.device(kind)
    if isinstance(device, int):
        return torch.device(kind, device)
    return torch.device(device)


def _device_of_legacy_type(dst_type: Any) -> torch.device | None:
    """The device `module.type(dst_type)` moves to: None for a dtype, else the device of the
    legacy tensor type ("torch.cuda.HalfTensor" or the class)."""
    if isinstance(dst_type, torch.dtype):
        return None
    name = dst_type if isinstance(dst_type, str) else f"{dst_type.__module__}.{dst_type.__name__}"
    return torch.device("cuda" if name.startswith("torch.cuda.") else "cpu")


class ModuleMethods:
    """The nn.Module methods of a GraphedForward (see the module docstring). Its host provides
    `module` (the wrapped callable), `device` and `name` (the runner's), `reset()` (drops every
    graph) and `_follow_change()` (drops the graphs when what they baked in changed). Methods
    named `float` and `type` come last: they would shadow the builtins in the class body below
    them."""

    module: Any
    device: torch.device
    name: str
    reset: Callable[[], None]
    _follow_change: Callable[[], None]

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the GraphedForward lacks: the wrapped module answers, as it
        # would without graphed (gf.config, gf.dtype, gf.weight). The nn.Module methods that
        # return the module (eval, to, half, ...) are the GraphedForward's own, below.
        if name.startswith("__") or name in ("module", "_id"):
            raise AttributeError(name)
        return getattr(self.__dict__["module"], name)

    def _after_change(self: _Self, change: Callable[[], Any]) -> _Self:
        """Applies `change`, then drops the graphs if it changed anything they baked in."""
        change()
        self._follow_change()
        return self

    def _moving(
        self: _Self, call: str, target: torch.device | None, change: Callable[[], Any]
    ) -> _Self:
        if target is not None and not _same_device(target, self.device):
            raise ValueError(
                f"graphed: runner '{self.name}': {call} would move the module to {target}, off "
                f"the device this GraphedForward runs on ({self.device}); the module was left as "
                f"it was. A GraphedForward serves one device: to run on {target}, move the module "
                f"there and make a new GraphedForward for that device (GraphedForward(module, "
                f'device="{target}")); the graphs of this one stay on {self.device}'
            )
        return self._after_change(change)

    @_module_method
    def train(self: _Self, mode: bool = True) -> _Self:
        """module.train(mode); returns this GraphedForward, its graphs dropped if a submodule's
        mode changed."""
        return self._after_change(lambda: self.module.train(mode))

    @_module_method
    def eval(self: _Self) -> _Self:
        """module.eval(); returns this GraphedForward, its graphs dropped if a submodule's mode
        changed."""
        return self._after_change(self.module.eval)

    @_module_method
    def requires_grad_(self: _Self, requires_grad: bool = True) -> _Self:
        """module.requires_grad_(requires_grad); returns this GraphedForward with its graphs:
        graphed runs forwards under no_grad, so nothing a graph holds depends on the flag."""
        self.module.requires_grad_(requires_grad)
        return self

    @_module_method
    def apply(self: _Self, fn: Callable[[torch.nn.Module], None]) -> _Self:
        """module.apply(fn); returns this GraphedForward with its graphs dropped (`fn` may change
        anything a graph holds)."""
        self.module.apply(fn)
        self.reset()
        return self

    @_module_method
    def to(self: _Self, *args: Any, **kwargs: Any) -> _Self:
        """module.to(...) (a dtype, the runner's device, a memory format, a tensor); returns this
        GraphedForward, its graphs dropped if a parameter or buffer changed. ValueError, with the
        module left as it was, for another device."""
        target, _, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        return self._moving("to(...)", target, lambda: self.module.to(*args, **kwargs))

    def _to_kind(self: _Self, kind: str, device: Any) -> _Self:
        """module.cuda(device) and its kin (xpu, ipu, mtia), for the runner's device only."""
        target = _device_of_kind(kind, device)
        return self._moving(f"{kind}()", target, lambda: getattr(self.module, kind)(device))

    cuda = _method_moving_to_kind("cuda")
    xpu = _method_moving_to_kind("xpu")
    ipu = _method_moving_to_kind("ipu")
    mtia = _method_moving_to_kind("mtia")

    @_module_method
    def cpu(self: _Self) -> _Self:
        """module.cpu(), for a runner on the CPU only (see `to`)."""
        return self._moving("cpu()", torch.device("cpu"), self.module.cpu)

    @_module_method
    def to_empty(self: _Self, *, device: Any, recurse: bool = True) -> _Self:
        """module.to_empty(device=..., recurse=...), for the runner's device only (see `to`)."""
        target = None if device is None else torch.device(device)
        return self._moving(
            "to_empty()", target, lambda: self.module.to_empty(device=device, recurse=recurse)
        )

    @_module_method
    def double(self: _Self) -> _Self:
        """module.double(); returns this GraphedForward, its graphs dropped if anything changed."""
        return self._after_change(self.module.double)

    @_module_method
    def half(self: _Self) -> _Self:
        """module.half(); returns this GraphedForward, its graphs dropped if anything changed."""
        return self._after_change(self.module.half)

    @_module_method
    def bfloat16(self: _Self) -> _Self:
        """module.bfloat16(); returns this GraphedForward, its graphs dropped if anything
        changed."""
        return self._after_change(self.module.bfloat16)

    @_module_method
    def share_memory(self: _Self) -> _Self:
        """module.share_memory(); returns this GraphedForward, its graphs dropped (the tensors
        move to shared memory)."""
        return self._after_change(self.module.share_memory)

    @_module_method
    def type(self: _Self, dst_type: Any) -> _Self:
        """module.type(dst_type); a legacy tensor type of another device is refused (see `to`)."""
        target = _device_of_legacy_type(dst_type)
        return self._moving("type()", target, lambda: self.module.type(dst_type))

    @_module_method
    def float(self: _Self) -> _Self:
        """module.float(); returns this GraphedForward, its graphs dropped if anything changed."""
        return self._after_change(self.module.float)
