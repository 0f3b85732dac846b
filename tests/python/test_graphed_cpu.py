"""CPU tests of GraphedForward and the graphed operators on a machine with no graph backend.

Most machines that run this test suite (CI, laptops) have no GPU, and graphed must then be a
transparent, eager-running wrapper: same results as the module, honest stats, one warning per
process, the same argument checking as on a GPU, and operators that work when called directly
from Python and under FakeTensor tracing. These tests pin that behaviour down; they need the
native library built, but no device (one borrows the emulated CPU backend to have a capturing
runner to disable).
The forward's own exceptions and the reason of a failed capture, as the caller sees them, are
here too.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import logging
import textwrap
import threading
import time
from typing import NamedTuple

import graphed
import graphed._observe as graphed_observe
import pytest
import torch
import torch.nn.functional as F
from graphed import GraphedForward
from graphed._arguments import RESERVED_KWARGS
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

CPU = torch.device("cpu")


def _graphs_unavailable_here() -> bool:
    probe = GraphedForward(lambda *, x: x, device="cpu")
    return probe.disabled_reason.startswith("graphs unavailable")


pytestmark = pytest.mark.skipif(
    not _graphs_unavailable_here(),
    reason="these tests cover the no-graph-backend path; this machine can capture CPU graphs",
)


class TinyMlp(torch.nn.Module):
    """A small keyword-only forward with parameters, a dict input and an optional tensor."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(width, 2 * width)
        self.out = torch.nn.Linear(2 * width, width)

    def forward(self, *, x, cond, bias=None, scale: float = 1.0):
        h = F.gelu(self.inp(x + cond["shift"]))
        y = self.out(h) * scale
        if bias is not None:
            y = y + bias
        return y


def _inputs(rows: int = 5, width: int = 16) -> dict:
    return {
        "x": torch.randn(rows, width),
        "cond": {"shift": torch.randn(width)},
        "bias": torch.randn(width),
        "scale": 0.5,
    }


@pytest.fixture
def module() -> TinyMlp:
    torch.manual_seed(0)
    return TinyMlp().eval()


def test_results_equal_the_eager_module(module):
    gf = GraphedForward(module, device="cpu")
    for rows in (5, 5, 7, 5):
        kwargs = _inputs(rows)
        out = gf(**kwargs)
        with torch.no_grad():
            expected = module(**kwargs)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert out.shape == (rows, 16)


def test_stats_report_graphs_unavailable_and_count_eager_calls(module):
    gf = GraphedForward(module, device="cpu", name="cpu_stats")
    stats = gf.stats()
    assert stats["enabled"] is False
    assert stats["eager_calls"] == 0
    assert stats["disabled_reason"].startswith("graphs unavailable")
    assert gf.disabled_reason == stats["disabled_reason"]
    assert stats["backend"] == graphed.backend()[0]
    assert isinstance(stats["backend"], str) and stats["backend"]
    for call in range(1, 4):
        gf(**_inputs())
        stats = gf.stats()
        assert stats["eager_calls"] == call
        assert stats["captures"] == 0
        assert stats["replays"] == 0
        assert stats["graphs"] == 0
        assert stats["pool_bytes"] == 0
    assert gf.num_graphs == 0


def test_enabled_false_is_reported_as_the_callers_choice(module):
    gf = GraphedForward(module, device="cpu", enabled=False)
    assert gf.stats()["enabled"] is False
    assert "enabled=False" in gf.disabled_reason
    kwargs = _inputs()
    with torch.no_grad():
        expected = module(**kwargs)
    torch.testing.assert_close(gf(**kwargs), expected, rtol=0, atol=0)
    assert gf.stats()["eager_calls"] == 1


def test_graphs_unavailable_warning_is_logged_once_per_process(module, caplog, monkeypatch):
    # Whichever GraphedForward a process creates first emits the warning; start from a clean
    # slate so this test does not depend on the order the tests run in.
    monkeypatch.setattr(graphed_observe, "_warned_unavailable", False)
    caplog.set_level(logging.WARNING, logger="graphed")

    def unavailable_records() -> list[logging.LogRecord]:
        return [
            record
            for record in caplog.records
            if record.name == "graphed" and "graphs unavailable" in record.getMessage()
        ]

    first = GraphedForward(module, device="cpu")
    records = unavailable_records()
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert first.disabled_reason in records[0].getMessage()

    second = GraphedForward(module, device="cpu")
    second(**_inputs())
    first(**_inputs())
    assert len(unavailable_records()) == 1


