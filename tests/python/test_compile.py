"""graphed inside a region torch.compile or torch.export traces: the tracer sees the wrapped
module itself, so fullgraph compiles without a graph break or warning, and an exported program
holds the module's weights and runs; on the operator path, torch.ops.graphed.forward of a
graphed.Runner passes torch.library.opcheck, carries pt2_compliant_tag and compiles with
fullgraph; and graphed over a compiled module, the other direction, captures once per shape."""

from __future__ import annotations

import warnings

import graphed
import pytest
import torch
from graphed import GraphedForward

_library = torch.library.Library("graphed_compile_test", "DEF")
_library.define("step(Tensor[] inputs) -> Tensor[]")


@torch.library.impl(_library, "step", "CompositeExplicitAutograd")
def _step(inputs):
    return [inputs[0] * 2 + inputs[1], inputs[0].sum()]


torch.library.register_fake("graphed_compile_test::step", lib=_library)(_step)


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


def _step_arguments(runner: graphed.Runner) -> tuple:
    return (runner.runner_id, "k", [torch.randn(3), torch.randn(3)], [], False, False)


def test_opcheck_passes_on_a_runners_forward(emulated_backend):
    assert torch.Tag.pt2_compliant_tag in torch.ops.graphed.forward.default.tags
    with graphed.Runner(
        "graphed_compile_test::step", device="cpu", backend=emulated_backend
    ) as runner:
        results = torch.library.opcheck(torch.ops.graphed.forward.default, _step_arguments(runner))
    assert set(results.values()) == {"SUCCESS"}, results


def test_fullgraph_compile_of_the_operator_path(emulated_backend):
    with graphed.Runner(
        "graphed_compile_test::step", device="cpu", backend=emulated_backend
    ) as runner:
        runner_id = runner.runner_id

        def model(x, y):
            doubled, total = torch.ops.graphed.forward(runner_id, "k", [x, y], [])
            return doubled + total

        compiled = torch.compile(model, fullgraph=True, backend="eager")
        x, y = torch.randn(3), torch.randn(3)
        torch.testing.assert_close(compiled(x, y), x * 2 + y + x.sum(), rtol=0, atol=0)
        assert runner.stats()["captures"] == 1


def test_tracing_a_runner_made_without_the_python_api_says_what_to_use(emulated_backend):
    runner_id = torch.ops.graphed.create("raw", "graphed_compile_test::step", torch.device("cpu"))
    try:
        with pytest.raises(Exception, match="made through graphed.GraphedForward or graphed"):
            torch.library.opcheck(
                torch.ops.graphed.forward.default,
                (runner_id, "k", [torch.randn(3), torch.randn(3)], [], False, False),
                test_utils=("test_faketensor",),
            )
    finally:
        torch.ops.graphed.destroy(runner_id)


def test_graphed_over_a_compiled_module_captures_once_per_shape(emulated_backend):
    block = Block()
    compiled = torch.compile(block, backend="eager", dynamic=False, fullgraph=True)
    gf = GraphedForward(compiled, device="cpu", backend=emulated_backend)
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(gf(x=x), block(x=x), rtol=0, atol=0)  # the capturing call
    gf(x=torch.randn(4, 8))
    gf(x=torch.randn(2, 8))  # a new shape: one more compile (dynamic=False) and one capture
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (2, 3, 0)
