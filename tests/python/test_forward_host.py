"""How the core reaches a GraphedForward's module, and how a call that runs eagerly is answered.

- The direct forward (Note [The direct forward], pyext/gf_model_hooks.cpp): a GraphedForward's
  runner calls its module and tells its log through hooks that go with the runner, so no
  operator is registered per instance, and what a run reports (its own error, a warm-up that kept
  state) still reaches the core through the one report record.
- The one eager route (graphed._eager): every reason a call runs eagerly counts it once in
  eager_calls and by its reason in eager_by_reason, whoever runs it.
- The options record (graphed._options): one frozen record a region copies.
- A cause code beside every disabled reason (ops/gf_disable_cause.h), and the watch's bound on the
  recaptures it causes with no replay between (graphed._watch.RECAPTURE_LIMIT).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import sys
import weakref

import pytest
import torch
from graphed import GraphedForward
from graphed._native import _graphed_fastcall as _fastcall
from graphed._watch import RECAPTURE_LIMIT


def _per_instance_operators() -> int:
    return sum(
        name.startswith(("graphed_models::", "graphed_observers::"))
        for name in torch._C._dispatch_get_all_op_names()
    )


def test_no_operator_is_registered_per_instance():
    before = _per_instance_operators()
    runners = [GraphedForward(torch.nn.Linear(2, 2), device="cpu") for _ in range(10)]
    assert _per_instance_operators() == before == 0
    del runners


def test_the_hooks_go_with_the_runner(emulated_backend):
    # The runner's observer hook holds the log (a bound method of it), and its forward hook the
    # call state: both are let go when the GraphedForward goes, with its runner.
    module = torch.nn.Linear(2, 2)
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    gf(input=torch.randn(3, 2))
    log = weakref.ref(gf._registration.log)
    state = gf._call_state
    held_before = sys.getrefcount(state)
    runner_id = gf.runner_id
    del gf
    gc.collect()
    assert log() is None
    assert sys.getrefcount(state) < held_before
    with pytest.raises(ValueError, match="no runner"):
        torch.ops.graphed.stats(runner_id)


def test_a_forward_own_error_reaches_the_caller_and_the_runner_stays_enabled(emulated_backend):
    class RaisesOnce(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.raised = False

        def forward(self, x):
            if not self.raised:
                self.raised = True
                raise ValueError("this forward's own error")
            return x * 3

    gf = GraphedForward(RaisesOnce(), device="cpu", backend=emulated_backend)
    with pytest.raises(ValueError, match="this forward's own error"):
        gf(x=torch.ones(2))
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]
    assert gf.stats()["captures"] == 0
    x = torch.randn(2)
    # The next call captures (the emulated backend's replays return what the capture wrote, so
    # only the capturing call's values say anything here).
    torch.testing.assert_close(gf(x=x), x * 3, rtol=0, atol=0)
    assert gf.stats()["captures"] == 1 and gf.stats()["eager_calls"] == 0


def test_a_capture_failure_names_the_forward_error(emulated_backend):
    def fails_under_capture(*, x):
        if int(torch.ops.graphed.forward_phase()) == 3:
            raise RuntimeError("fails under capture only")
        return x + 1

    gf = GraphedForward(fails_under_capture, device="cpu", backend=emulated_backend)
    x = torch.randn(2)
    torch.testing.assert_close(gf(x=x), x + 1, rtol=0, atol=0)
    reason = gf.stats()["disabled_reason"]
    # Named by the runner's default name, the function's (graphed._arguments.default_name).
    assert "fails_under_capture' failed: fails under capture only" in reason, reason


class CallsItself(torch.nn.Module):
    """Calls its own GraphedForward once from inside its forward (a re-entry)."""

    def __init__(self) -> None:
        super().__init__()
        self.graphed: GraphedForward | None = None

    def forward(self, x, inner=False):
        if inner:
            return x - 1
        return self.graphed(x=x, inner=True) * 2


def test_every_eager_route_counts_once_by_its_reason(emulated_backend):
    disabled = GraphedForward(torch.nn.Linear(2, 2), device="cpu", enabled=False)
    disabled(input=torch.randn(1, 2))
    assert disabled.stats()["eager_calls"] == 1
    assert disabled.stats()["eager_by_reason"] == {"disabled": 1}

    no_tensors = GraphedForward(lambda *, n: n + 1, device="cpu", backend=emulated_backend)
    assert no_tensors(n=1) == 2
    assert no_tensors.stats()["eager_calls"] == 1
    assert no_tensors.stats()["eager_by_reason"] == {"no_tensors": 1}

    module = CallsItself()
    reentered = GraphedForward(module, device="cpu", backend=emulated_backend)
    module.graphed = reentered
    x = torch.randn(3)
    # The inner call runs eagerly in the probe, each warm-up and the capture's forward.
    torch.testing.assert_close(reentered(x=x), (x - 1) * 2, rtol=0, atol=0)
    stats = reentered.stats()
    assert stats["eager_by_reason"]["reentered"] == stats["eager_calls"] > 0, stats

    churning = GraphedForward(
        lambda *, x: x * 2, device="cpu", backend=emulated_backend, churn_limit=2
    )
    for rows in range(1, 9):
        y = torch.randn(rows)
        torch.testing.assert_close(churning(x=y), y * 2, rtol=0, atol=0)
    stats = churning.stats()
    held = stats["eager_by_reason"]["held_back"]
    assert held == stats["churn_eager_calls"] == stats["eager_calls"] > 0, stats


def test_verify_compares_without_counting_an_eager_call(emulated_backend):
    # A forward whose result does not depend on its input's values: the emulated backend's replays
    # (which return what the capture wrote) then equal eager's, and verify keeps the runner.
    gf = GraphedForward(
        lambda *, x: torch.ones_like(x), device="cpu", backend=emulated_backend, verify=3
    )
    for _ in range(4):
        x = torch.randn(4)
        torch.testing.assert_close(gf(x=x), torch.ones(4), rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"] and stats["eager_calls"] == 0, stats


def test_the_options_are_one_frozen_record():
    gf = GraphedForward(torch.nn.Linear(2, 2), device="cpu", max_entries=3, name="whole")
    options = gf.options
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_entries = 4  # type: ignore[misc]
    copied = dataclasses.replace(options, name="whole/part")
    region = GraphedForward.from_options(torch.nn.Linear(2, 2), copied, torch.nn.Linear(2, 2))
    assert region.options.max_entries == 3 and region.name == "whole/part"
    assert region.options.device == gf.options.device


def test_every_disable_has_a_cause_by_name(emulated_backend):
    enabled = GraphedForward(torch.nn.Linear(2, 2), device="cpu", backend=emulated_backend)
    enabled(input=torch.randn(1, 2))
    assert enabled.stats()["disabled_cause"] is None

    made_off = GraphedForward(torch.nn.Linear(2, 2), device="cpu", enabled=False)
    assert made_off.stats()["disabled_cause"] == "user"

    turned_off = GraphedForward(torch.nn.Linear(2, 2), device="cpu", backend=emulated_backend)
    turned_off.disable("the operator said so")
    stats = turned_off.stats()
    assert (stats["disabled_cause"], stats["disabled_reason"]) == ("user", "the operator said so")

    # No backend serves the CPU but the test plugin's: graphs are unavailable.
    unavailable = GraphedForward(torch.nn.Linear(2, 2), device="cpu", backend="none")
    assert unavailable.stats()["disabled_cause"] == "unavailable"

    # The emulated backend replays what its capture wrote, so verify sees the second input's
    # call differ from eager.
    verified = GraphedForward(lambda *, x: x + 1, device="cpu", backend=emulated_backend, verify=2)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(verified(x=x), x + 1, rtol=0, atol=0)
    assert verified.stats()["disabled_cause"] == "verify"

    with pytest.raises(ValueError, match="cause must name one of"):
        torch.ops.graphed.disable(enabled.runner_id, "why", "no such cause")
    assert enabled.stats()["enabled"]


@pytest.mark.parametrize("emulated_backend", ["failing"], indirect=True)
def test_a_failed_capture_says_capture_failed_and_nests_no_name(emulated_backend):
    gf = GraphedForward(lambda *, x: x * 2, device="cpu", backend=emulated_backend)
    x = torch.randn(3)
    torch.testing.assert_close(gf(x=x), x * 2, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["disabled_cause"] == "capture_failed", stats
    assert stats["disabled_reason"].startswith("capture failed: ")
    assert "graphed: " not in stats["disabled_reason"], stats["disabled_reason"]


def test_watch_driven_recaptures_are_bounded(emulated_backend, caplog):
    module = torch.nn.Linear(4, 4)
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        for _ in range(100):
            module.weight = torch.nn.Parameter(torch.randn(4, 4))
            x = torch.randn(2, 4)
            torch.testing.assert_close(gf(input=x), module(x), rtol=0, atol=0)
    stats = gf.stats()
    assert stats["captures"] <= RECAPTURE_LIMIT, stats
    assert stats["disabled_cause"] == "recapture_limit", stats
    said = [r for r in caplog.records if "changed again before any graph replayed" in r.message]
    assert len(said) == 1 and "weight" in said[0].message, [r.message for r in caplog.records]


def test_a_rotation_that_replays_between_changes_is_not_bounded(emulated_backend):
    module = torch.nn.Linear(4, 4)
    weights = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(2)]
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4)
    for request in range(3 * RECAPTURE_LIMIT):
        module.weight = weights[request % 2]
        for _ in range(2):  # the capture, then a replay
            gf(input=x)
    stats = gf.stats()
    assert stats["enabled"] and stats["captures"] == 3 * RECAPTURE_LIMIT, stats
    assert stats["replays"] >= 3 * RECAPTURE_LIMIT, stats


def test_graphs_dropped_by_the_watch_keep_the_churn_guard(emulated_backend):
    module = torch.nn.Linear(4, 4)
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, churn_limit=2)
    for rows in range(1, 6):  # new shapes, none reused: the guard starts
        gf(input=torch.randn(rows, 4))
    assert gf.stats()["churn_guarding"] == 1
    module.weight = torch.nn.Parameter(torch.randn(4, 4))
    gf(input=torch.randn(7, 4))
    assert gf.stats()["churn_guarding"] == 1, "a reset by the watch does not restart the guard"


def test_a_runner_takes_one_forward_and_a_refused_one_is_let_go(emulated_backend):
    gf = GraphedForward(lambda *, x: x + 1, device="cpu", backend=emulated_backend)

    def another(inputs):
        return inputs

    held = sys.getrefcount(another)
    with pytest.raises(ValueError, match="has a forward already"):
        _fastcall.attach(gf.runner_id, gf._call_state, another, None)
    assert sys.getrefcount(another) == held, "the refused hooks hold nothing"
    x = torch.randn(2)
    torch.testing.assert_close(gf(x=x), x + 1, rtol=0, atol=0)
