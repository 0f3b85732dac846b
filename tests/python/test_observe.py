"""What a runner tells its user through `logging` (logger "graphed") and `warnings`: one INFO
record per capture with its time and memory, DEBUG per eviction, one churn WARNING naming the
keys, and a disable as a WARNING record plus one RuntimeWarning. The emulated backend captures
on the CPU, so all of it is seen here."""

from __future__ import annotations

import logging
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
    assert infos[0].startswith("graphed: runner 'adder' captured [f32[2, 3]] in ")
    assert "device memory reserved unknown, in use unknown (static buffers 0.0 MiB)" in infos[0]


def test_evictions_are_debug_and_churn_warns_once_naming_keys(emulated_backend, caplog):
    caplog.set_level(logging.DEBUG, logger="graphed")
    gf = GraphedForward(
        AddOne(), device="cpu", backend=emulated_backend, name="churner", max_entries=1
    )
    for rows in range(1, 9):
        gf(x=torch.zeros(rows))
    debugs = [m for m in _messages(caplog, logging.DEBUG) if "evicted" in m]
    assert len(debugs) == 7
    assert debugs[0].startswith("graphed: runner 'churner' evicted [f32[1]]")
    churn = [m for m in _messages(caplog, logging.WARNING) if "churns" in m]
    assert len(churn) == 1, churn
    assert "5 captures and 4 evictions with max_entries=1" in churn[0]
    assert "recent keys: [f32[1]]; [f32[2]]" in churn[0]


def test_a_disable_is_a_warning_record_and_one_runtime_warning(emulated_backend, caplog):
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="stopped")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gf.disable("maintenance")
        gf(x=torch.zeros(2))
    records = _messages(caplog, logging.WARNING)
    assert "graphed: runner 'stopped': maintenance" in records
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert [str(w.message) for w in runtime] == ["graphed: runner 'stopped': maintenance"]


@pytest.mark.parametrize("emulated_backend", ["failing"], indirect=True)
def test_a_failed_capture_is_logged_and_warned_once(emulated_backend, caplog):
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="failing")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.zeros(2)
        torch.testing.assert_close(gf(x=x), x + 1)
        gf(x=x)
    assert any("capture failed" in m for m in _messages(caplog, logging.WARNING))
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and "capture failed" in str(runtime[0].message)


def _graphed_said_once(message: str) -> bool:
    return message.startswith("graphed: ") and message.count("graphed:") == 1


def test_a_core_warning_reads_graphed_once(emulated_backend, caplog):
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
    assert pinned[0].startswith("graphed: runner 'pinned': every resident graph is pinned")
    assert _graphed_said_once(pinned[0])
    runtime = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert runtime == [pinned[0]]


@pytest.mark.parametrize("emulated_backend", ["failing"], indirect=True)
def test_a_failed_capture_reads_graphed_once(emulated_backend, caplog):
    gf = GraphedForward(AddOne(), device="cpu", backend=emulated_backend, name="failing")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gf(x=torch.zeros(2))
    records = [m for m in _messages(caplog, logging.WARNING) if "capture failed" in m]
    assert records == ["graphed: runner 'failing': capture failed: emulated capture failure"]
    runtime = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert runtime == records
