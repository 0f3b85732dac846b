"""What a runner says about itself, through `logging` (logger "graphed"): the native core tells
a GraphedForward's RunnerLog of each capture (its time and the device memory the graph took), each
eviction, churn and the disable (a direct hook of its runner, pyext/gf_model_hooks.cpp), and the
log turns the events into log records.

- INFO per capture: runner, key summary (dtypes and shapes), seconds, device memory.
- DEBUG per eviction.
- INFO per graph dropped before a replay because a tensor it read from outside its kwargs and
  module was freed ("stale": Note [A graph's externals], ops/gf_runner.c), naming the tensor.
- WARNING once when the churn guard starts (new keys keep coming and none comes back), naming the
  kwargs that keep changing (graphed._churn) and the shapes of the latest keys; INFO when it
  starts again later. The core tells the start before the call it started on runs, so it is said
  once that call is recorded (RunnerLog.say_churn). Captures that keep evicting where no guard
  runs ("thrash") are said at once, the same way.
- WARNING for a disable (once: a runner is disabled once) or a runner warning.
- WARNING once per process, for the first runner made without graphs (graphs_unavailable).

The disable is also how a GraphedForward learns that its runner is disabled for good, whoever
disabled it (a failed capture or replay, a rank of its group, disable()): RunnerLog.turned_off,
which it sets, flips its switch (its calls are answered in Python from then on) and does nothing
else. The disable's warning waits for the owner (say_disabled), which decides on its call path,
from the cause code, whether its forward now runs in regions, whose warning then says it once.

Messages carry no "graphed: " of their own: the logger's name says where a record comes from,
and a format with %(name)s would print it twice. Where the program configured no handler,
logging's last resort prints the bare message, so the "graphed" logger has a handler of its own
that stands in for it with the name in front (and does nothing once any handler is configured).
"""

from __future__ import annotations

import collections
import logging
import sys
from collections.abc import Callable

_log = logging.getLogger("graphed")
_RECENT_KEYS = 6
# The core's messages start with their own "graphed: " for hosts that print them as they are (its
# TORCH_WARN path); a record's logger name says it already, so it is dropped from the message. The
# core nests none inside (gf_text_said_once, ops/gf_runner_release.c).
_NAME = "graphed: "


