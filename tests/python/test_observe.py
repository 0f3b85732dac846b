"""What a runner tells its user through `logging` (logger "graphed"), its one channel: one INFO
record per capture with its time and memory, DEBUG per eviction, one churn WARNING naming the
keys, and a disable as one WARNING record (no Python warning beside it). Messages carry no
"graphed: " of their own, since the logger's name says it; where no handler is configured,
graphed's stand-in for logging's last resort prints the name in front. The emulated backend
captures on the CPU, so all of it is seen here."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch
from graphed import GraphedForward


class AddOne(torch.nn.Module):
    def forward(self, *, x):
        return x + 1


def _messages(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == "graphed" and r.levelno == level]


def test_a_capture_logs_one_info_line_with_time_and_memory(emulated_backend, caplog):
    caplog.set_level(logging.INFO, logger="graphed")
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="adder")
    x = torch.zeros(2, 3)
    gf(x=x)
    gf(x=x)
    infos = [m for m in _messages(caplog, logging.INFO) if "captured" in m]
    assert len(infos) == 1, infos
    assert infos[0].startswith("runner 'adder' captured [f32[2, 3]] in ")
    assert "device memory reserved unknown, in use unknown (static buffers 0.0 MiB)" in infos[0]


def test_evictions_are_debug(emulated_backend, caplog):
    caplog.set_level(logging.DEBUG, logger="graphed")
    gf = GraphedForward(
        AddOne(), device="cpu", backend=emulated_backend, name="evicting", max_entries=1
    )
    for rows in range(1, 9):
        gf(x=torch.zeros(rows))
    debugs = [m for m in _messages(caplog, logging.DEBUG) if "evicted" in m]
    assert len(debugs) == 1  # then the churn guard runs the other new keys eager
    assert debugs[0].startswith("runner 'evicting' evicted [f32[1]]")


def test_the_churn_guard_warns_once_naming_what_changes(emulated_backend, caplog):
    caplog.set_level(logging.INFO, logger="graphed")
    gf = GraphedForward(
        lambda *, x, scale: x * scale, device="cpu", backend=emulated_backend, name="churner"
    )
    for call in range(12):
        gf(x=torch.zeros(call + 1), scale=float(call))
    (warning,) = [m for m in _messages(caplog, logging.WARNING) if "new keys" in m]
    assert warning.startswith(
        "runner 'churner': 3 new keys in a row, none reused: new keys now run eager until they "
        "come a second time; graphs already captured keep replaying."
    ), warning
    assert "kwargs['x']: dim 0, 3 sizes; kwargs['scale']: a float, 3 values" in warning, warning
    assert "Recent keys: [f32[1]]; [f32[2]]" in warning
    stats = gf.stats()
    assert (stats["captures"], stats["churn_eager_calls"]) == (2, 10), stats
    gf.reset()
    for call in range(4):
        gf(x=torch.zeros(1), scale=float(call))
    assert len([m for m in _messages(caplog, logging.WARNING) if "new keys" in m]) == 1
    assert [m for m in _messages(caplog, logging.INFO) if "new keys in a row" in m]


def test_a_disable_is_one_warning_record_and_no_python_warning(emulated_backend, caplog):
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="stopped")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gf.disable("maintenance")
        gf(x=torch.zeros(2))
        gf.disable("again")  # the first reason sticks, and is said once
    records = _messages(caplog, logging.WARNING)
    assert records == ["runner 'stopped': maintenance"]
    assert [str(w.message) for w in caught if "maintenance" in str(w.message)] == []


@pytest.mark.parametrize("emulated_backend", ["failing"], indirect=True)
def test_a_failed_capture_is_logged_once(emulated_backend, caplog):
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="failing")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.zeros(2)
        torch.testing.assert_close(gf(x=x), x + 1)
        gf(x=x)
    failed = [m for m in _messages(caplog, logging.WARNING) if "capture failed" in m]
    assert len(failed) == 1, failed
    assert not [w for w in caught if "capture failed" in str(w.message)]


def _graphed_said_never(message: str) -> bool:
    """A record's message: the logger's name says "graphed", the message does not."""
    return "graphed:" not in message


def test_a_core_warning_is_logged_once_without_graphed_in_its_message(emulated_backend, caplog):
    gf = GraphedForward(
        AddOne(), device="cpu", backend=emulated_backend, name="pinned", max_entries=1
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (1, 2):
            gf(x=torch.zeros(rows), pin=True)
    pinned = [
        m for m in _messages(caplog, logging.WARNING) if "every resident graph is pinned" in m
    ]
    assert len(pinned) == 1, pinned
    assert pinned[0].startswith("runner 'pinned': every resident graph is pinned")
    assert _graphed_said_never(pinned[0])
    assert not [w for w in caught if "every resident graph is pinned" in str(w.message)]


@pytest.mark.parametrize("emulated_backend", ["failing"], indirect=True)
def test_a_failed_capture_reads_graphed_never_in_its_message(emulated_backend, caplog):
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="failing")
    gf(x=torch.zeros(2))
    records = [m for m in _messages(caplog, logging.WARNING) if "capture failed" in m]
    assert records == ["runner 'failing': capture failed: emulated capture failure"]


@pytest.fixture
def formatted():
    """What a handler with the usual "%(name)s: %(message)s" format prints of logger "graphed"
    (logging.basicConfig(format=...) gives the root one; here the logger's own, so that pytest's
    capture handlers on the root stay as they are)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("graphed")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_name_format_prints_graphed_once(emulated_backend, formatted):
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="named")
    gf(x=torch.zeros(2))
    gf.disable("maintenance")
    lines = formatted.getvalue().splitlines()
    assert lines and all(line.startswith("graphed: runner 'named'") for line in lines), lines
    assert not [line for line in lines if line.count("graphed:") != 1], lines
    assert "graphed: runner 'named': maintenance" in lines


