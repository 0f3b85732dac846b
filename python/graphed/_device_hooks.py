"""What GraphedForward needs to know of a device type, in one record chosen by the device's type:
whether the current stream of that device is being captured by someone else (an outer capture:
calls then run eager inside it), and what to install when a runner is made for it; and, for any
type, the device a bare type means (resolve_device: its current index). GraphedForward reads the
record of its device and carries no platform's code itself (the serving stack's
`current_platform` does the same); CUDAGraphedForward / XPUGraphedForward stay as the names their
users know."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _phases

__all__ = ["DeviceHooks", "hooks_for", "resolve_device", "xpu_available"]


@dataclass(frozen=True)
class DeviceHooks:
    # Whether this thread's current stream of the device is being captured right now.
    outer_capture_active: Callable[[], bool]
    # Run once per runner made for the device (idempotent).
    on_runner_created: Callable[[], None]


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


def _cuda_capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and xpu.is_available()


def _xpu_capturing() -> bool:
    capturing = getattr(getattr(torch, "xpu", None), "is_current_stream_capturing", None)
    return capturing is not None and xpu_available() and bool(capturing())


_HOOKS = {
    "cuda": DeviceHooks(_cuda_capturing, _phases.install_capture_awareness),
    "xpu": DeviceHooks(_xpu_capturing, _nothing),
}
_NONE = DeviceHooks(_never, _nothing)


def hooks_for(device_type: str) -> DeviceHooks:
    """The record of `device_type` ("cuda", "xpu"; any other type: no outer capture)."""
    return _HOOKS.get(device_type, _NONE)


def resolve_device(device: torch.device) -> torch.device:
    """`device` with the current index of its kind where it names none ("cuda" -> "cuda:1"), when
    torch has that kind and it is available; else `device` as it is."""
    if device.index is None and device.type != "cpu":
        kind = getattr(torch, device.type, None)
        if kind is not None and getattr(kind, "is_available", lambda: False)():
            return torch.device(device.type, kind.current_device())
    return device
