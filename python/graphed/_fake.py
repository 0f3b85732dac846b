"""Fake (meta) implementations of the graphed operators that take tensors, so FakeTensor tracing,
torch.compile, torch.export and torch.library.opcheck can see through a call: the fake forward
runs what the runner would run on the fake inputs. For a GraphedForward's runner that is the
module (under fake mode); for a graphed.Runner's, its forward operator, whose own fake
implementation gives the shapes. Both register it with the runner (graphed._ops)."""

from __future__ import annotations

import torch

from . import _ops

_registered = False


def _fake_forward(runner, key, inputs, keep_alive=(), pin=False, static_outputs=False):
    forward = _ops.traced_forward(int(runner))
    if forward is None:
        raise ValueError(
            f"graphed: no runner with id {runner} made through graphed.GraphedForward or "
            "graphed.Runner in this process; tracing a call needs one of those (a runner made "
            "with torch.ops.graphed.create directly has no fake implementation)"
        )
    return forward(list(inputs))


def register_fakes() -> None:
    global _registered
    if _registered:
        return
    torch.library.register_fake("graphed::forward")(_fake_forward)
    _registered = True