def test_positional_arguments_are_a_type_error(module):
    gf = GraphedForward(module, device="cpu")
    with pytest.raises(TypeError, match="keyword-only"):
        gf(torch.randn(5, 16))
    assert gf.stats()["eager_calls"] == 0


class Holder:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def test_object_holding_a_tensor_is_a_type_error():
    def forward(*, x, extra):
        return x + extra.tensor

    gf = GraphedForward(forward, device="cpu")
    with pytest.raises(TypeError, match=r"kwargs\['extra'\]\.tensor"):
        gf(x=torch.randn(3), extra=Holder(torch.randn(3)))
    assert gf.stats()["eager_calls"] == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_entries", 0), ("max_entries", -3), ("warmup_iters", -1), ("max_entries", True)],
)
def test_bad_options_are_value_errors(module, option, value):
    with pytest.raises(ValueError, match=option):
        GraphedForward(module, device="cpu", **{option: value})


def test_disable_keeps_calls_eager(module):
    gf = GraphedForward(module, device="cpu")
    first_reason = gf.disabled_reason
    gf.disable("turned off by the test")
    stats = gf.stats()
    assert stats["enabled"] is False
    # The first reason sticks: the runner was already disabled for want of a graph backend.
    assert stats["disabled_reason"] == first_reason
    for call in range(1, 3):
        kwargs = _inputs()
        with torch.no_grad():
            expected = module(**kwargs)
        torch.testing.assert_close(gf(**kwargs), expected, rtol=0, atol=0)
        assert gf.stats()["eager_calls"] == call
        assert gf.stats()["captures"] == 0


def test_disable_of_a_capturing_runner_drops_its_graphs_and_runs_eager(module, emulated_backend):
    # The emulated backend captures on the CPU, so the runner starts enabled here.
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    kwargs = _inputs()
    with torch.no_grad():
        expected = module(**kwargs)
    torch.testing.assert_close(gf(**kwargs), expected, rtol=0, atol=0)
    stats = gf.stats()
    assert (stats["enabled"], stats["captures"], stats["graphs"]) == (True, 1, 1)
    gf.disable("turned off by the test")
    gf.disable("a later reason does not replace the first")
    stats = gf.stats()
    assert stats["enabled"] is False
    assert stats["disabled_reason"] == "turned off by the test"
    assert stats["graphs"] == 0
    assert stats["pool_bytes"] == 0
    kwargs = _inputs()
    with torch.no_grad():
        expected = module(**kwargs)
    torch.testing.assert_close(gf(**kwargs), expected, rtol=0, atol=0)
    stats = gf.stats()
    assert (stats["eager_calls"], stats["captures"], stats["replays"]) == (1, 1, 1)


class Pair(NamedTuple):
    first: torch.Tensor
    label: str


def test_output_trees_round_trip():
    def forward(*, x, y):
        return {
            "sum": x + y,
            "parts": (x * 2, [y - 1, 7], Pair(x * y, "prod")),
            "meta": {"rows": x.shape[0], "name": "out", "none": None, "dtype": x.dtype},
        }

    gf = GraphedForward(forward, device="cpu")
    for _ in range(2):
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        out = gf(x=x, y=y)
        expected = forward(x=x, y=y)
        assert type(out) is dict and list(out) == ["sum", "parts", "meta"]
        torch.testing.assert_close(out["sum"], expected["sum"], rtol=0, atol=0)
        parts = out["parts"]
        assert type(parts) is tuple and len(parts) == 3
        torch.testing.assert_close(parts[0], x * 2, rtol=0, atol=0)
        assert type(parts[1]) is list
        torch.testing.assert_close(parts[1][0], y - 1, rtol=0, atol=0)
        assert parts[1][1] == 7
        assert type(parts[2]) is Pair and parts[2].label == "prod"
        torch.testing.assert_close(parts[2].first, x * y, rtol=0, atol=0)
        assert out["meta"] == {"rows": 4, "name": "out", "none": None, "dtype": torch.float32}


