"""Fake (meta) implementations of the graphed operators that take tensors, so FakeTensor tracing,
torch.compile, torch.export and torch.library.opcheck can see through a call: the fake forward
runs what the runner would run on the fake inputs. For a GraphedForward's runner that is the
module (under fake mode); for a graphed.Runner's, its forward operator, whose own fake
implementation gives the shapes."""

from __future__ import annotations

import torch

_registered = False

# runner id -> forward operator ("namespace::name") of the runners graphed.Runner made.
operator_runners: dict[int, str] = {}


def _operator(qualified_name: str):
    namespace, _, name = qualified_name.partition("::")
    return getattr(getattr(torch.ops, namespace), name)


def _fake_forward(runner, key, inputs, keep_alive=(), pin=False, static_outputs=False):
    from ._forward import _runners

    graphed_forward = _runners.get(int(runner))
    if graphed_forward is not None:
        return graphed_forward._run_module(list(inputs))
    forward_op = operator_runners.get(int(runner))
    if forward_op is not None:
        return _operator(forward_op)(list(inputs))
    raise ValueError(
        f"graphed: no runner with id {runner} made through graphed.GraphedForward or "
        "graphed.Runner in this process; tracing a call needs one of those (a runner made with "
        "torch.ops.graphed.create directly has no fake implementation)"
    )


def register_fakes() -> None:
    global _registered
    if _registered:
        return
    torch.library.register_fake("graphed::forward")(_fake_forward)
    _registered = True
