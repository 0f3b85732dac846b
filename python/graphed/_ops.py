"""The graphed operators as Python calls, and the one registry of the runners this process made.

Two front doors make runners: GraphedForward (graphed._forward) for model code, graphed.Runner
(graphed._runner) for code with its own forward operator. Both create theirs here (`create`,
by the keywords of torch.ops.graphed.create's schema, shim/gf_shim_ops.cpp; `make_runner` for a
GraphedForward, with its forward operator), report through `RunnerReports` (stats, entries), and
register them by id, so that three readers find what they need without importing either front
door: the fake forward (graphed._fake) runs what a traced call of the runner runs, a group's
teardown (graphed._groups) releases the runners made with that group, and `runner_stats` adds
the calls GraphedForward answered without the native core (a runner disabled for good runs its
forward in Python) to the core's own `eager_calls`.
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from . import _observe

__all__ = [
    "Registration",
    "RunnerReports",
    "create",
    "define_op",
    "destroy",
    "make_runner",
    "operator",
    "registered_owners",
    "register",
    "runner_entries",
    "runner_stats",
    "traced_forward",
]

# The per-instance forward operators GraphedForward registers (graphed_models::op<n>).
_models_library = torch.library.Library("graphed_models", "FRAGMENT")
_op_numbers = itertools.count()
_op_lock = threading.Lock()


def define_op(schema_tail: str, implementation: Callable) -> str:
    """Registers graphed_models::<name>(...) for every backend (and its fake) and returns its
    qualified name."""
    with _op_lock:
        name = f"op{next(_op_numbers)}"
        _models_library.define(name + schema_tail)
        _models_library.impl(name, implementation, "CompositeExplicitAutograd")
        torch.library.register_fake(f"graphed_models::{name}", implementation, lib=_models_library)
    return f"graphed_models::{name}"


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
    """torch.ops.graphed.create, each argument by its schema's name; returns the runner id."""
    return torch.ops.graphed.create(
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


# -- the registry ---------------------------------------------------------------------------


class Registration:
    """One runner made by a front door: the object that made it (weakly: the registry keeps
    nothing alive), the forward a traced call runs (graphed._fake), and the calls the owner
    answered without the native core, which stats() counts as eager calls."""

    __slots__ = ("_answered", "_owner", "forward", "log", "runner_id")

    def __init__(self, runner_id: int, owner: Any, forward: Callable[[list], list]) -> None:
        self.runner_id = runner_id
        self._owner = weakref.ref(owner)
        self.forward = forward
        self.log: _observe.RunnerLog | None = None  # its observer's log (a GraphedForward's)
        self._answered = 0

    @property
    def owner(self) -> Any:
        return self._owner()

    def count_eager_call(self) -> None:
        with _lock:
            self._answered += 1


_lock = threading.Lock()
_registered: dict[int, Registration] = {}


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
    torch.ops.graphed.destroy(runner_id)


def traced_forward(runner_id: int) -> Callable[[list], list] | None:
    """What a traced call of the runner runs, or None for a runner no front door made."""
    registration = _registered.get(runner_id)
    return registration.forward if registration is not None else None


def make_runner(
    owner: Any,
    run: Callable[[Any, list], list],
    on_disabled: Callable[[Any], bool],
    **options: Any,
) -> Registration:
    """Creates and registers the runner of `owner` (a GraphedForward): its forward operator
    (graphed_models::op<n>) runs `run(owner, inputs)`, and its observer (graphed._observe) logs
    what it says and calls `on_disabled(owner)` when it is disabled (True: it said so itself).
    Both hold the owner weakly (they outlive it); the runner is destroyed with the owner.
    `options` are create's, forward_op and observer_op aside."""
    owner_ref = weakref.ref(owner)

    def forward(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        target = owner_ref()
        if target is None:
            raise RuntimeError("graphed: the GraphedForward of this operator is gone")
        return run(target, inputs)

    def disabled() -> bool:
        target = owner_ref()
        return target is not None and on_disabled(target)

    log, observer_op = _observe.observer_for(options["name"])
    log.on_disabled = disabled
    forward_op = define_op("(Tensor[] inputs) -> Tensor[]", forward)
    runner_id = create(forward_op=forward_op, observer_op=observer_op, **options)
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
    counters, backend, reason = torch.ops.graphed.stats(runner_id)
    stats: dict[str, Any] = dict(zip(_names_from("stat_names"), counters, strict=True))
    registration = _registered.get(runner_id)
    if registration is not None:
        stats["eager_calls"] += registration._answered
    stats["enabled"] = bool(stats["enabled"])
    stats["backend"] = backend
    stats["disabled_reason"] = reason or None
    return stats


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
