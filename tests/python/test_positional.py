"""Positional arguments and CPU inputs, where pipelines pass them (issue: drop-in where users put
it). A call's positional arguments are bound to the forward's parameters by name, read from its
signature at construction, and keyed as those keywords: `gf(x, t=t)` and `gf(x=x, t=t)` are one
key. What cannot be bound (too many arguments, *args, positional-only parameters, a keyword-only
forward) is refused with a TypeError that says what to do. `cpu_inputs` is validated here; moving
CPU inputs needs a device, so its figures are in test_patterns_gpu.py. CPU, emulated backend."""

from __future__ import annotations

import pytest
import torch
from graphed import GraphedForward


class Step(torch.nn.Module):
    """A denoiser's call shape: latents positionally, the rest by name."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, hidden_states, timestep=None, *, scale: float = 1.0):
        out = self.proj(hidden_states) * scale
        return out if timestep is None else out + timestep


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(2, 4), torch.randn(2, 1)


def test_positional_arguments_are_keyed_as_the_keywords_they_bind_to(emulated_backend):
    module = Step()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x, t = _inputs()
    with torch.no_grad():
        want = module(x, t, scale=2.0)
    for call in (
        lambda: gf(x, t, scale=2.0),
        lambda: gf(x, timestep=t, scale=2.0),
        lambda: gf(hidden_states=x, timestep=t, scale=2.0),
    ):
        torch.testing.assert_close(call(), want, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, 3)


def test_a_bound_argument_given_twice_is_refused_as_python_would(emulated_backend):
    gf = GraphedForward(Step(), device="cpu", backend=emulated_backend)
    x, t = _inputs()
    with pytest.raises(TypeError, match="multiple values for argument 'hidden_states'"):
        gf(x, hidden_states=x)
    assert gf.stats()["enabled"]


def test_more_positional_arguments_than_parameters_name_the_ones_bound(emulated_backend):
    gf = GraphedForward(Step(), device="cpu", backend=emulated_backend)
    x, t = _inputs()
    with pytest.raises(TypeError, match=r"at most 2 \(hidden_states, timestep\).*by name"):
        gf(x, t, 2.0)


def test_a_keyword_only_forward_stays_keyword_only(emulated_backend):
    gf = GraphedForward(lambda *, x: x + 1, device="cpu", backend=emulated_backend)
    with pytest.raises(TypeError, match="keyword-only; got 1 positional argument"):
        gf(torch.ones(2))
    torch.testing.assert_close(gf(x=torch.ones(2)), torch.full((2,), 2.0))


def test_star_args_and_positional_only_parameters_cannot_be_keyed(emulated_backend):
    def star(x, *rest):
        return x

    def positional_only(x, /, y):
        return x + y

    for forward, why in ((star, r"takes \*rest"), (positional_only, "'x' is positional-only")):
        gf = GraphedForward(forward, device="cpu", backend=emulated_backend)
        with pytest.raises(TypeError, match=why):
            gf(torch.ones(2), torch.ones(2))


def test_a_compiled_module_binds_to_the_forward_it_wraps(emulated_backend):
    compiled = torch.compile(Step())  # nothing is compiled until it is called
    gf = GraphedForward(compiled, device="cpu", backend=emulated_backend)
    assert gf._positional_names == ("hidden_states", "timestep")


def test_cpu_inputs_takes_its_two_choices_only():
    with pytest.raises(ValueError, match="cpu_inputs must be one of 'refuse', 'to_device'"):
        GraphedForward(Step(), device="cpu", cpu_inputs="move")


def test_cpu_inputs_to_device_changes_nothing_for_a_runner_on_the_cpu(emulated_backend):
    module = Step()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, cpu_inputs="to_device")
    x, t = _inputs()
    with torch.no_grad():
        want = module(x, t)
    torch.testing.assert_close(gf(x, t), want, rtol=0, atol=0)
    assert gf.stats()["captures"] == 1
