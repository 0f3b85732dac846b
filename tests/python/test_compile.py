"""graphed inside a region torch.compile or torch.export traces: the tracer sees the wrapped
module itself, so fullgraph compiles without a graph break or warning, and an exported program
holds the module's weights and runs. (graphed over a compiled module is the other direction,
measured in the benchmark.)"""

from __future__ import annotations

import warnings

import torch
from graphed import GraphedForward


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, *, x):
        return torch.relu(self.linear(x))


class Caller(torch.nn.Module):
    """Model code that calls a GraphedForward for part of its work."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.graphed = GraphedForward(self.block, device="cpu")

    def forward(self, x):
        return self.graphed(x=x) * 2


def test_fullgraph_compile_traces_through_without_a_warning():
    torch._dynamo.reset()
    model = Caller()
    x = torch.randn(4, 8)
    with torch.no_grad():
        want = model.block(x=x) * 2
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            got = compiled(x)
    torch.testing.assert_close(got, want)


def test_export_holds_the_weights_and_runs():
    model = Caller()
    x = torch.randn(4, 8)
    program = torch.export.export(model, (x,))
    names = set(program.state_dict)
    assert any(name.endswith("linear.weight") for name in names), names
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model.block(x=x) * 2)
