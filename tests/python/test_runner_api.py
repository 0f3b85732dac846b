"""graphed.Runner, the operator path as an object: it captures once per key and shape on the
emulated backend, lists its entries, closes (also as a context manager) and refuses use after
close; torch.ops.graphed.create has schema defaults; destroying an id that is not live is a
ValueError; torch.ops.graphed.forward releases every tensor passed to it exactly once, from any
thread and on errors too; GraphedForward forwards attribute access to its module and has a
readable repr."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import graphed
import pytest
import torch

_library = torch.library.Library("graphed_runner_api_test", "DEF")
_library.define("double(Tensor[] inputs) -> Tensor[]")
_library.impl("double", lambda inputs: [inputs[0] * 2], "CompositeExplicitAutograd")


def test_runner_captures_per_key_and_closes(emulated_backend):
    with graphed.Runner(
        "graphed_runner_api_test::double", device="cpu", backend=emulated_backend, name="doubler"
    ) as runner:
        x = torch.arange(4.0)
        (y,) = runner.forward("k", [x])
        torch.testing.assert_close(y, x * 2)
        runner.forward("k", [x + 1])
        stats = runner.stats()
        assert (stats["captures"], stats["replays"]) == (1, 2)
        (entry,) = runner.entries()
        assert entry["shapes"] == "f32[4]" and entry["replays"] == 2
        assert 0 < entry["capture_seconds"] < 60, entry
        assert "doubler" in repr(runner)
    with pytest.raises(ValueError, match="closed"):
        runner.forward("k", [x])
    runner.close()  # idempotent


def test_create_has_schema_defaults_and_destroy_refuses_unknown_ids():
    runner_id = torch.ops.graphed.create(
        "defaults", "graphed_runner_api_test::double", torch.device("cpu")
    )
    torch.ops.graphed.destroy(runner_id)
    with pytest.raises(ValueError, match=f"no runner with id {runner_id} to destroy"):
        torch.ops.graphed.destroy(runner_id)


def test_forward_operator_releases_every_tensor_it_was_given_once(emulated_backend):
    """The operator's kernel releases its argument lists itself, holding the GIL once (see
    shim/gf_shim_ops.cpp): no reference may be kept or dropped twice, on a replay, from several
    threads at once, or when the call fails. The capturing call's entry keeps every tensor alive
    too (keep_alive), so that a reference dropped twice would show as a lower count here rather
    than as a freed tensor."""
    with graphed.Runner(
        "graphed_runner_api_test::double", device="cpu", backend=emulated_backend
    ) as runner:
        inputs = [torch.arange(4.0) + i for i in range(3)]
        held = [torch.ones(2)]
        forward = torch.ops.graphed.forward
        forward(runner.runner_id, "k", inputs, held + inputs)  # the capture
        counts = [sys.getrefcount(t) for t in inputs + held]
        for _ in range(2):
            (y,) = forward(runner.runner_id, "k", inputs, held)
            torch.testing.assert_close(y, inputs[0] * 2)

        def replay_many() -> None:
            for _ in range(200):
                forward(runner.runner_id, "k", inputs, held, False, False)

        threads = [threading.Thread(target=replay_many) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with pytest.raises(ValueError, match="no runner"):
            forward(runner.runner_id + 1_000_000, "k", inputs, held)
        with pytest.raises(TypeError, match="input tensor 1"):
            forward(runner.runner_id, "k", [inputs[0], torch.randn(2).to_sparse()], held)
        assert [sys.getrefcount(t) for t in inputs + held] == counts
        assert runner.stats()["replays"] == 3 + 3 * 200  # the capturing call replays too
        # Once the entry is gone, the last reference is the caller's: dropping it frees the tensor.
        runner.reset()
        gone = weakref.ref(inputs[2])
        del inputs[2]
        gc.collect()
        assert gone() is None


class WithConfig(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 3.0
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, *, x):
        return self.linear(x) * self.scale


def test_graphed_forward_forwards_attributes_and_has_a_repr():
    gf = graphed.GraphedForward(WithConfig(), device="cpu", name="configured")
    assert gf.scale == 3.0
    assert gf.linear.weight.shape == (2, 2)
    with pytest.raises(AttributeError):
        _ = gf.no_such_attribute
    text = repr(gf)
    assert text.startswith("GraphedForward(WithConfig, name='configured', device=cpu")


def test_a_device_runner_without_graphs_refuses_a_cpu_input_as_graphed_forward_does():
    # On a machine where no backend serves the device, no graph would ever run and so the core's
    # device check never would: the runner refuses as GraphedForward does, naming the input.
    runner = graphed.Runner("graphed_runner_api_test::double", device="cuda")
    if runner.stats()["disabled_cause"] != "unavailable":
        pytest.skip("a backend serves cuda here: the core checks devices itself")
    with pytest.raises(ValueError, match=r"^graphed: input tensor 0 is on cpu; the runner is on"):
        runner.forward("k", [torch.ones(2)])
    runner.close()