def test_bare_tensor_and_tuple_outputs_round_trip():
    tensor_gf = GraphedForward(lambda *, x: x * 3, device="cpu")
    x = torch.randn(6)
    out = tensor_gf(x=x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, x * 3, rtol=0, atol=0)

    tuple_gf = GraphedForward(lambda *, x: (x + 1, "tag", 2.5), device="cpu")
    out = tuple_gf(x=x)
    assert type(out) is tuple and len(out) == 3
    torch.testing.assert_close(out[0], x + 1, rtol=0, atol=0)
    assert out[1:] == ("tag", 2.5)


def test_call_without_tensors_runs_the_module():
    gf = GraphedForward(lambda *, n, word: word * n, device="cpu")
    assert gf(n=3, word="ab") == "ababab"


_test_library = torch.library.Library("graphed_test_ops", "DEF")
_test_library.define("fwd(Tensor[] inputs) -> Tensor[]")
_fwd_calls: list[int] = []


def _fwd(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    _fwd_calls.append(len(inputs))
    return [inputs[0] * 2 + 1]


_test_library.impl("fwd", _fwd, "CompositeExplicitAutograd")


@pytest.fixture
def raw_runner():
    runner = torch.ops.graphed.create(
        "raw_cpu", "graphed_test_ops::fwd", torch.device("cpu"), 4, 1, True, None
    )
    yield runner
    with contextlib.suppress(ValueError):  # a test may have destroyed it already
        torch.ops.graphed.destroy(runner)


def test_forward_operator_callable_directly(raw_runner):
    _fwd_calls.clear()
    t = torch.randn(3, 2)
    outputs = torch.ops.graphed.forward(raw_runner, "key", [t], [], False, False)
    assert isinstance(outputs, list) and len(outputs) == 1
    torch.testing.assert_close(outputs[0], t * 2 + 1, rtol=0, atol=0)
    assert _fwd_calls == [1]
    counters, backend, reason, cause = torch.ops.graphed.stats(raw_runner)
    assert backend == graphed.backend()[0]
    assert reason.startswith("graphs unavailable")
    eager_calls = counters[5]
    assert eager_calls == 1
    # The defaults of keep_alive, pin and static_outputs may be left out; keep_alive may be None.
    outputs = torch.ops.graphed.forward(raw_runner, "key", [t], [])
    torch.testing.assert_close(outputs[0], t * 2 + 1, rtol=0, atol=0)
    outputs = torch.ops.graphed.forward(raw_runner, "key", [t])
    torch.testing.assert_close(outputs[0], t * 2 + 1, rtol=0, atol=0)
    outputs = torch.ops.graphed.forward(raw_runner, "key", [t], None, False, True)
    torch.testing.assert_close(outputs[0], t * 2 + 1, rtol=0, atol=0)
    assert torch.ops.graphed.stats(raw_runner)[0][5] == 4


def test_unknown_forward_operator_is_a_value_error():
    with pytest.raises(ValueError, match="graphed_test_ops::missing"):
        torch.ops.graphed.create(
            "raw_cpu", "graphed_test_ops::missing", torch.device("cpu"), 4, 1, True, None
        )
    with pytest.raises(ValueError, match="namespace::name"):
        torch.ops.graphed.create("raw_cpu", "no_namespace", torch.device("cpu"), 4, 1, True, None)


def test_unknown_runner_id_is_a_value_error(raw_runner):
    missing = raw_runner + 1_000_000
    with pytest.raises(ValueError, match=f"no runner with id {missing}"):
        torch.ops.graphed.forward(missing, "key", [torch.randn(2)], [], False, False)
    with pytest.raises(ValueError, match="no runner"):
        torch.ops.graphed.stats(missing)
    torch.ops.graphed.destroy(raw_runner)
    with pytest.raises(ValueError, match="no runner"):
        torch.ops.graphed.forward(raw_runner, "key", [torch.randn(2)], [], False, False)
    with pytest.raises(ValueError, match=f"no runner with id {raw_runner} to destroy"):
        torch.ops.graphed.destroy(raw_runner)


def test_fake_tensor_call_gives_the_right_shapes(module):
    gf = GraphedForward(module, device="cpu")
    with FakeTensorMode(allow_non_fake_inputs=True):
        kwargs = {
            "x": torch.empty(9, 16),
            "cond": {"shift": torch.empty(16)},
            "bias": None,
            "scale": 2.0,
        }
        assert isinstance(kwargs["x"], FakeTensor)
        out = gf(**kwargs)
    assert isinstance(out, FakeTensor)
    assert out.shape == (9, 16)
    assert out.dtype == torch.float32
    # Tracing does not run the module for real, so nothing is counted as an eager call.
    assert gf.stats()["eager_calls"] == 0


def test_fake_tensor_call_with_capture_context_and_tree_output():
    entered = []

    @contextlib.contextmanager
    def context():
        entered.append(True)
        yield

    def forward(*, x, y):
        return {"cat": torch.cat([x, y]), "mean": (x.mean(0), y.dtype)}

    gf = GraphedForward(forward, device="cpu", capture_context=context)
    with FakeTensorMode():
        out = gf(x=torch.empty(2, 5), y=torch.empty(3, 5))
    assert isinstance(out["cat"], FakeTensor)
    assert out["cat"].shape == (5, 5)
    assert out["mean"][0].shape == (5,)
    assert out["mean"][1] == torch.float32
    # Real calls afterwards still give real, correct results.
    x, y = torch.randn(2, 5), torch.randn(3, 5)
    real = gf(x=x, y=y)
    assert not isinstance(real["cat"], FakeTensor)
    torch.testing.assert_close(real["cat"], torch.cat([x, y]), rtol=0, atol=0)


class Scaled(NamedTuple):
    """A namedtuple input: the C entry point does not walk it, so calls take the Python path."""

    x: torch.Tensor
    scale: float


class SleepyScale(torch.nn.Module):
    """Sleeps inside the forward, so the thread running it gives the GIL away mid-call."""

    def forward(self, *, pair=None, x=None, scale=None):
        time.sleep(0.002)
        if pair is not None:
            return pair.x * pair.scale
        return x * scale


@pytest.mark.parametrize("path", ["c_entry_point", "python_path"])
def test_threads_sharing_a_runner_neither_deadlock_nor_mix_calls(path, emulated_backend):
    # churn_limit=0: the threads' three keys come at once, and each must capture at first sight.
    gf = GraphedForward(SleepyScale(), device="cpu", backend=emulated_backend, churn_limit=0)
    failures: list[str] = []
    calls = 10

    def worker(rows: int) -> None:
        for call in range(calls):
            # Each thread has its own scale, so a call run with another thread's state shows.
            x = torch.randn(rows, 2)
            try:
                if path == "python_path":
                    out = gf(pair=Scaled(x, float(rows)))
                else:
                    out = gf(x=x, scale=float(rows))
            except Exception as error:  # reported below, the thread must not die silently
                failures.append(f"rows {rows}: {type(error).__name__}: {error}")
                return
            if out.shape != (rows, 2):
                failures.append(f"rows {rows}: got shape {tuple(out.shape)}")
            # The emulated launch does no work: only the capturing call's output is computed.
            if call == 0 and not torch.equal(out, x * rows):
                failures.append(f"rows {rows}: the first call was run with another call's state")

    threads = [threading.Thread(target=worker, args=(rows,)) for rows in (3, 5, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a call deadlocked"
    assert failures == []
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (3, 3 * calls)


def test_input_on_another_device_is_a_value_error_and_the_runner_stays_usable(emulated_backend):
    gf = GraphedForward(SleepyScale(), device="cpu", backend=emulated_backend)
    # A meta tensor (the one other device a CPU machine has) holds no data: both paths refuse it
    # with the same check before the core's device check (graphed::unsupported_tensor_reason).
    with pytest.raises(TypeError, match=r"kwargs\['x'\] is a meta tensor"):
        gf(x=torch.empty(2, 2, device="meta"), scale=2.0)
    x = torch.randn(2, 2)
    torch.testing.assert_close(gf(x=x, scale=2.0), x * 2, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1


# A machine without a GPU: a device="cuda" runner has no graphs, and no tensor can be on cuda.
# On a GPU the core refuses a CPU tensor (test_patterns_gpu.py); here graphed must too.
_WITHOUT_A_GPU = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="shows a machine without a GPU; the GPU's own refusal is test_patterns_gpu.py's",
)


def _rotated(x, *, rotary, pair=None):
    return x * rotary[0].to(x.device) + rotary[1].to(x.device)


@_WITHOUT_A_GPU
@pytest.mark.parametrize("path", ["fast", "python"])
@pytest.mark.parametrize("positional", [False, True])
def test_a_cuda_runner_without_a_gpu_refuses_a_cpu_tensor_as_the_gpu_does(path, positional):
    gf = GraphedForward(_rotated, device="cuda", name="rotary")
    assert gf.disabled_reason.startswith("graphs unavailable"), gf.disabled_reason
    x = torch.randn(4)
    rotary = (torch.randn(4), torch.randn(4))
    extra = {"pair": Pair(1, 2)} if path == "python" else {}
    arguments = ((x,), {}) if positional else ((), {"x": x})
    with pytest.raises(ValueError) as refused:
        gf(*arguments[0], **arguments[1], rotary=rotary, **extra)
    message = str(refused.value)
    # The GPU's words (graphed::word_input_error), then what to do on this machine.
    assert message.startswith(
        "graphed: kwargs['x'] is on cpu; the runner is on cuda: move the tensor there before "
        "the call (tensor.to('cuda')), or let GraphedForward(..., cpu_inputs='to_device')"
    ), message
    assert "Graphs are unavailable here" in message and "device='cpu'" in message, message
    with pytest.raises(
        ValueError, match=r"kwargs\['rotary'\]\[0\] is on cpu; the runner is on cuda"
    ):
        gf(x=2.0, rotary=rotary, **extra)  # the path of a nested tensor
    # The refusal leaves the runner as it was (refused inputs never reached the module).
    assert gf.disabled_reason.startswith("graphs unavailable"), gf.disabled_reason


@_WITHOUT_A_GPU
def test_a_cuda_runner_without_a_gpu_runs_eager_what_it_accepts():
    x, rotary = torch.randn(4), (torch.randn(4), torch.randn(4))
    staging = GraphedForward(_rotated, device="cuda", cpu_inputs="to_device")
    # cpu_inputs="to_device": eager gets the CPU tensors as passed, as a disabled runner on a GPU.
    torch.testing.assert_close(
        staging(x, rotary=rotary), _rotated(x, rotary=rotary), rtol=0, atol=0
    )
    refusing = GraphedForward(lambda *, x, n: x * n, device="cuda")
    assert refusing(x=3, n=2) == 6  # no tensor: nothing to refuse, the forward runs
    chosen = GraphedForward(_rotated, device="cuda", enabled=False)
    # enabled=False runs every call eager without the device check, as on a GPU.
    torch.testing.assert_close(chosen(x, rotary=rotary), _rotated(x, rotary=rotary), rtol=0, atol=0)
    assert (staging.stats()["eager_calls"], chosen.stats()["eager_calls"]) == (1, 1)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_runner_without_graphs_raises_what_the_api_reference_says(device):
    """docs/api.md's errors of a call, on a runner whose graphs are unavailable: the forward's
    own exception as it raised it, once (not a RuntimeError wrapping it), and the walker's
    refusals by kwarg path."""
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a machine without a GPU")
    runs = []

    def forward(*, x, fail):
        runs.append(1)
        if fail:
            raise KeyError("from the forward")
        return x * 2

    gf = GraphedForward(forward, device=device, cpu_inputs="to_device")
    assert gf.disabled_reason.startswith("graphs unavailable"), gf.disabled_reason
    with pytest.raises(KeyError, match="^'from the forward'$"):
        gf(x=torch.ones(2), fail=True)
    assert len(runs) == 1
    with pytest.raises(TypeError, match=r"^graphed: kwargs\['x'\] is a meta tensor"):
        gf(x=torch.empty(2, device="meta"), fail=False)
    with pytest.raises(ValueError, match=r"^graphed: kwargs\['x'\] has 13 dimensions"):
        gf(x=torch.zeros([1] * 13), fail=False)
    torch.testing.assert_close(gf(x=torch.ones(2), fail=False), torch.full((2,), 2.0))
    assert len(runs) == 2


def test_a_disabled_runners_forward_that_raises_value_error_runs_once():
    """A runner disabled for good answers its calls in Python: the ValueError of its forward, with
    a CPU input among the kwargs of a cpu_inputs="to_device" runner, is the forward's own, raised
    after one run and one eager call counted (it was once taken for the core's refusal of a CPU
    input, and the forward ran again)."""
    runs = []

    def forward(*, x, scale):
        runs.append(1)
        raise ValueError("from the forward")

    gf = GraphedForward(forward, device="cuda", cpu_inputs="to_device")
    gf.disable("disabled by the test")
    assert not gf.stats()["enabled"]
    with pytest.raises(ValueError, match="^from the forward$"):
        gf(x=torch.ones(2), scale=2.0)
    assert len(runs) == 1
    assert gf.stats()["eager_calls"] == 1


def test_a_disabled_runner_refuses_and_counts_as_the_core_did(emulated_backend):
    """The Python answer of a runner disabled for good keeps what the core's eager path did: the
    walker's refusals by kwarg path, one count per call answered eagerly (by its reason in
    eager_by_reason), and kwargs the C walker does not take through the dispatcher."""
    runs = []

    def forward(*, x, again=False, pair=None):
        runs.append(1)
        return {"y": gf(x=x)["y"] if again else x + 1, "n": len(runs)}

    gf = GraphedForward(forward, device="cpu", backend=emulated_backend)
    gf.disable("disabled by the test")
    out = gf(x=torch.ones(2), again=True)  # the inner call runs eager, counted by its reason
    torch.testing.assert_close(out["y"], torch.full((2,), 2.0))
    by_reason = gf.stats()["eager_by_reason"]
    assert (out["n"], gf.stats()["eager_calls"]) == (2, 2)
    assert by_reason == {"disabled": 1, "reentered": 1}, by_reason
    with pytest.raises(TypeError, match=r"kwargs\['x'\] is a meta tensor"):
        gf(x=torch.empty(2, device="meta"))
    with pytest.raises(ValueError, match=r"kwargs\['x'\] has 13 dimensions"):
        gf(x=torch.zeros([1] * 13))
    assert gf(x=3.0)["y"] == 4.0  # no tensor: counted by its reason
    assert gf(x=torch.ones(2), pair=Pair(torch.ones(2), "p"))["n"] == 4  # the Python path
    stats = gf.stats()
    # Every call answered eagerly counts once, whichever route ran it: the core's (the Python
    # path through the dispatcher) too.
    assert (stats["eager_calls"], stats["captures"], len(runs)) == (4, 0, 4)
    assert stats["eager_by_reason"] == {"disabled": 1, "reentered": 1, "no_tensors": 1}


def test_a_runner_without_graphs_keeps_its_type_and_checks_in_its_eager_run(emulated_backend):
    """The device check of a runner without graphs runs in its eager run (no class swap: the
    runner stays a plain GraphedForward), and a runner that can graph leaves it to the core."""
    runners = [
        GraphedForward(lambda *, x: x, device="cpu", backend=emulated_backend),
        GraphedForward(lambda *, x: x, device="cpu"),
        GraphedForward(lambda *, x: x, device="cuda", enabled=False),
        GraphedForward(lambda *, x: x, device="cuda"),
    ]
    assert all(type(runner) is GraphedForward for runner in runners)
    x = torch.randn(2)
    for runner in runners[:3]:
        assert torch.equal(runner(x=x), x)  # CPU runners, and a disabled one: no device check


@pytest.mark.parametrize("emulated_backend", ["failing"], indirect=True)
def test_failed_capture_disables_the_runner_and_returns_the_eager_result(module, emulated_backend):
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    assert gf.stats()["enabled"] is True
    for call in range(1, 3):
        kwargs = _inputs()
        with torch.no_grad():
            expected = module(**kwargs)
        torch.testing.assert_close(gf(**kwargs), expected, rtol=0, atol=0)
        stats = gf.stats()
        assert stats["backend"] == emulated_backend
        assert stats["enabled"] is False
        assert "emulated capture failure" in stats["disabled_reason"]
        assert (stats["captures"], stats["graphs"], stats["eager_calls"]) == (0, 0, call)


def test_non_tensor_outputs_of_eager_calls_are_not_frozen():
    gf = GraphedForward(lambda *, x: (x, float(x.sum())), device="cpu", enabled=False)
    assert gf(x=torch.ones(2))[1] == 2.0
    assert gf(x=torch.full((2,), 5.0))[1] == 10.0


class ForwardOnly:
    """Has a forward method but no __call__: GraphedForward calls module(**kwargs)."""

    def forward(self, *, x):
        return x


@pytest.mark.parametrize(
    ("module", "named"),
    [
        (42, "got int 42, which is not callable"),
        (None, "got NoneType None, which is not callable"),
        (ForwardOnly(), "got ForwardOnly <"),
    ],
)
def test_what_is_not_callable_is_refused_at_construction(module, named):
    with pytest.raises(TypeError) as refused:
        GraphedForward(module, device="cpu")
    message = str(refused.value)
    assert named in message and "a callable run as module(**kwargs)" in message, message
    if isinstance(module, ForwardOnly):
        assert "GraphedForward(obj.forward, ...)" in message, message


def test_the_call_path_tests_for_exactly_the_reserved_keywords():
    """__call__ tests for its options by literal names, the fastest test there is; they must be
    RESERVED_KWARGS, the one list the rest of graphed reads."""
    assert RESERVED_KWARGS == ("variant", "keep_alive", "pin", "static_outputs")
    source = textwrap.dedent(inspect.getsource(GraphedForward.__call__))
    tested = [
        node.left.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare)
        and isinstance(node.ops[0], ast.In)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.comparators[0], ast.Name)
        and node.comparators[0].id == "kwargs"
    ]
    assert sorted(tested) == sorted(RESERVED_KWARGS)


@pytest.mark.parametrize("name", RESERVED_KWARGS)
def test_a_module_keyword_graphed_reserves_is_refused_at_construction(name):
    namespace: dict = {}
    exec(f"def forward(*, x, {name}=None):\n    return x", namespace)
    with pytest.raises(TypeError, match=f"reserves.*{name}|{name}.*reserves"):
        GraphedForward(namespace["forward"], device="cpu")


@pytest.mark.parametrize("error_type", [ValueError, KeyError, KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("path", ["fast", "python"])
def test_the_forwards_own_exception_keeps_its_type_runs_once_and_disables_nothing(
    emulated_backend, error_type, path
):
    runs = []

    def forward(*, x, fail, pair=None):
        runs.append(1)
        if fail:
            raise error_type("from the forward")
        return x * 2

    gf = GraphedForward(forward, device="cpu", backend=emulated_backend)
    extra = {"pair": Pair(1, 2)} if path == "python" else {}
    with pytest.raises(error_type, match="from the forward"):
        gf(x=torch.ones(2), fail=True, **extra)
    assert len(runs) == 1
    stats = gf.stats()
    assert stats["enabled"] and gf.disabled_reason == ""
    torch.testing.assert_close(gf(x=torch.ones(2), fail=False, **extra), torch.full((2,), 2.0))
    assert gf.stats()["captures"] == 1


def test_a_capture_failure_reason_is_one_line_and_the_call_returns_the_eager_result(
    emulated_backend,
):
    runs = []

    def forward(*, x):
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("fails under capture only\nsecond line\n  traceback")
        return x + 1

    gf = GraphedForward(forward, device="cpu", backend=emulated_backend)
    torch.testing.assert_close(gf(x=torch.ones(2)), torch.full((2,), 2.0))
    reason = gf.disabled_reason
    assert reason.startswith("capture failed") and "fails under capture only" in reason
    assert "\n" not in reason
