"""Fake (meta) implementations of the graphed operators that take tensors, so FakeTensor tracing
and torch.compile can see through a call: the fake forward runs the runner's module forward
operator on the fake inputs, which in turn runs the module under fake mode."""

from __future__ import annotations

import torch

_registered = False


def _fake_forward(runner, key, inputs, keep_alive=(), pin=False, static_outputs=False):
    from ._forward import _runners

    graphed_forward = _runners.get(int(runner))
    if graphed_forward is None:
        raise ValueError(f"graphed: no runner with id {runner} in this process")
    return graphed_forward._run_module(list(inputs))


def register_fakes() -> None:
    global _registered
    if _registered:
        return
    torch.library.register_fake("graphed::forward")(_fake_forward)
    _registered = True
