"""The seed's platform API: `get_graphed_forward_cls()` returns the GraphedForward class for the
current platform, as the serving stack picks it, and `XPUGraphedForward` is the Intel GPU one.

XPUGraphedForward is a subclass of GraphedForward that changes only the default device ("xpu");
what differs per platform in the Python layer (the current index, the outer-capture check) is the
device's record in graphed._device_hooks, which GraphedForward reads for any device, and the
rank-agreement all-reduce picks the device of an XCCL group by itself (shim/gf_shim_group.h)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._device_hooks import xpu_available
from ._forward import GraphedForward
from ._library import backend

__all__ = ["CUDAGraphedForward", "XPUGraphedForward", "get_graphed_forward_cls"]

#: The CUDA class is GraphedForward itself (its hooks are CUDA's).
CUDAGraphedForward = GraphedForward


class XPUGraphedForward(GraphedForward):
    """GraphedForward on an Intel GPU (torch's XPU graph through graphed's Level Zero backend).

    Same arguments and behaviour as GraphedForward; `device` defaults to the current XPU device.
    """

    def __init__(self, module: Callable[..., Any], *, device: Any = "xpu", **options: Any) -> None:
        super().__init__(module, device=device, **options)


def get_graphed_forward_cls() -> type[GraphedForward]:
    """The class for this process's platform: the backend chosen at load first (cuda or xpu),
    else the device torch sees (an XPU build whose backend refused still gets the XPU class, whose
    calls then run eager and log why), else GraphedForward."""
    name, _ = backend()
    if name == "xpu":
        return XPUGraphedForward
    if name == "cuda" or torch.cuda.is_available():
        return CUDAGraphedForward
    if xpu_available():
        return XPUGraphedForward
    return CUDAGraphedForward
