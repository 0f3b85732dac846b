"""What GraphedForward needs to know of a device type, in one record chosen by the device's type:
the device a bare type means (its current index), whether the current stream of that device is
being captured by someone else (an outer capture: calls then run eager inside it), and what to
install when a runner is made for it. GraphedForward reads the record of its device; it carries
no platform's code itself (the serving stack's `current_platform` does the same), and
CUDAGraphedForward / XPUGraphedForward stay as the names their users know."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _phases

__all__ = ["DeviceHooks", "hooks_for"]


@dataclass(frozen=True)
class DeviceHooks:
    # The index a device of this type without one means, or None where there is no such device.
    current_index: Callable[[], int | None]
    # Whether this thread's current stream of the device is being captured right now.
    outer_capture_active: Callable[[], bool]
    # Run once per runner made for the device (idempotent).
    on_runner_created: Callable[[], None]


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


def _no_index() -> int | None:
    return None


def _cuda_index() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _cuda_capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and xpu.is_available()


def _xpu_index() -> int | None:
    return torch.xpu.current_device() if _xpu_available() else None


def _xpu_capturing() -> bool:
    capturing = getattr(getattr(torch, "xpu", None), "is_current_stream_capturing", None)
    return capturing is not None and _xpu_available() and bool(capturing())


_HOOKS = {
    "cuda": DeviceHooks(_cuda_index, _cuda_capturing, _phases.install_capture_awareness),
    "xpu": DeviceHooks(_xpu_index, _xpu_capturing, _nothing),
}
_NONE = DeviceHooks(_no_index, _never, _nothing)


def hooks_for(device_type: str) -> DeviceHooks:
    """The record of `device_type` ("cuda", "xpu"; any other type: no index, no outer capture)."""
    return _HOOKS.get(device_type, _NONE)
