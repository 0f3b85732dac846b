"""The watch of what a GraphedForward's graphs baked in: arm the native check, follow a change.

A GraphedForward holds one `Watch`, which owns the life cycle of the record graphed._baked makes:
it arms the native check (pyext/gf_baked.h) of it, and when the check fires (a call returns
CHANGED) it takes a new BakedState (of the modules that read what the check saw change, the rest
carried over: an adapter switch records its LoRA layers again, not the whole model) and compares:
equal (an attribute the forward set, a mode set to what it was) keeps the graphs; a difference
keys the calls in the module's new state (`States`: a state seen before, an adapter rotation,
replays its graphs at once) or drops the graphs, so the next call captures what the module is
now; RECAPTURE_LIMIT drops in a row with no replay between disable the runner, which then runs
eager. A hook the graphs cannot go beneath (graphed._hook_refusals) disables the runner, or sends
a step-cached forward to regions, when the watch is armed. The watch also settles what a
capture's forward itself changed, and lists for graphed._phases what warm-ups put back
(`state_to_keep`). `count_swaps` is the one process-wide patch the native check needs: a
`torch.utils.swap_tensors` changes no dict it watches.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from typing import Any

import torch

from . import _hook_refusals as hook_refusals
from ._baked import BakedState
from ._native import _graphed_fastcall as _fastcall
from ._observe import first_few
from ._phases import StateToKeep

_log = logging.getLogger("graphed")

# The captures the watch may throw away in a row with no replay between: at it, the runner runs
# eager (stats()["disabled_cause"] "recapture_limit") with one warning naming what changed. A
# module that changes what its graphs read at every call (a weight re-assigned per call) would
# otherwise pay a capture per call forever. The core counts them, with the graphs it drops for
# freed externals, and says when a drop would reach the bound (Note [Recaptures in a row],
# ops/gf_runner.h).
RECAPTURE_LIMIT = _fastcall.RECAPTURE_LIMIT
# States of a module remembered (States), least recently used forgotten first.
_STATES_KEPT = 64
_ABSENT = ("absent",)  # a record key a state does not have


_swaps_counted = False
_swaps_lock = threading.Lock()


def count_swaps() -> None:
    """Wraps torch.utils.swap_tensors (once, when the first watch is armed) so that each swap is
    counted for the native watch, which then fires once: a swap gives a parameter's Python object
    another TensorImpl (nn.Module._apply does so for some conversions, load_state_dict under
    torch.__future__'s swap setting) without touching any dict the watch sees, and the TensorImpl
    the watch read may then be freed. torch's own callers look the function up on torch.utils at
    each call; code that imported it by name before keeps the unwrapped one."""
    global _swaps_counted
    with _swaps_lock:
        if _swaps_counted:
            return
        swap = torch.utils.swap_tensors

        @functools.wraps(swap)
        def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
            try:
                return swap(t1, t2)
            finally:
                _fastcall.note_swap()

        torch.utils.swap_tensors = swap_tensors
        _swaps_counted = True


class States:
    """The states of what a runner's graphs read besides the call (its module's records:
    parameters and buffers by identity and address, Python values, hooks, modes), each with the
    tag the core keys its graphs by (gf_runner_select_state), so that a module switched back to a
    state seen before (an adapter rotation: set_adapters, disable_lora, enable_lora) replays the
    graphs of that state at once instead of capturing again. Two states are the same only when
    every record is equal; a tag is never given to another state (the graphs keyed by it may
    still be resident), and the least recently used of more than _STATES_KEPT states is
    forgotten (coming back, it is a new state)."""

    def __init__(self) -> None:
        self._tags: collections.OrderedDict[Any, int] = collections.OrderedDict()
        self._next = 1
        # The records of the first state: every state is told by how it differs from them, so
        # that a switch compares the records it changed, not the whole module's.
        self._base: dict[str, Any] | None = None

    def _delta(self, before: BakedState, now: BakedState) -> dict[str, Any]:
        """The records where `now` differs from the first state (_ABSENT where it has none)."""
        base = self._base
        if before.delta is not None and now.keys_changed_since(before) is now.changed_keys:
            delta = dict(before.delta)
            keys = now.changed_keys
        else:
            delta, keys = {}, {**base, **now.records}
        for key in keys:
            record = now.records.get(key, _ABSENT)
            if record == base.get(key, _ABSENT):
                delta.pop(key, None)
            else:
                delta[key] = record
        now.delta = delta
        return delta

    def select(self, before: BakedState, now: BakedState) -> tuple[int, bool] | None:
        """The tag of the state `now` is in and whether it was seen before, `before` (the state
        the graphs so far were captured in) remembered first as the first state (tag 0); None
        when a record cannot be compared as a whole (the graphs are dropped instead)."""
        try:
            if not self._tags:
                self._base, before.delta = before.records, {}
                self._tags[frozenset()] = 0
            state = frozenset(self._delta(before, now).items())
            tag = self._tags.get(state)
        except TypeError:  # a record that cannot be hashed
            return None
        if tag is not None:
            self._tags.move_to_end(state)
            return tag, True
        tag, self._next = self._next, self._next + 1
        self._tags[state] = tag
        if len(self._tags) > _STATES_KEPT:
            self._tags.popitem(last=False)
        return tag, False


class Watch:
    """The watch of one GraphedForward's module: arm, check, compare, settle (see the module
    docstring). The check itself is native (the call state's watch, pyext/gf_baked.h); the
    record it compares with is `baked` (None while nothing is watched: a callable that is not an
    nn.Module, or a runner disabled). Methods that act on the runner take it as an argument (it
    answers module, name, runner_id, stats() and disable(reason, cause)), so the watch holds no
    reference to it. `own_forward`: the runner calls its module's own call (not a region's
    original forward, graphed._regions)."""

    def __init__(self, call_state: Any, own_forward: bool) -> None:
        self._call_state = call_state
        self._own_forward = own_forward
        self.baked: BakedState | None = None
        self.states = States()

    def arm(self, runner: Any) -> None:
        """Records what the graphs bake in besides their inputs and arms the native check of it;
        a hook the graphs cannot go beneath (graphed._hook_refusals) disables the runner instead,
        or sends a step-cached forward to regions."""
        module = runner.module
        if not isinstance(module, torch.nn.Module) or not runner.stats()["enabled"]:
            self.stop()
            return
        count_swaps()
        baked = self.record(module)
        # Hooks are looked for where the record changed (a hook added sets its module's
        # attributes), or everywhere when it was made whole.
        modules = baked.recorded_modules(module)
        refused = hook_refusals.refusal(module, modules, own=self._own_forward)
        if refused is not None:
            self.stop()
            # Said once: the disable's own report (graphed._observe) names the reason.
            runner.disable(*refused)
            return
        if self._call_state.watch_fired():
            # A tensor whose address torch will not say (see pyext/gf_baked.h): no watch can
            # hold, and a graph of it cannot be kept right.
            runner.disable(
                "graphed cannot watch the addresses of the module's tensors (a tensor torch will "
                "not give an address for); calls run eager",
                "watch",
            )

    def stop(self) -> None:
        """No check before calls (a disabled runner replays nothing)."""
        self._call_state.unwatch()
        self.baked = None

    def record(self, module: torch.nn.Module) -> BakedState:
        """Records the module as it is now (again only where the check saw a change since the
        last record) and arms the check of it."""
        previous = self.baked
        changed = self._call_state.watch_changes() if previous is not None else None
        self.baked = BakedState(module, previous, changed)
        self._call_state.watch(self.baked.dicts, self.baked.tensors, self.baked.sequences)
        return self.baked

    def follow_change(self, runner: Any) -> None:
        """The check fired (or a module method ran): compares the module with what the graphs
        baked in; when anything they rely on differs, the calls are keyed in the module's new
        state (States): a state seen before replays its graphs, a new one captures, the graphs
        of the others stay resident within max_entries. Where a state cannot be told (a record
        that cannot be compared whole) the graphs are dropped instead."""
        recorded = self.baked
        self.arm(runner)
        if recorded is None or self.baked is None:
            return
        changed = recorded.differences(self.baked)
        if not changed:
            return
        # A tensor replaced at its path (a weight re-assigned, the module moved or retyped): the
        # graphs of every state are dropped, as no state before will come back.
        replaced = self.baked.tensor_replaced_since(recorded)
        if replaced:
            self.states = States()
        selected = None if replaced else self.states.select(recorded, self.baked)
        seen = selected is not None and selected[1]
        if selected is None:  # the core counts the drop, and makes it short of RECAPTURE_LIMIT
            # reset() but for a churn guard that started, which stays: a change is no new traffic.
            at_limit = _fastcall.reset(runner.runner_id, False)
            if replaced and not at_limit:  # calls keyed in the first state again, its graphs gone
                _fastcall.select_state(runner.runner_id, 0, False)
        else:  # a state new to the graphs counts as a drop too
            at_limit = _fastcall.select_state(runner.runner_id, selected[0], not seen)
        if at_limit:
            self.stop()
            runner.disable(
                f"{', '.join(changed)} changed again before any graph replayed, "
                f"{RECAPTURE_LIMIT} times in a row: a graph replays what its capture read, so "
                "each change cost a capture that never served a call; calls run eager. Change "
                "such state in place (copy_, fill_), or pass what changes per call as a kwarg",
                "recapture_limit",
            )
            return
        what = first_few(changed)
        if selected is None:
            _log.info(
                "runner '%s': %s changed since the graphs were captured; they are dropped and "
                "captured again",
                runner.name,
                what,
            )
            return
        _log.info(
            "runner '%s': %s changed; %s",
            runner.name,
            what,
            "the module is back in a state its graphs were captured in, which replay"
            if seen
            else "the new state is captured on its first call, the graphs of the states before "
            "stay (within max_entries)",
        )

    def before_capture(self, module: torch.nn.Module) -> None:
        """Before the capture's forward: the probe or the warm-ups changed what the check sees
        (a lazy setup), so the capture is judged against the module as they left it."""
        if self.baked is not None and self._call_state.watch_fired():
            self.record(module)

    def settle(self, module: torch.nn.Module) -> list[str]:
        """After the forward ran for a capture (or eagerly inside the core): what the graphs
        baked in is the module as the forward left it. Returns what the forward re-assigned of
        what the graphs read (the graphs captured before it read what it replaced: named once
        by the caller). Nothing is recorded again when the check says nothing changed (the usual
        case: two reads)."""
        if not self._call_state.watch_fired():
            return []
        recorded = self.baked
        after = self.record(module)
        return recorded.differences(after) if recorded is not None else []

    def state_to_keep(self, held: tuple, module: torch.nn.Module) -> StateToKeep:
        """What a forward may change besides its inputs, for graphed._phases to put back after
        each warm-up (or name): the module's buffers and its submodules' tensor attributes, the
        call's keep_alive tensors (among `held`), and its parameters, as the record lists them
        (current: the check did not fire, or re-recorded); what the forward re-assigns of the
        module is what the watch sees (rebound)."""
        tensors = [item for item in held if isinstance(item, torch.Tensor)]
        baked = self.baked
        if baked is None:
            return StateToKeep(tensors, [], None)
        restored = [tensor for kind in ("buffer", "attribute") for _, tensor in baked.by_kind[kind]]
        return StateToKeep(
            [*restored, *tensors],
            list(baked.by_kind["parameter"]),
            lambda after_first_run: self._rebound(module, after_first_run),
            baked.tensors,
        )

    def _rebound(self, module: torch.nn.Module, first_run: bool) -> list[str]:
        """The paths of what the forward re-assigned of `module` (a Python attribute, a tensor,
        a value a dict, list or set holds) since the record was made, which is then made again;
        nothing after the first run (a lazy setup) or when the check did not fire (two reads)."""
        if not self._call_state.watch_fired():
            return []
        recorded = self.baked
        after = self.record(module)
        if first_run or recorded is None:
            return []
        return recorded.differences(after, limit=len(after.records))
