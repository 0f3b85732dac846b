"""The first call of a key answered from its last warm-up (Note [The first call from its last
warm-up], ops/gf_warm_up_answer.c).

On the CPU, the emulated backend's hand-over switch stands for CUDA's caller-stream hooks; its
forwards here add why they run (torch.ops.graphed.forward_phase()) to their output, so that a
result says whether it came from the warm-up (phase 2), from a replay of what the capture wrote
(phase 3) or from eager (0). Each case where a replay must answer instead (a state buffer written,
an input written in place, a Python attribute rebound, static outputs) is checked on its own, and so
is verify mode, which must compare the first replay rather than the warm-up. On the device the
first call is checked against eager bitwise, on a stream of the caller's own.
"""

from __future__ import annotations

import pytest
import torch
from _backend_choice import handing_over_warm_ups
from graphed import GraphedForward, _phases

PHASE_WARMUP, PHASE_CAPTURE = _phases.PHASE_WARMUP, _phases.PHASE_CAPTURE


def _phase() -> float:
    return float(int(torch.ops.graphed.forward_phase()))


class TellsItsPhase(torch.nn.Module):
    """x * 2 plus the phase graphed runs it in, and a non-tensor output that follows the key."""

    def forward(self, x):
        return {"y": x * 2 + _phase(), "rows": x.shape[0], "pair": (x + 1,)}


class CountsInABuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x + _phase()


class WritesItsInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2 + _phase()


class WritesItsInputWhenProbed(torch.nn.Module):
    def forward(self, x):
        if int(torch.ops.graphed.forward_phase()) == _phases.PHASE_PROBE:
            x.add_(1)  # the later warm-up then computes on the written input
        return x * 2 + _phase()


class RebindsAStep(torch.nn.Module):
    step = 0  # a class default; each call rebinds the instance's own

    def forward(self, x):
        self.step = self.step + 1
        return x + _phase()


@pytest.fixture
def handing_over(emulated_backend):
    with handing_over_warm_ups():
        yield emulated_backend


def test_the_first_call_gets_its_last_warm_ups_outputs_and_no_replay(handing_over):
    gf = GraphedForward(TellsItsPhase(), device="cpu", backend=handing_over)
    x = torch.arange(6.0).reshape(3, 2)
    first = gf(x=x)
    torch.testing.assert_close(first["y"], x * 2 + PHASE_WARMUP, rtol=0, atol=0)
    assert first["rows"] == 3
    torch.testing.assert_close(first["pair"][0], x + 1, rtol=0, atol=0)
    stats = gf.stats()
    assert (stats["captures"], stats["replays"]) == (1, 0)
    second = gf(x=x + 10)  # the emulated replay gives back what the capture wrote
    torch.testing.assert_close(second["y"], x * 2 + PHASE_CAPTURE, rtol=0, atol=0)
    torch.testing.assert_close(second["pair"][0], x + 1, rtol=0, atol=0)
    assert (gf.stats()["captures"], gf.stats()["replays"]) == (1, 1)
    second["y"].add_(100)  # the caller owns its outputs: the first call's are its own too
    torch.testing.assert_close(first["y"], x * 2 + PHASE_WARMUP, rtol=0, atol=0)


def test_without_the_backends_hooks_the_first_call_replays(emulated_backend):
    gf = GraphedForward(TellsItsPhase(), device="cpu", backend=emulated_backend)
    x = torch.ones(2, 2)
    torch.testing.assert_close(gf(x=x)["y"], x * 2 + PHASE_CAPTURE, rtol=0, atol=0)
    assert (gf.stats()["captures"], gf.stats()["replays"]) == (1, 1)


def test_a_forward_that_writes_a_buffer_replays_and_advances_it_once(handing_over):
    module = CountsInABuffer()
    gf = GraphedForward(module, device="cpu", backend=handing_over)
    x = torch.zeros(3)
    torch.testing.assert_close(gf(x=x), x + PHASE_CAPTURE, rtol=0, atol=0)
    assert gf.stats()["replays"] == 1
    # The warm-ups' writes were put back; the capture's was the one write, as one eager call's.
    assert float(module.calls) == 1.0


