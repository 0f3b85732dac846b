"""The one eager route of a GraphedForward: every call it answers by running the module itself,
whatever the reason, goes through `run_eagerly`, which owns the duties of such a run, so that no
route forgets one. The core's own eager runs (an outer capture, the call whose capture failed, a
dispatched call of a disabled runner) run the forward through the host instead (GraphedForward's
_run_module, phase eager), which keeps the same duties for that run and is counted by the core.

What an eager run may owe (`DUTIES` below is the table the code reads):
- E: eager_calls counts it once (and eager_by_reason by its reason);
- D: where graphs are unavailable, the inputs' devices are checked, as the core would, and new
  keys are counted as the core's churn guard would, to warn once (graphed._churn's
  KeysWithoutGraphs);
- C: capture_context is entered, as around the core's runs (outside those, only inside someone
  else's stream capture);
- W: the watch settles what the forward re-assigned, as after a core run;
- O: an output no graph could rebuild is refused (a TypeError naming its path, as a graphed call
  would raise, so that code developed on a laptop fails there as it would on a GPU);
- K: the churn guard's warning, when it started on this call, is said once the call is recorded.

Each reason, with its duties:

- DISABLED (E D O): the runner is disabled for good.
- HELD_BACK (E C W O K): a new key the core holds back (the churn guard, the out-of-memory
  back-off), which the core counted when it returned RUN_EAGER.
- REENTERED (E): a call from inside this runner's own forward on this thread.
- NO_TENSORS (E): a call with no tensor to key.
- COMPILING (none): a call torch.compile or torch.export traces; the trace sees the module's call
  itself, bare.
- VERIFY (none): verify mode's comparison of a call a graph served (it serves no call itself).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from . import _arguments
from ._churn import KeysWithoutGraphs
from ._native import _graphed_fastcall as _fastcall
from ._observe import graphs_unavailable
from ._tree import flatten_output

__all__ = [
    "COMPILING",
    "DISABLED",
    "DUTIES",
    "HELD_BACK",
    "NO_TENSORS",
    "REENTERED",
    "VERIFY",
    "run_context",
    "run_eagerly",
]

DISABLED = "disabled"
HELD_BACK = "held_back"
REENTERED = "reentered"
NO_TENSORS = "no_tensors"
COMPILING = "compiling"
VERIFY = "verify"

# The table of the module docstring: reason -> the letters of its duties.
DUTIES = {
    DISABLED: "EDO",
    HELD_BACK: "ECWOK",
    REENTERED: "E",
    NO_TENSORS: "E",
    COMPILING: "",
    VERIFY: "",
}
# Counted by the core already, which returned RUN_EAGER for them.
_COUNTED_BY_CORE = frozenset({HELD_BACK})


def run_eagerly(
    runner: Any, kwargs: dict, why: str, tensors: list | None = None, variant: Any = None
) -> Any:
    """Runs `runner`'s module eagerly on `kwargs` for `why` (a reason of DUTIES), with every duty
    the table gives that reason. `tensors` are the call's tensors, walked (for D); `variant` the
    call's (for K's record)."""
    if why == COMPILING:
        # torch.compile or torch.export is tracing the caller: it sees the module itself (its
        # weights, its operations), with no opaque call or context in between.
        return runner._forward_call(**kwargs)
    duties = DUTIES[why]
    if "E" in duties:
        runner._registration.count_eager_call(why, why not in _COUNTED_BY_CORE)
    if "K" in duties:
        _say_churn_started(runner, kwargs, variant)
    if "D" in duties:
        if runner._checks_devices:
            _arguments.refuse_off_device(
                kwargs, tensors, runner.device, runner.options.inputs_to_device
            )
        _keys_without_graphs(runner).note(kwargs, _flatten_plain)
    if "O" not in duties:  # a run inside another (re-entered, traced, compared): no more duties
        return _run(runner, kwargs, core_run=False)
    with runner._forwards_here:
        result = _run(runner, kwargs, core_run="C" in duties)
    if "W" in duties:
        changed = runner._watch.settle(runner.module)
        if changed:
            runner._runs.name_side_effects(changed)
    if _fastcall.output_template(result) is None:
        flatten_output(result)  # refuses, by its path, an output no graph could rebuild
    return result


def _say_churn_started(runner: Any, kwargs: dict, variant: Any) -> None:
    """When the churn guard started on this call (the core told the log first), records the call
    for the warning, which names what changed among the calls without a graph, this one included
    (graphed._churn), and says it."""
    log = runner._registration.log
    if log is not None and log.churn_pending is not None:
        flat = _fastcall.flatten(kwargs, variant)
        if flat is not _fastcall.FALLBACK:  # RUN_EAGER comes from the fast path: always plain
            runner._new_keys.record(*flat)
        log.say_churn()


def _flatten_plain(kwargs: dict) -> Any:
    return _fastcall.flatten(kwargs, None)


def _keys_without_graphs(runner: Any) -> KeysWithoutGraphs:
    """The runner's count of new keys while graphs are unavailable, made on its first call (one
    that counts nothing for a runner disabled for another reason)."""
    keys = runner.__dict__.get("_keys_without_graphs")
    if keys is None:
        graphless = graphs_unavailable(runner.stats())
        limit = runner.options.churn_limit if graphless else 0
        keys = KeysWithoutGraphs(runner.name, runner._new_keys, limit)
        runner.__dict__["_keys_without_graphs"] = keys
    return keys


def run_context(runner: Any, core_run: bool) -> contextlib.AbstractContextManager:
    """The C duty: capture_context, if given, around a run of the core (`core_run`: the host's
    forward, or a run standing in for one) while the runner is enabled, and around any run inside
    someone else's stream capture."""
    capture_context = runner.options.capture_context
    if capture_context is None:
        return contextlib.nullcontext()
    if (core_run and not runner._disabled) or runner._hooks.outer_capture_active():
        return capture_context()
    return contextlib.nullcontext()


def _run(runner: Any, kwargs: dict, core_run: bool) -> Any:
    """The module's forward (or its regions), without autograd, in the runner's context."""
    if runner._regions is None and runner.options.capture_context is None:
        # Grad mode set directly: torch.no_grad() and a null context around the call cost about
        # 1.5 us more (2-core x86 host) on every eager run: a disabled runner's calls, and the
        # sampled calls verify mode compares here (the fast entry's own set grad mode in C,
        # pyext/gf_verify_sampled.c).
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            return runner._forward_call(**kwargs)
        finally:
            torch._C._set_grad_enabled(enabled)
    with torch.no_grad(), run_context(runner, core_run):
        regions = runner._regions
        if regions is None:
            return runner._forward_call(**kwargs)
        return regions.run(runner._forward_call, (), kwargs)
