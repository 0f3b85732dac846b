"""The switches a program can be given from outside (graphed._switches) and graphed.report():
GRAPHED_DISABLE makes every runner made from then on eager with the same results and says so once
(the cause "user" on every machine), GRAPHED_LOG sets the logger's level with a handler of its own
(at info each runner says what it was made as, on a CPU too), GRAPHED_REPORT prints the report at
exit, report() prints to standard output, and a value none of them takes is said and ignored.
Also what a newcomer is told first: device=None, a runner's default name, and that graphed is for
inference."""

from __future__ import annotations

import functools
import io
import logging
import os
import subprocess
import sys

import graphed
import pytest
import torch
from graphed import GraphedForward, _arguments, _switches
from graphed._arguments import default_name

_library = torch.library.Library("graphed_switches_test", "DEF")
_library.define("double(Tensor[] inputs) -> Tensor[]")
_library.impl("double", lambda inputs: [t * 2 for t in inputs], "CompositeExplicitAutograd")


def _child(program: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_call(options: str) -> str:
    """A child's program: one GraphedForward made with `options` (load_emulated() may name the
    test plugin's backend), called once."""
    return (
        "import sys, torch, graphed\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from _backend_choice import load_emulated\n"
        f"gf = graphed.GraphedForward(lambda *, x: x + 1, device='cpu', {options})\n"
        "gf(x=torch.ones(2))\n"
    )


def test_graphed_disable_makes_every_runner_eager_with_eagers_results(
    emulated_backend, monkeypatch, caplog
):
    monkeypatch.setattr(_switches, "_said", set())
    monkeypatch.setenv("GRAPHED_DISABLE", "1")
    module = torch.nn.Linear(4, 3)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        first = GraphedForward(module, device="cpu", backend=emulated_backend)
        second = GraphedForward(lambda *, x: x * 2, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(first(input=x), module(x), rtol=0, atol=0)
        torch.testing.assert_close(second(x=x), x * 2, rtol=0, atol=0)
    for runner in (first, second):
        stats = runner.stats()
        assert stats["captures"] == 0 and stats["eager_calls"] == 3, stats
        assert stats["disabled_reason"] == "disabled by GRAPHED_DISABLE", stats
        assert stats["disabled_cause"] == "user", stats
    said = [record.getMessage() for record in caplog.records]
    assert sum("GRAPHED_DISABLE is set" in message for message in said) == 1, said


def test_graphed_disable_off_or_unset_changes_nothing(emulated_backend, monkeypatch, caplog):
    monkeypatch.setattr(_switches, "_said", set())
    for value in ("0", "off", ""):
        monkeypatch.setenv("GRAPHED_DISABLE", value)
        gf = GraphedForward(lambda *, x: x + 1, device="cpu", backend=emulated_backend)
        gf(x=torch.ones(2))
        assert gf.stats()["enabled"] and gf.stats()["captures"] == 1
    monkeypatch.setenv("GRAPHED_DISABLE", "maybe")
    with caplog.at_level(logging.WARNING, logger="graphed"):
        gf = GraphedForward(lambda *, x: x + 1, device="cpu", backend=emulated_backend)
    assert gf.stats()["enabled"]
    assert any("GRAPHED_DISABLE='maybe' is not one of" in r.getMessage() for r in caplog.records)


def test_graphed_disable_reaches_a_plain_runner(emulated_backend, monkeypatch):
    monkeypatch.setattr(_switches, "_said", set())
    monkeypatch.setenv("GRAPHED_DISABLE", "yes")
    with graphed.Runner(
        "graphed_switches_test::double", device="cpu", backend=emulated_backend
    ) as runner:
        x = torch.randn(3)
        (doubled,) = runner.forward("key", [x])
        torch.testing.assert_close(doubled, x * 2, rtol=0, atol=0)
        stats = runner.stats()
        assert stats["disabled_reason"] == "disabled by GRAPHED_DISABLE", stats
        assert stats["eager_calls"] == 1 and stats["captures"] == 0, stats


def test_graphed_log_info_shows_captures_without_any_logging_setup(backend_choice):
    child = _child(
        _one_call("backend=load_emulated()"),
        GRAPHED_LOG="info",
    )
    assert child.returncode == 0, child.stderr
    # The runner's default name: the function's (a lambda here).
    assert "graphed: runner 'lambda' captured [" in child.stderr, child.stderr
    quiet = _child(child.args[2])
    assert quiet.returncode == 0 and "captured [" not in quiet.stderr, quiet.stderr


def test_graphed_log_with_a_value_that_is_no_level_is_said_and_ignored():
    child = _child(
        "import graphed, logging\nprint(logging.getLogger('graphed').level)\n", GRAPHED_LOG="loud"
    )
    assert child.returncode == 0, child.stderr
    assert "GRAPHED_LOG='loud' is not a level" in child.stderr, child.stderr
    assert child.stdout.strip() == str(logging.NOTSET)


def test_the_report_lists_every_live_runner_and_why_it_runs_eager(emulated_backend):
    graphed_one = GraphedForward(
        lambda *, x: x + 1, device="cpu", backend=emulated_backend, name="reported"
    )
    for _ in range(3):
        graphed_one(x=torch.ones(2))
    eager_one = GraphedForward(lambda *, x: x, device="cpu", enabled=False, name="switched-off")
    eager_one(x=torch.ones(2))
    text = graphed.report()
    lines = text.splitlines()
    row = next(line.split() for line in lines if line.startswith("reported "))
    assert row[:7] == ["reported", "enabled", "1", "1", "3", "2", "0"], row
    off = next(line for line in lines if line.startswith("switched-off "))
    assert "eager: user" in off
    assert "switched-off: eager calls it ran itself: disabled 1" in text
    assert "switched-off: disabled by the caller (enabled=False)" in text


def test_graphed_report_prints_the_table_at_exit():
    child = _child(
        _one_call("name='at-exit'"),
        GRAPHED_REPORT="1",
    )
    assert child.returncode == 0, child.stderr
    assert "graphed: runners of this process" in child.stderr, child.stderr
    assert "at-exit" in child.stderr, child.stderr


def test_graphed_disable_gives_the_cause_user_where_graphs_are_unavailable_too(monkeypatch):
    # No backend at all for this runner's device (the CPU without the test plugin): the core's
    # first cause is "unavailable", and the switch still reads as the cause docs/api.md promises.
    monkeypatch.setattr(_switches, "_said", set())
    monkeypatch.setenv("GRAPHED_DISABLE", "1")
    gf = GraphedForward(lambda *, x: x + 1, device="cpu", backend="none")
    torch.testing.assert_close(gf(x=torch.ones(2)), torch.full((2,), 2.0), rtol=0, atol=0)
    stats = gf.stats()
    assert stats["disabled_cause"] == "user", stats
    assert stats["disabled_reason"].startswith(
        "disabled by GRAPHED_DISABLE (and graphs unavailable"
    )
    assert "eager: user" in graphed.report(file=io.StringIO())


def test_graphed_log_info_says_what_each_runner_was_made_as_on_a_cpu():
    child = _child(
        "import torch, graphed\n"
        "gf = graphed.GraphedForward(torch.nn.Linear(4, 4), device='cpu', name='lin',"
        " backend='none')\n"
        "gf(torch.ones(2, 4))\n",
        GRAPHED_LOG="info",
    )
    assert child.returncode == 0, child.stderr
    assert "graphed: runner 'lin' made for cpu: its calls run eager: graphs unavailable" in (
        child.stderr
    ), child.stderr
    quiet = _child(child.args[2])
    assert quiet.returncode == 0 and "made for cpu" not in quiet.stderr, quiet.stderr


def test_the_report_prints_to_standard_output_without_file():
    child = _child(
        "import torch, graphed\n"
        "gf = graphed.GraphedForward(lambda *, x: x, device='cpu', name='shown')\n"
        "gf(x=torch.ones(2))\n"
        "text = graphed.report()\n"
        "import io\n"
        "assert graphed.report(file=io.StringIO()) == text\n"
    )
    assert child.returncode == 0, child.stderr
    assert "graphed: runners of this process" in child.stdout, child.stdout
    assert "shown" in child.stdout and child.stdout.count("runners of this process") == 1


def test_device_none_is_refused_with_what_device_takes():
    for make in (
        lambda: GraphedForward(torch.nn.Linear(2, 2), device=None),
        lambda: graphed.Runner("graphed_switches_test::double", device=None),
    ):
        with pytest.raises(TypeError, match="device= names the device its graphs run on") as raised:
            make()
        said = str(raised.value)
        assert "got None" in said and "torch.cuda.is_available()" in said, said


def test_a_default_name_tells_runners_apart_in_the_report():
    # What a runner made without name= is to be called (graphed._arguments.default_name): the
    # module's class, a compiled module's original class, a function's or a method's name.
    class Pipe:
        def step(self, *, x):
            return x

    def decode(*, x):
        return x

    assert default_name(torch.nn.Linear(2, 2)) == "Linear"
    assert default_name(torch.compile(torch.nn.GELU())) == "GELU"
    assert default_name(Pipe().step) == "Pipe.step"
    assert default_name(functools.partial(decode)).endswith("decode")
    assert "<" not in default_name(lambda *, x: x)


def test_a_module_set_up_for_training_is_told_once_that_graphed_is_for_inference(
    monkeypatch, caplog
):
    monkeypatch.setattr(_arguments, "_said_inference_only", False)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        GraphedForward(torch.nn.Linear(2, 2).eval(), device="cpu")
        with torch.no_grad():
            GraphedForward(torch.nn.Linear(2, 2), device="cpu")
        assert not [r for r in caplog.records if "for inference" in r.getMessage()]
        training = torch.nn.Linear(2, 2)
        gf = GraphedForward(training, device="cpu")
        GraphedForward(torch.nn.Linear(2, 2), device="cpu")
    said = [r.getMessage() for r in caplog.records if "for inference" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("Linear is in training mode and its parameters require grad")
    assert "element 0 of tensors does not require grad" in said[0] and ".eval()" in said[0]
    # What it says happens: outputs carry no autograd history, so a backward fails in torch.
    out = gf(torch.ones(1, 2))
    assert not out.requires_grad and out.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()
