"""What a runner says about itself, through `logging` (logger "graphed") and, once per runner,
`warnings`: the native core tells an observer operator of each capture (its time and the device
memory the graph took), each eviction, churn and the disable; this module registers that
operator for a GraphedForward and turns the events into log records.

- INFO per capture: runner, key summary (dtypes and shapes), seconds, device memory.
- DEBUG per eviction.
- WARNING once when captures keep evicting (churn), naming the keys that came and went.
- WARNING for a disable or a runner warning, and the same sentence once through `warnings`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import re
import threading
import warnings
import weakref

import torch

_log = logging.getLogger("graphed")
_observers_library = torch.library.Library("graphed_observers", "FRAGMENT")
_numbers = itertools.count()
_lock = threading.Lock()
_SCHEMA = (
    "(str kind, str message, float seconds, int device_bytes, int reserved_bytes, "
    "int static_bytes, int count, str shapes) -> ()"
)
_RECENT_KEYS = 6
# The core's messages carry their own "graphed: " for hosts that print them as they are (its
# TORCH_WARN path); a record here already starts with it, so it is dropped from the message,
# also where the core nests one message in another ("capture failed: graphed: ...").
_NESTED_PREFIX = re.compile(r"(^|: )graphed: ")


def said_once(message: str) -> str:
    """`message` without the "graphed: " prefixes of the core's messages inside it."""
    return _NESTED_PREFIX.sub(r"\1", message)


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def _growth(count: int) -> str:
    """What a capture added: "+12.0 MiB", or "unknown" where the backend cannot say (-1)."""
    return "unknown" if count == -1 else f"{count / 2**20:+.1f} MiB"


class RunnerLog:
    """The log of one runner: what it captured lately, and whether it has warned yet."""

    def __init__(self, name: str) -> None:
        self.name = f"runner '{name}'"
        self.recent: collections.deque[str] = collections.deque(maxlen=_RECENT_KEYS)
        self.warned = False

    def event(
        self,
        kind: str,
        message: str,
        seconds: float,
        device_bytes: int,
        reserved_bytes: int,
        static_bytes: int,
        count: int,
        shapes: str,
    ) -> None:
        message = said_once(message)
        if kind == "captured":
            self.recent.append(shapes)
            _log.info(
                "graphed: %s captured [%s] in %.3f s; device memory reserved %s, in use %s "
                "(static buffers %s)",
                self.name,
                shapes,
                seconds,
                _growth(reserved_bytes),
                _growth(device_bytes),
                _mib(static_bytes),
            )
        elif kind == "evicted":
            _log.debug("graphed: %s evicted [%s] (%s)", self.name, shapes, _mib(static_bytes))
        elif kind == "churn":
            keys = "; ".join(f"[{key}]" for key in self.recent)
            _log.warning("graphed: %s churns: %s; recent keys: %s", self.name, message, keys)
        else:  # "disabled" or "warning"
            _log.warning("graphed: %s: %s", self.name, message)
            if not self.warned:
                self.warned = True
                warnings.warn(f"graphed: {self.name}: {message}", RuntimeWarning, stacklevel=4)


def define_observer(log: RunnerLog) -> str:
    """Registers graphed_observers::<n> for `log` (held weakly: the operator outlives it) and
    returns the operator's qualified name, for torch.ops.graphed.create's observer_op."""
    target = weakref.ref(log)

    def observe(*arguments) -> None:
        runner_log = target()
        if runner_log is not None:
            runner_log.event(*arguments)

    with _lock:
        name = f"log{next(_numbers)}"
        _observers_library.define(name + _SCHEMA)
        _observers_library.impl(name, observe, "CompositeExplicitAutograd")
    return f"graphed_observers::{name}"


def observer_for(name: str) -> tuple[RunnerLog, str]:
    """A RunnerLog for the runner called `name` and the operator that feeds it."""
    log = RunnerLog(name)
    return log, define_observer(log)


__all__ = ["RunnerLog", "define_observer", "observer_for", "said_once"]
