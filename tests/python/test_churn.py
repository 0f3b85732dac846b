"""Traffic whose keys never come back: the churn guard (ops/gf_churn.h) on the CPU with the
emulated backend. A Python float that changes every call, or a new length every call, is run eager
after two captures (with eager's values); a server's fixed shapes are all captured as each comes
again; a denoising loop's one key and a decode loop's two capture as before; reset() and
churn_limit=0 give today's capture-every-key behaviour."""

from __future__ import annotations

import torch
from graphed import GraphedForward


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        return self.linear(x) * scale


def _runner(backend: str, **options) -> tuple[GraphedForward, Scaled]:
    module = Scaled()
    return GraphedForward(module, device="cpu", backend=backend, **options), module


def _eager(module: Scaled, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return module(**kwargs)


def test_a_float_that_changes_every_call_runs_eager_after_two_captures(emulated_backend):
    gf, module = _runner(emulated_backend)
    x = torch.randn(4, 8)
    for call in range(40):
        scale = 0.5 + call / 10
        torch.testing.assert_close(
            gf(x, scale=scale), _eager(module, x=x, scale=scale), rtol=0, atol=0
        )
    stats = gf.stats()
    assert (stats["captures"], stats["churn_eager_calls"], stats["eager_calls"]) == (2, 38, 38)
    assert stats["churn_guarding"] == 1 and stats["enabled"]


def test_a_new_length_every_call_runs_eager_and_the_pool_stays_small(emulated_backend):
    gf, module = _runner(emulated_backend, max_entries=16)
    for rows in range(1, 61):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(gf(x), _eager(module, x=x), rtol=0, atol=0)
    stats = gf.stats()
    assert (stats["captures"], stats["graphs"], stats["evictions"]) == (2, 2, 0), stats


def test_a_servers_shapes_are_each_captured_when_they_come_again(emulated_backend):
    gf, module = _runner(emulated_backend, max_entries=16)
    shapes = [torch.randn(rows, 8) for rows in (1, 2, 4, 8, 16, 32)]
    for _ in range(3):
        for x in shapes:
            gf(x)
    stats = gf.stats()
    assert (stats["captures"], stats["churn_eager_calls"]) == (6, 4), stats
    for x in shapes:  # every shape replays now, and the guard has let go after enough hits
        gf(x)
    assert gf.stats()["captures"] == 6


def test_one_key_per_loop_step_and_a_decode_loop_capture_as_before(emulated_backend):
    steps, _ = _runner(emulated_backend)
    latents = torch.randn(2, 8)
    for _ in range(9):
        steps(latents, scale=torch.tensor(0.7))  # a tensor scale: one key for every step
    assert (steps.stats()["captures"], steps.stats()["churn_eager_calls"]) == (1, 0)
    decode, _ = _runner(emulated_backend)
    decode(torch.randn(32, 8))  # the prompt
    for _ in range(16):
        decode(torch.randn(1, 8))  # each new token
    assert (decode.stats()["captures"], decode.stats()["churn_eager_calls"]) == (2, 0)


def test_reset_or_a_limit_of_zero_captures_new_keys_at_once(emulated_backend):
    gf, _ = _runner(emulated_backend)
    x = torch.randn(2, 8)
    for call in range(5):
        gf(x, scale=float(call))
    assert gf.stats()["churn_guarding"] == 1
    gf.reset()
    gf(x, scale=10.0)
    assert gf.stats()["churn_guarding"] == 0 and gf.stats()["captures"] == 3
    every, _ = _runner(emulated_backend, churn_limit=0)
    for call in range(5):
        every(x, scale=float(call))
    assert (every.stats()["captures"], every.stats()["churn_eager_calls"]) == (5, 0)
