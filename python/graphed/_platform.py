"""The seed's platform API: `get_graphed_forward_cls()` returns the GraphedForward class for the
current platform, as the serving stack picks it, and `XPUGraphedForward` is the Intel GPU one.

XPUGraphedForward is a subclass of GraphedForward that changes only the device hooks of the
Python layer: the default device index and the outer-capture check (torch.xpu's); the
rank-agreement all-reduce picks the device of an XCCL group by itself (shim/gf_shim_group.h). It
is not "the same class bound to the XPU backend" because
the native backend is chosen once per process at load (CUDA, then XPU, then none) and is not a
per-object choice; what differs per platform in Python is only these hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._forward import GraphedForward
from ._library import backend

__all__ = ["CUDAGraphedForward", "XPUGraphedForward", "get_graphed_forward_cls"]

#: The CUDA class is GraphedForward itself (its hooks are CUDA's).
CUDAGraphedForward = GraphedForward


def _xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and xpu.is_available()


class XPUGraphedForward(GraphedForward):
    """GraphedForward on an Intel GPU (torch's XPU graph through graphed's Level Zero backend).

    Same arguments and behaviour as GraphedForward; `device` defaults to the current XPU device.
    """

    def __init__(self, module: Callable[..., Any], *, device: Any = "xpu", **options: Any) -> None:
        device = torch.device(device)
        if device.type == "xpu" and device.index is None and _xpu_available():
            device = torch.device("xpu", torch.xpu.current_device())
        super().__init__(module, device=device, **options)

    def _outer_capture_active(self) -> bool:
        capturing = getattr(torch.xpu, "is_current_stream_capturing", None)
        return (
            self.device.type == "xpu"
            and capturing is not None
            and _xpu_available()
            and bool(capturing())
        )


def get_graphed_forward_cls() -> type[GraphedForward]:
    """The class for this process's platform: the backend chosen at load first (cuda or xpu),
    else the device torch sees (an XPU build whose backend refused still gets the XPU class, whose
    calls then run eager and log why), else GraphedForward."""
    name, _ = backend()
    if name == "xpu":
        return XPUGraphedForward
    if name == "cuda" or torch.cuda.is_available():
        return CUDAGraphedForward
    if _xpu_available():
        return XPUGraphedForward
    return CUDAGraphedForward
