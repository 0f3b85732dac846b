"""The graphed operators as Python calls, and the one registry of the runners this process made.

Two front doors make runners: GraphedForward (graphed._forward) for model code, graphed.Runner
(graphed._runner) for code with its own forward operator. Both create theirs here (`create`,
by the keywords of torch.ops.graphed.create's schema, shim/gf_shim_ops.cpp; `make_runner` for a
GraphedForward, whose forward and log are direct hooks of its runner), report through
`RunnerReports` (stats, entries), and register them by id, so that three readers find what they
need without importing either front door: the fake forward (graphed._fake) runs what a traced
call of the runner runs, a group's teardown (graphed._groups) releases the runners made with that
group, and `runner_stats` adds the calls GraphedForward answered without the native core (a
runner disabled for good runs its forward in Python) to the core's own `eager_calls`.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from . import _observe, _switches
from ._native import _graphed_fastcall as _fastcall

__all__ = [
    "Registration",
    "RunnerReports",
    "create",
    "destroy",
    "live_runner_stats",
    "make_runner",
    "operator",
    "registered_owners",
    "register",
    "runner_entries",
    "runner_stats",
    "traced_forward",
]


def operator(qualified_name: str) -> Any:
    """The torch.ops operator "namespace::name"."""
    namespace, _, name = qualified_name.partition("::")
    return getattr(getattr(torch.ops, namespace), name)


def create(
    *,
    name: str,
    forward_op: str,
    device: torch.device,
    max_entries: int,
    warmup_iters: int,
    enabled: bool,
    agree_op: str | None = None,
    observer_op: str | None = None,
    group_name: str | None = None,
    backend: str | None = None,
    memory_pool: int | None = None,
    cpu_inputs: str = "refuse",
    churn_limit: int = 0,
) -> int:
    """torch.ops.graphed.create, each argument by its schema's name; returns the runner id.
    Under GRAPHED_DISABLE (graphed._switches) the runner starts disabled, before anyone is told
    of it, so that it says nothing of its own: the switch is said once per process; its stats()
    give the cause "user" on every machine, also where graphs were unavailable anyway (the core
    keeps the first cause). At INFO (GRAPHED_LOG=info) each runner says what it was made as, on
    a machine without graphs too."""
    disabled_outside = _switches.disabled_from_outside()
    runner_id = torch.ops.graphed.create(
        name=name,
        forward_op=forward_op,
        device=device,
        max_entries=max_entries,
        warmup_iters=warmup_iters,
        enabled=enabled,
        agree_op=agree_op,
        observer_op=observer_op,
        group_name=group_name,
        backend=backend,
        memory_pool=memory_pool,
        cpu_inputs=cpu_inputs,
        churn_limit=churn_limit,
    )
    if disabled_outside:
        torch.ops.graphed.disable(runner_id, _switches.DISABLED_REASON, "user")
        with _lock:
            _disabled_outside.add(runner_id)
    if _log.isEnabledFor(logging.INFO):
        stats = runner_stats(runner_id)
        state = (
            f"graphs on backend {stats['backend']}, up to {max_entries} kept"
            if stats["enabled"]
            else f"its calls run eager: {stats['disabled_reason']}"
        )
        _log.info("runner %r made for %s: %s", name, device, state)
    return runner_id


# -- the registry ---------------------------------------------------------------------------


class Registration:
    """One runner made by a front door: the object that made it (weakly: the registry keeps
    nothing alive), the forward a traced call runs (graphed._fake), and the calls the owner ran
    eagerly itself, by reason (graphed._eager): stats() adds those the core did not count to its
    eager calls and lists them all as eager_by_reason."""

    __slots__ = ("_answered", "_by_reason", "_owner", "forward", "log", "runner_id")

    def __init__(self, runner_id: int, owner: Any, forward: Callable[[list], list]) -> None:
        self.runner_id = runner_id
        self._owner = weakref.ref(owner)
        self.forward = forward
        self.log: _observe.RunnerLog | None = None  # its observer's log (a GraphedForward's)
        self._answered = 0
        self._by_reason: dict[str, int] = {}

    @property
    def owner(self) -> Any:
        return self._owner()

    def count_eager_call(self, reason: str, uncounted_by_core: bool = True) -> None:
        """One call the owner ran eagerly for `reason`; `uncounted_by_core`: the core's
        eager_calls does not count it already."""
        with _lock:
            self._by_reason[reason] = self._by_reason.get(reason, 0) + 1
            if uncounted_by_core:
                self._answered += 1

    def eager_by_reason(self) -> dict[str, int]:
        with _lock:
            return dict(self._by_reason)


_lock = threading.Lock()
_registered: dict[int, Registration] = {}
# The runners made under GRAPHED_DISABLE (create): their cause is "user" whatever the core kept.
_disabled_outside: set[int] = set()
_log = logging.getLogger("graphed")


def register(runner_id: int, owner: Any, forward: Callable[[list], list]) -> Registration:
    """Registers the runner `owner` made (see the module docstring); `forward` takes and returns
    a list of tensors and must not hold `owner` strongly."""
    registration = Registration(runner_id, owner, forward)
    with _lock:
        _registered[runner_id] = registration
    return registration


def destroy(runner_id: int) -> None:
    """Forgets the runner and destroys it (its graphs, buffers and id)."""
    with _lock:
        _registered.pop(runner_id, None)
        _disabled_outside.discard(runner_id)
    torch.ops.graphed.destroy(runner_id)


def traced_forward(runner_id: int) -> Callable[[list], list] | None:
    """What a traced call of the runner runs, or None for a runner no front door made."""
    registration = _registered.get(runner_id)
    return registration.forward if registration is not None else None


def make_runner(
    owner: Any,
    run: Callable[[Any, list], list],
    turn_off: Callable[[Any], None],
    call_state: Any,
    **options: Any,
) -> Registration:
    """Creates and registers the runner of `owner` (a GraphedForward): its host calls
    `run(owner, inputs)` for every forward the core runs, and tells its log (graphed._observe) of
    what it says, which calls `turn_off(owner)` when it is disabled (a switch, nothing more),
    both as direct hooks of the runner (Note [The direct forward], pyext/gf_model_hooks.cpp)
    that go with it: no operator is registered. What a run reports besides its outputs is read
    from `call_state`. Both hold the owner weakly; the runner is destroyed with the owner.
    `options` are create's, forward_op and observer_op aside."""
    owner_ref = weakref.ref(owner)

    def forward(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        target = owner_ref()
        if target is None:
            raise RuntimeError("graphed: the GraphedForward of this runner is gone")
        return run(target, inputs)

    def turned_off() -> None:
        target = owner_ref()
        if target is not None:
            turn_off(target)

    log = _observe.RunnerLog(options["name"])
    log.turned_off = turned_off
    # An empty forward_op: the forward is attached below, before anyone has the runner's id.
    runner_id = create(forward_op="", **options)
    try:
        _fastcall.attach(runner_id, call_state, forward, log.event)
    except BaseException:
        torch.ops.graphed.destroy(runner_id)
        raise
    registration = register(runner_id, owner, forward)
    registration.log = log
    weakref.finalize(owner, destroy, runner_id)
    return registration


def registered_owners() -> list[Any]:
    """The live objects that made the registered runners."""
    with _lock:
        owners = [registration.owner for registration in _registered.values()]
    return [owner for owner in owners if owner is not None]


# -- what a runner says about itself ----------------------------------------------------------


@functools.cache
def _names_from(op_name: str) -> tuple[str, ...]:
    """The names an operator gives its results' positions (stat_names: stats' counters;
    entry_fields: entries' columns), in their order: named once, in the shim."""
    return tuple(getattr(torch.ops.graphed, op_name)())


def runner_stats(runner_id: int) -> dict[str, Any]:
    """stats() of any runner id (GraphedForward and graphed.Runner share it)."""
    counters, backend, reason, cause = torch.ops.graphed.stats(runner_id)
    stats: dict[str, Any] = dict(zip(_names_from("stat_names"), counters, strict=True))
    registration = _registered.get(runner_id)
    if registration is not None:
        stats["eager_calls"] += registration._answered
        stats["eager_by_reason"] = registration.eager_by_reason()
    stats["enabled"] = bool(stats["enabled"])
    stats["backend"] = backend
    stats["disabled_reason"] = reason or None
    # Why, for programs (ops/gf_disable_cause.h names them): None while enabled.
    stats["disabled_cause"] = None if cause == "none" else cause
    if runner_id in _disabled_outside and cause != "user":
        # Disabled from outside where graphs were unavailable anyway: the switch is the cause
        # docs/api.md promises, and the reason says both.
        stats["disabled_cause"] = "user"
        stats["disabled_reason"] = f"{_switches.DISABLED_REASON} (and {reason})"
    return stats


def live_runner_stats() -> list[tuple[str, dict[str, Any]]]:
    """(name, stats()) of every registered runner whose owner is alive, in the order they were
    made (graphed._report)."""
    with _lock:
        registrations = list(_registered.values())
    found = []
    for registration in registrations:
        owner = registration.owner
        if owner is not None:
            name = getattr(owner, "name", f"runner {registration.runner_id}")
            found.append((str(name), runner_stats(registration.runner_id)))
    return found


def runner_entries(runner_id: int) -> list[dict[str, Any]]:
    """entries() of any runner id."""
    columns = torch.ops.graphed.entries(runner_id)
    fields = _names_from("entry_fields")
    rows = [dict(zip(fields, row, strict=True)) for row in zip(*columns, strict=True)]
    for row in rows:
        row["pinned"] = bool(row["pinned"])
        row["folded"] = bool(row["folded"])
    return rows


class RunnerReports:
    """What a front door's runner (`runner_id`) says about itself, for GraphedForward and
    graphed.Runner alike."""

    runner_id: int

    def stats(self) -> dict[str, Any]:
        """Counters of this runner: resident `graphs` (and `pinned` ones), `captures`,
        `replays`, `evictions`, `eager_calls`, `pool_bytes` (static inputs and outputs),
        `graph_bytes` (device memory the resident captures took, where the backend can say),
        `shared_input_bytes` (static inputs one graph shares with another), `pool_reserved_bytes`
        (what the runner's graph pool reserves on the device now, shared by the runners of one
        memory pool; -1 when the backend cannot say), `enabled`, `backend` and `disabled_reason`
        (a sentence, or None)."""
        return runner_stats(self.runner_id)

    def entries(self) -> list[dict[str, Any]]:
        """The cached graphs, most recently used first: `key` (hex of the call's key bytes),
        `shapes` (the inputs' dtypes and shapes), `replays`, `static_bytes`, `device_bytes`
        (device memory in use that the capture took; -1 when unknown), `reserved_bytes` (what it
        added to the memory the allocator reserves; -1 when unknown), `pinned`, `folded` (a replay
        is one launch), `written_back` (inputs the forward writes in place),
        `shared_input_bytes` and `capture_seconds` (how long its capture took, probe and warm-ups
        included)."""
        return runner_entries(self.runner_id)

    @property
    def num_graphs(self) -> int:
        """How many graphs are cached now."""
        return self.stats()["graphs"]

    @property
    def disabled_reason(self) -> str:
        """Why calls run eager ("" while graphs are in use)."""
        return self.stats()["disabled_reason"] or ""