def first_few(names: list[str], separator: str = ", ", shown: int = 4) -> str:
    """The first `shown` of `names` joined, and how many more there are: a message's list."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return separator.join(names[:shown]) + more


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def _growth(count: int) -> str:
    """What a capture added: "+12.0 MiB", or "unknown" where the backend cannot say (-1)."""
    return "unknown" if count == -1 else f"{count / 2**20:+.1f} MiB"


class _NamedLastResort(logging.Handler):
    """logging's last resort for logger "graphed", with the logger's name in front: where no
    handler is configured on the way up from "graphed" (no basicConfig, no handler of the
    program's), a record of the last resort's level or above goes to stderr as "graphed: ...";
    anywhere a handler is configured (or `logging.lastResort` is None) this prints nothing and
    the program's handlers alone show the record."""

    def emit(self, record: logging.LogRecord) -> None:
        last_resort = logging.lastResort
        if last_resort is None or record.levelno < last_resort.level or configured(record.name):
            return
        try:
            sys.stderr.write(f"{record.name}: {self.format(record)}\n")
        except Exception:  # noqa: BLE001 - as logging's own handlers do
            self.handleError(record)


def configured(name: str) -> bool:
    """Whether a handler other than graphed's stand-in sees records of logger `name`."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None:
        if any(type(handler) is not _NamedLastResort for handler in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


if not any(type(handler) is _NamedLastResort for handler in _log.handlers):
    _log.addHandler(_NamedLastResort())


class RunnerLog:
    """The log of one runner: what it captured lately."""

    def __init__(self, name: str) -> None:
        self.name = f"runner '{name}'"
        self.recent: collections.deque[str] = collections.deque(maxlen=_RECENT_KEYS)
        # Called at the "disabled" event (the core sends it once, when the runner goes from
        # enabled to disabled; a runner never comes back): the owner's switch, nothing more.
        self.turned_off: Callable[[], None] | None = None
        # The disable's message until the owner says it (say_disabled) or says it otherwise.
        self.disable_pending: str | None = None
        # Names the kwargs that keep changing when the churn guard starts (graphed._churn); the
        # first start is a WARNING, later ones INFO.
        self.describe_churn: Callable[[], str] | None = None
        self.churn_said = False
        # The churn guard's start, told by the core before the call it started on ran: said by
        # say_churn once that call is recorded (graphed._eager, GraphedForward._run_module), so
        # that the warning names it too.
        self.churn_pending: str | None = None

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
        message = message.removeprefix(_NAME)
        if kind == "disabled":
            self.disable_pending = message
            if self.turned_off is not None:
                self.turned_off()
            else:
                self.say_disabled()
        elif kind == "captured":
            self.recent.append(shapes)
            _log.info(
                "%s captured [%s] in %.3f s; device memory reserved %s, in use %s "
                "(static buffers %s)",
                self.name,
                shapes,
                seconds,
                _growth(reserved_bytes),
                _growth(device_bytes),
                _mib(static_bytes),
            )
        elif kind == "evicted":
            _log.debug("%s evicted [%s] (%s)", self.name, shapes, _mib(static_bytes))
        elif kind == "stale":
            _log.info("%s: [%s] %s", self.name, shapes, message)
        elif kind == "churn":
            self.churn_pending = message
        elif kind == "thrash":  # unguarded captures that keep evicting: said now
            self.churn_pending = message
            self.say_churn()
        else:  # "warning"
            # One channel, the logger: it is where every other event of a runner goes (and the
            # first runner's "graphs unavailable"), so a program routes, filters or silences
            # graphed in one place, and each record names its runner. A RuntimeWarning beside it
            # printed the same sentence a second time on the same stderr (an offload hook's
            # reason was read three times with the log record GraphedForward added), and
            # warnings' default filter shows a warning once per code location, not per runner.
            _log.warning("%s: %s", self.name, message)

    def say_disabled(self) -> None:
        """Says the pending disable (a WARNING), once; nothing when none is pending."""
        message, self.disable_pending = self.disable_pending, None
        if message is not None:
            _log.warning("%s: %s", self.name, message)

    def say_churn(self) -> None:
        """Says the pending start of the churn guard: a WARNING the first time, INFO after."""
        message, self.churn_pending = self.churn_pending, None
        if message is not None:
            self._say_churn(message, logging.INFO if self.churn_said else logging.WARNING)
            self.churn_said = True

    def _say_churn(self, message: str, level: int) -> None:
        keys = "; ".join(f"[{key}]" for key in self.recent)
        changing = self.describe_churn() if self.describe_churn is not None else ""
        _log.log(
            level,
            "%s: %s. What changes from call to call: %s. Recent keys: %s. A value that "
            "changes every call can be passed as a tensor (graphed keys a tensor by its "
            "shape, not its values); see docs/troubleshooting.md",
            self.name,
            message,
            changing or "not named (the calls were made before this runner recorded them)",
            keys,
        )


_warned_unavailable = False


def graphs_unavailable(stats: dict) -> bool:
    """Whether a runner's stats() say graphs are unavailable to it (disabled_cause "unavailable":
    no backend, or a device the backend cannot serve); the first such runner of the process logs
    why."""
    global _warned_unavailable
    if stats["disabled_cause"] != "unavailable":
        return False
    if not _warned_unavailable:
        _warned_unavailable = True
        _log.warning("calls run eager: %s", stats["disabled_reason"])
    return True


__all__ = ["RunnerLog", "configured", "graphs_unavailable"]