def test_a_forward_that_writes_its_input_replays(handing_over):
    # A replay writes the input back into the caller's tensor (on the emulated backend, the
    # static buffer as the live input left it); a warm-up's copies would not.
    gf = GraphedForward(WritesItsInput(), device="cpu", backend=handing_over)
    out = gf(x=torch.zeros(3))
    assert gf.stats()["replays"] == 1
    # 2 * k + 3 from the capture's forward, never the warm-up's 2 * k + 2
    assert bool(((out - PHASE_CAPTURE) % 2 == 0).all()), out


def test_an_input_written_by_an_earlier_warm_up_only_replays(handing_over):
    gf = GraphedForward(WritesItsInputWhenProbed(), device="cpu", backend=handing_over)
    gf(x=torch.zeros(3))
    assert gf.stats()["replays"] == 1


@pytest.mark.parametrize("rows", [3, 4])
def test_a_forward_that_rebinds_a_python_attribute_replays(handing_over, rows):
    # The second key's capture runs one warm-up, the first of its snapshot, where a change is
    # forgiven as a lazy setup: it still must not answer the call.
    gf = GraphedForward(RebindsAStep(), device="cpu", backend=handing_over, churn_limit=0)
    for call, size in enumerate((3, rows), start=1):
        x = torch.zeros(size)
        torch.testing.assert_close(gf(x=x), x + PHASE_CAPTURE, rtol=0, atol=0)
        assert gf.stats()["replays"] == call


def test_a_callable_that_is_not_a_module_replays(handing_over):
    # Its attributes are watched by no one, so nothing vouches that a warm-up changed none.
    module = TellsItsPhase()
    gf = GraphedForward(module.forward, device="cpu", backend=handing_over)
    x = torch.ones(2, 2)
    torch.testing.assert_close(gf(x=x)["y"], x * 2 + PHASE_CAPTURE, rtol=0, atol=0)
    assert gf.stats()["replays"] == 1


def test_static_outputs_are_filled_by_a_replay(handing_over):
    gf = GraphedForward(TellsItsPhase(), device="cpu", backend=handing_over)
    x = torch.ones(2, 2)
    out = gf(x=x, static_outputs=True)
    torch.testing.assert_close(out["y"], x * 2 + PHASE_CAPTURE, rtol=0, atol=0)
    assert gf.stats()["replays"] == 1


def test_verify_compares_the_first_replay_not_the_warm_up(handing_over):
    # Eager gives x * 2 + 0, the warm-up x * 2 + 2 and the emulated replay x * 2 + 3: each
    # compared call differs, so the call compared is the one whose answer comes back as eager's.
    gf = GraphedForward(TellsItsPhase(), device="cpu", backend=handing_over, verify=1)
    x = torch.ones(2, 2)
    first = gf(x=x)
    torch.testing.assert_close(first["y"], x * 2 + PHASE_WARMUP, rtol=0, atol=0)
    assert gf.stats()["enabled"], "the warm-up's answer is not what verify compares"
    second = gf(x=x)
    torch.testing.assert_close(second["y"], x * 2, rtol=0, atol=0)
    stats = gf.stats()
    assert not stats["enabled"] and "y" in stats["disabled_reason"]


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)
        )

    def forward(self, x, scale):
        return {"y": self.net(x) * scale, "last": x[-1]}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_device_the_first_call_is_eagers_on_the_callers_stream():
    module = Mlp().cuda()
    gf = GraphedForward(module, device="cuda")
    stream = torch.cuda.Stream()
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad(), torch.cuda.stream(stream):
        expected = module(x=x, scale=0.5)
        first = gf(x=x, scale=0.5)
        first["y"].mul_(2)  # the caller's own tensor, used on its own stream
        expected["y"].mul_(2)
    stream.synchronize()
    torch.testing.assert_close(first["y"], expected["y"], rtol=0, atol=0)
    torch.testing.assert_close(first["last"], expected["last"], rtol=0, atol=0)
    assert (gf.stats()["captures"], gf.stats()["replays"]) == (1, 0)
    y = torch.randn(32, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(gf(x=y, scale=0.5)["y"], module(x=y, scale=0.5)["y"])
    assert gf.stats()["replays"] == 1
