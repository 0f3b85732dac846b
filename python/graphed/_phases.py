"""What a forward sees of why graphed runs it: the native core runs the module's forward to probe
for synchronizing operators, to warm up, to be captured, or eagerly (torch.ops.graphed.
forward_phase() says which). Two eager-semantics promises hang on that:

- Capture-aware code (`if not torch.cuda.is_current_stream_capturing(): <a host sync>`, as
  transformers' mask builder does) takes its capture branch in the probe and the warm-ups too, so
  they run what the capture records and the probe does not fail on a sync the capture would skip.
  The answer changes for this thread only; code that imported the function by name before graphed
  was imported keeps torch's own answer.
- Warm-ups leave no trace in tensor state: module buffers, tensor attributes of its submodules
  and keep_alive tensors that a warm-up writes in place (a cache position counter, a StaticCache
  an attribute owns) are put back after each warm-up, so after the first call they have advanced
  once, as eagerly. The cost is one copy of those tensors taken before the warm-ups of each
  capture, and one copy back per warm-up for each tensor that changed (its version counter says
  so); nothing is copied on replays. What cannot be put back is named once, in a warning: a
  parameter written in place (too large to copy), and a Python attribute a forward rebinds
  (`self.step += 1`), which a replay, running no Python, would never change again; such a forward
  should keep its state in tensors.

And one promise to a process group: the sync probe never stops a forward halfway. The backend
runs it under torch's sync-debug mode "warn"; the warnings that reach Python (every operator
called from Python reports there) are counted here instead of shown, and the probe fails once
the forward has returned, so every rank has run all of its collectives before the ranks agree.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from ._native import _graphed_fastcall as _fastcall

# Why the core runs a forward (ops/gf_host.h's gf_forward_phase), named once, by the extension.
PHASE_EAGER = _fastcall.PHASE_EAGER
PHASE_PROBE = _fastcall.PHASE_PROBE
PHASE_WARMUP = _fastcall.PHASE_WARMUP
PHASE_CAPTURE = _fastcall.PHASE_CAPTURE

# What torch's sync-debug mode "warn" says for each synchronizing operator (named once, in C).
_SYNC_WARNING = _fastcall.SYNC_WARNING

_local = threading.local()
_installed_lock = threading.Lock()
_installed = False


def current_phase() -> int:
    """Why the core runs the forward on this thread now (PHASE_EAGER outside its runs)."""
    return int(torch.ops.graphed.forward_phase())


def _capture_aware(original):
    def is_current_stream_capturing() -> bool:
        if getattr(_local, "as_if_capturing", False):
            return True
        return original()

    is_current_stream_capturing.__doc__ = original.__doc__
    is_current_stream_capturing.__wrapped__ = original
    return is_current_stream_capturing


def install_capture_awareness() -> None:
    """Makes torch.cuda.is_current_stream_capturing answer True on a thread whose forward graphed
    is probing or warming up for a capture (idempotent)."""
    global _installed
    with _installed_lock:
        if _installed:
            return
        wrapped = _capture_aware(torch.cuda.is_current_stream_capturing)
        torch.cuda.is_current_stream_capturing = wrapped
        torch.cuda.graphs.is_current_stream_capturing = wrapped
        _installed = True


class StateToKeep(NamedTuple):
    """What a forward may change besides its inputs, as GraphedForward lists it for a capture:
    `restored` (buffers, tensor attributes, keep_alive tensors: copied before the warm-ups and put
    back after each), `parameters` ((name, parameter) pairs: too large to copy, so an in-place
    write is only named) and `modules` ((path, submodule) pairs whose Python attributes a forward
    may rebind, which nothing can put back for a replay: named too)."""

    restored: list[torch.Tensor]
    parameters: list[tuple[str, torch.Tensor]]
    modules: list[tuple[str, Any]]


# The attributes every nn.Module has: torch's own bookkeeping, not the forward's state.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def _rebindable(module: Any) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(module).items()
        if name not in _MODULE_INTERNALS and not isinstance(value, torch.nn.Module)
    }


def _same(before: Any, now: Any) -> bool:
    if before is now:
        return True
    if isinstance(before, torch.Tensor) or type(before) is not type(now):
        return False
    try:
        return bool(before == now)
    except Exception:  # an object whose == is not a truth value (an array): it changed
        return False


class _Snapshot:
    """Copies of state tensors taken before a capture's warm-ups, put back after each one; and
    what cannot be put back (a parameter written in place, a Python attribute rebound), found by
    comparing each run with the one before."""

    def __init__(self, state: StateToKeep) -> None:
        self.saved: list[tuple[torch.Tensor, int, torch.Tensor]] = []
        seen: set[int] = set()
        with torch.no_grad():
            for tensor in state.restored:
                if id(tensor) in seen or tensor.is_inference() or tensor.numel() == 0:
                    continue
                if isinstance(tensor, torch.nn.Parameter):
                    continue  # a keep_alive module's weights: watched as parameters below
                seen.add(id(tensor))
                self.saved.append((tensor, tensor._version, tensor.clone()))
        self.parameters = [
            (name, parameter, parameter._version)
            for name, parameter in state.parameters
            if not parameter.is_inference()
        ]
        self.modules = state.modules
        self.attributes: list[dict[str, Any]] | None = None  # after the first run

    def restore(self) -> list[str]:
        """Puts the state tensors back; returns the names of what changed that cannot be."""
        with torch.no_grad():
            for tensor, version, copy in self.saved:
                if tensor._version != version:
                    tensor.copy_(copy)
        lost = [
            name for name, parameter, version in self.parameters if parameter._version != version
        ]
        now = [_rebindable(module) for _, module in self.modules]
        if self.attributes is not None:
            for (path, _), before, after in zip(self.modules, self.attributes, now, strict=True):
                for name in {**before, **after}:
                    if (
                        name not in before
                        or name not in after
                        or not _same(before[name], after[name])
                    ):
                        lost.append(f"{path}.{name}" if path else name)
        self.attributes = now  # a first run's new attributes are a lazy setup, not a change
        return lost


# The hook that counts sync warnings is shared by every probe in flight: the first to begin puts
# it (and a filter that lets the warning through) in front, the last to end takes them out
# again, leaving alone whatever else changed meanwhile. Each probing thread counts into its own
# list (_local.syncs_found); other threads' warnings are shown as they would have been.
_hook_lock = threading.Lock()
_hook_users = 0
_shown_before: Any = None
_sync_filter: Any = None


def _count_or_show(message, category, filename, lineno, file=None, line=None):
    found = getattr(_local, "syncs_found", None)
    if found is not None and str(message).startswith(_SYNC_WARNING):
        found.append(f"{filename}:{lineno}")
        return
    _shown_before(message, category, filename, lineno, file, line)


def _install_hook() -> None:
    global _hook_users, _shown_before, _sync_filter
    with _hook_lock:
        _hook_users += 1
        if _hook_users > 1:
            return
        _shown_before = warnings.showwarning
        warnings.showwarning = _count_or_show
        warnings.filterwarnings("always", message=_SYNC_WARNING)
        _sync_filter = warnings.filters[0]


def _remove_hook() -> None:
    global _hook_users, _sync_filter
    with _hook_lock:
        _hook_users -= 1
        if _hook_users > 0:
            return
        if warnings.showwarning is _count_or_show:
            warnings.showwarning = _shown_before
        if _sync_filter in warnings.filters:
            warnings.filters.remove(_sync_filter)
            mutated = getattr(warnings, "_filters_mutated", None)
            if mutated is not None:
                mutated()
        _sync_filter = None


@contextlib.contextmanager
def _counting_syncs() -> Iterator[list[str]]:
    """Collects, as "file:line", where this thread's forward synchronized while it runs; torch's
    sync warnings from this thread are not shown, every other warning is. The filter in front
    lets the warning through whatever filters the process had before (`-W error`, an ignore
    filter). The warnings module is process-wide: code that replaces `warnings.showwarning` or
    the filters while a probe runs (`catch_warnings` in another thread, or in the forward) can
    hide a synchronization from the probe; the capture then fails on it instead, which disables
    the runner all the same (and, with a group, on every rank)."""
    outer = getattr(_local, "syncs_found", None)
    found: list[str] = []
    _local.syncs_found = found
    _install_hook()
    try:
        yield found
    finally:
        _remove_hook()
        _local.syncs_found = outer


def _probe_verdict(found: list[str]) -> None:
    """Fails the probe, after its forward returned, when the forward synchronized."""
    if found:
        more = f" and {len(found) - 1} more time(s)" if len(found) > 1 else ""
        raise RuntimeError(
            f"graphed: the forward {_SYNC_WARNING} at {found[0]}{more}, found by graphed's sync "
            "probe; a captured graph cannot hold a host synchronization: take it out of the "
            "forward (or skip it when torch.cuda.is_current_stream_capturing()), or leave this "
            "module eager"
        )


@contextlib.contextmanager
def forward_in_phase(
    phase: int, owner: object, state: Callable[[], StateToKeep], lost: Callable[[list[str]], None]
) -> Iterator[None]:
    """Runs one forward of the core as `phase` requires: capture-aware answers during probe and
    warm-ups, and state tensors put back after each warm-up. `owner` (the GraphedForward) keys
    the snapshot; `state` is called only when a capture's warm-ups start; `lost` is called with
    the names of what a warm-up changed that cannot be put back. A capture, or an eager run
    (after a failed probe), ends it."""
    snapshots = getattr(_local, "snapshots", None)
    if snapshots is None:
        snapshots = _local.snapshots = {}
    if phase not in (PHASE_PROBE, PHASE_WARMUP):
        snapshots.pop(id(owner), None)
        yield
        return
    snapshot = snapshots.get(id(owner))
    if snapshot is None:
        snapshot = snapshots[id(owner)] = _Snapshot(state())
    outer = getattr(_local, "as_if_capturing", False)
    _local.as_if_capturing = True
    try:
        if phase == PHASE_PROBE:
            with _counting_syncs() as found:
                yield
            _probe_verdict(found)
        else:
            yield
    finally:
        _local.as_if_capturing = outer
        changed = snapshot.restore()
        if changed:
            lost(changed)