def test_without_a_handler_a_warning_prints_with_the_loggers_name(tmp_path):
    """A program that configures no logging: logging's last resort would print the bare message;
    graphed's stand-in prints it as "graphed: ...", once, and nothing more once a handler is
    configured."""
    script = (
        "import logging, graphed\n"
        "logging.getLogger('graphed').warning('runner %r: first', 'plain')\n"
        "logging.basicConfig(format='%(name)s| %(message)s')\n"
        "logging.getLogger('graphed').warning('runner %r: second', 'plain')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "runner 'plain'" in line]
    assert lines == ["graphed: runner 'plain': first", "graphed| runner 'plain': second"], lines


class _OffloadingRegistry:
    """Stands in for diffusers' HookRegistry as a module carries it (`_diffusers_hook`, its
    `hooks` by name), so that the count runs where diffusers is not installed."""

    def __init__(self) -> None:
        self.hooks = {"group_offloading": object()}


def _offload(module: torch.nn.Module, hook: str) -> None:
    if hook == "accelerate":
        hooks = pytest.importorskip("accelerate.hooks", reason="accelerate is not installed")
        hooks.add_hook_to_module(module, hooks.CpuOffload(execution_device="cpu"))
    else:
        module._diffusers_hook = _OffloadingRegistry()


@pytest.mark.parametrize("hook", ["accelerate", "diffusers"])
@pytest.mark.parametrize("when", ["at construction", "after a capture"])
def test_an_offload_hook_is_reported_once_per_runner(emulated_backend, caplog, capsys, hook, when):
    """The reason reached the user three times (two log records and a RuntimeWarning): now one
    WARNING record, over every channel graphed has, however many calls follow."""
    caplog.set_level(logging.DEBUG, logger="graphed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = torch.nn.Linear(4, 4)
        if when == "at construction":
            _offload(module, hook)
        gf = GraphedForward(module, device="cpu", backend=emulated_backend, name="offloaded")
        if when == "after a capture":
            gf(torch.zeros(2, 4))
            _offload(module, hook)
        for _ in range(3):
            gf(torch.zeros(2, 4))
    reason = gf.disabled_reason
    assert "offload" in reason, reason
    marker = "moves its weights" if hook == "accelerate" else "group_offloading"
    records = [r for r in caplog.records if marker in r.getMessage()]
    shown = [w for w in caught if marker in str(w.message)]
    printed = capsys.readouterr()
    on_streams = (printed.out + printed.err).count(marker)
    assert (len(records), len(shown), on_streams) == (1, 0, 0), (records, shown, printed)
    assert records[0].levelno == logging.WARNING
    assert records[0].getMessage() == f"runner 'offloaded': {reason}"
