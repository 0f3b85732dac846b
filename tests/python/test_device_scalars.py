"""A number that changes every call, passed as a 0-d tensor on the device (docs/api.md, "A number
that changes every call"): one key, so one graph serves every value, and, where the forward
computes with it as eager computes with a Python float, bitwise eager's results.

On the CPU with the emulated backend: the keying (one capture, no churn guard, over 40 values).
On the GPU: the values, bitwise, for the arithmetic the docs offer: a float32 product and sum, and
a bfloat16 product computed in float32 as torch computes one with a Python float. The scalar is
refreshed with `fill_` (a kernel, no synchronization), not made anew from a Python float (a
blocking copy).
"""

from __future__ import annotations

import pytest
import torch
from graphed import GraphedForward

VALUES = [0.1, 1 / 3, 7.123456789, -2.5e-3, 1e4 / 3, 0.7071067811865476, 3.3, -11.0 / 7]


class ScaledSteps(torch.nn.Module):
    """Uses its `scale` the ways the docs offer, whether it is a Python float or a 0-d tensor."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x, h, scale):
        y = self.linear(x) * scale + x - scale
        # bfloat16 times a Python float is computed in float32 and rounded once: with a float32
        # 0-d tensor, write that computation out (h * scale would round the scale to bfloat16).
        z = (h.float() * scale).to(h.dtype) + h
        return y, z


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    x = torch.randn(8, 16, device=device)
    return x, torch.randn(8, 16, device=device).to(torch.bfloat16)


def test_a_0d_tensor_that_changes_every_call_is_one_key(emulated_backend):
    module = ScaledSteps()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x, h = _inputs("cpu")
    scale = torch.zeros((), dtype=torch.float32)
    for call in range(40):
        scale.fill_(0.5 + call / 10)
        gf(x=x, h=h, scale=scale)
    stats = gf.stats()
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, 40, 0), stats
    assert stats["churn_eager_calls"] == 0 and stats["churn_guarding"] == 0, stats


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_0d_device_tensor_replays_every_value_bitwise_as_eager_with_a_float():
    module = ScaledSteps().cuda()
    gf = GraphedForward(module, device="cuda")
    x, h = _inputs("cuda")
    scale = torch.zeros((), device="cuda", dtype=torch.float32)
    for value in VALUES:
        with torch.no_grad():
            want = module(x=x, h=h, scale=value)  # eager, with the Python float
        scale.fill_(value)
        got = gf(x=x, h=h, scale=scale)
        for name, g, w in zip(("float32", "bfloat16"), got, want, strict=True):
            assert torch.equal(g, w), f"{name} differs at scale={value}"
    stats = gf.stats()
    # the first call: its last warm-up's outputs
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, len(VALUES) - 1, 0)
