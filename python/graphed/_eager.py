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
- VERIFY (none): the call whose verify difference disabled the runner (graphed._verify).

What a run reads of its GraphedForward is an `EagerRun`, the record the runner builds once when it
starts (and keeps current where it changes: its regions); nothing here reads the runner itself.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from . import _arguments
from ._churn import KeysWithoutGraphs, NewKeys
from ._device_hooks import hooks_for
from ._native import _graphed_fastcall as _fastcall
from ._reentry import ReentryDepth
from ._tree import flatten_output

__all__ = [
    "COMPILING",
    "DISABLED",
    "DUTIES",
    "EagerRun",
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


class EagerRun:
    """What the eager route runs with, of one GraphedForward, which builds it once it has its
    runner and knows whether graphs are available to it: the forward it calls (the module's, or a
    region's original), the module its watch watches, its options (name, device, cpu_inputs,
    capture_context), its registration (the eager calls counted, the log), its re-entry depth,
    watch, forward runs and recent new keys, and where graphs are unavailable the device check and
    the count of new keys without graphs (the runner's KeysWithoutGraphs). `regions` is the one
    field that changes: the runner sets it when it splits into regions (graphed._regions)."""

    __slots__ = (
        "capture_context",
        "checks_devices",
        "device",
        "forward_call",
        "forwards_here",
        "hooks",
        "inputs_to_device",
        "keys_without_graphs",
        "module",
        "new_keys",
        "regions",
        "registration",
        "runs",
        "watch",
    )

    def __init__(
        self,
        forward_call: Any,
        module: Any,
        options: Any,
        registration: Any,
        forwards_here: ReentryDepth,
        watch: Any,
        runs: Any,
        new_keys: NewKeys,
        keys_without_graphs: KeysWithoutGraphs,
        checks_devices: bool,
    ) -> None:
        self.forward_call, self.module = forward_call, module
        self.device, self.inputs_to_device = options.device, options.inputs_to_device
        self.capture_context = options.capture_context
        self.hooks = hooks_for(options.device.type)
        self.registration, self.forwards_here = registration, forwards_here
        self.watch, self.runs, self.new_keys = watch, runs, new_keys
        self.keys_without_graphs, self.checks_devices = keys_without_graphs, checks_devices
        self.regions: Any = None


def run_eagerly(
    eager: EagerRun, kwargs: dict, why: str, tensors: list | None = None, variant: Any = None
) -> Any:
    """Runs the module of `eager` eagerly on `kwargs` for `why` (a reason of DUTIES), with every
    duty the table gives that reason. `tensors` are the call's tensors, walked (for D); `variant`
    the call's (for K's record)."""
    if why == COMPILING:
        # torch.compile or torch.export is tracing the caller: it sees the module itself (its
        # weights, its operations), with no opaque call or context in between.
        return eager.forward_call(**kwargs)
    duties = DUTIES[why]
    if "E" in duties:
        eager.registration.count_eager_call(why, why not in _COUNTED_BY_CORE)
    if "K" in duties:
        _say_churn_started(eager, kwargs, variant)
    if "D" in duties:
        if eager.checks_devices:
            _arguments.refuse_off_device(kwargs, tensors, eager.device, eager.inputs_to_device)
        eager.keys_without_graphs.note(kwargs, _flatten_plain)
    if "O" not in duties:  # a run inside another (re-entered, traced, compared): no more duties
        return _run(eager, kwargs, core_run=False)
    # C: a held-back key, the one reason with C, is one the core answered for an enabled runner
    # (ops/gf_runner.c returns RUN_EAGER only then, under the runner's lock).
    with eager.forwards_here:
        result = _run(eager, kwargs, core_run="C" in duties)
    if "W" in duties:
        changed = eager.watch.settle(eager.module)
        if changed:
            eager.runs.name_side_effects(changed)
    if _fastcall.output_template(result) is None:
        flatten_output(result)  # refuses, by its path, an output no graph could rebuild
    return result


def _say_churn_started(eager: EagerRun, kwargs: dict, variant: Any) -> None:
    """When the churn guard started on this call (the core told the log first), records the call
    for the warning, which names what changed among the calls without a graph, this one included
    (graphed._churn), and says it."""
    log = eager.registration.log
    if log is not None and log.churn_pending is not None:
        flat = _fastcall.flatten(kwargs, variant)
        if flat is not _fastcall.FALLBACK:  # RUN_EAGER comes from the fast path: always plain
            eager.new_keys.record(*flat)
        log.say_churn()


def _flatten_plain(kwargs: dict) -> Any:
    return _fastcall.flatten(kwargs, None)


def run_context(eager: EagerRun, core_run: bool) -> contextlib.AbstractContextManager:
    """The C duty: capture_context, if given, around a run of the core (`core_run`: the host's
    forward, or a run standing in for one, while the runner is enabled), and around any run
    inside someone else's stream capture."""
    capture_context = eager.capture_context
    if capture_context is None:
        return contextlib.nullcontext()
    if core_run or eager.hooks.outer_capture_active():
        return capture_context()
    return contextlib.nullcontext()


def _run(eager: EagerRun, kwargs: dict, core_run: bool) -> Any:
    """The module's forward (or its regions), without autograd, in the runner's context."""
    if eager.regions is None and eager.capture_context is None:
        # Grad mode set directly: torch.no_grad() and a null context around the call cost about
        # 1.5 us more (2-core x86 host) on every eager run: a disabled runner's calls, and the
        # call that reads a verify difference (verify's own eager runs set grad mode in C,
        # pyext/gf_verify_sampled.c).
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            return eager.forward_call(**kwargs)
        finally:
            torch._C._set_grad_enabled(enabled)
    with torch.no_grad(), run_context(eager, core_run):
        regions = eager.regions
        if regions is None:
            return eager.forward_call(**kwargs)
        return regions.run(eager.forward_call, (), kwargs)
