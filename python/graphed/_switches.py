"""What can be set from outside the program, as torch.compile's TORCHDYNAMO_DISABLE and TORCH_LOGS
are: for a bisect or an incident, without touching code.

- GRAPHED_DISABLE=1: every runner made from then on (GraphedForward, graphed.Runner, regions)
  starts disabled, with the reason "disabled by GRAPHED_DISABLE" and the cause "user"; its calls
  run eager with the same results and count as eager calls. Said once per process (WARNING).
- GRAPHED_LOG=debug|info|warning|error: the level of the "graphed" logger, read at import, with a
  stderr handler of its own where the program configured none (so that INFO lines show without
  logging.basicConfig).
- GRAPHED_REPORT=1: graphed.report() printed to stderr at interpreter exit (one table of every
  live runner: what it captured, replayed, ran eagerly and why).
A value none of these takes is said once (WARNING) and ignored: a switch never stops a program.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Callable

from ._observe import configured

__all__ = [
    "DISABLE_ENV",
    "DISABLED_REASON",
    "LOG_ENV",
    "REPORT_ENV",
    "apply_at_import",
    "disabled_from_outside",
]

DISABLE_ENV = "GRAPHED_DISABLE"
LOG_ENV = "GRAPHED_LOG"
REPORT_ENV = "GRAPHED_REPORT"
DISABLED_REASON = "disabled by GRAPHED_DISABLE"

_log = logging.getLogger("graphed")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_said: set[str] = set()


def _say_once(key: str, message: str, *args: object) -> None:
    if key not in _said:
        _said.add(key)
        _log.warning(message, *args)


def _flag(name: str) -> bool:
    """An on/off variable: 1, true, yes, on (any case) or 0, false, no, off, empty or unset; any
    other value is said once and reads as off."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        _say_once(
            f"{name}={value}",
            "%s=%r is not one of 1, 0, true, false, yes, no, on, off: ignored",
            name,
            os.environ.get(name),
        )
    return False


def disabled_from_outside() -> bool:
    """Whether GRAPHED_DISABLE asks every runner made now to start disabled (said once)."""
    if not _flag(DISABLE_ENV):
        return False
    _say_once(
        DISABLE_ENV,
        "%s is set: every graphed runner made from now on runs eager (its "
        "calls give the same results; stats() says why)",
        DISABLE_ENV,
    )
    return True


def _apply_log_level() -> None:
    value = os.environ.get(LOG_ENV, "").strip().lower()
    if not value:
        return
    level = _LEVELS.get(value)
    if level is None:
        _say_once(
            LOG_ENV,
            "%s=%r is not a level (debug, info, warning, error): ignored",
            LOG_ENV,
            os.environ.get(LOG_ENV),
        )
        return
    _log.setLevel(level)
    if not configured(_log.name):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        _log.addHandler(handler)


def _report_at_exit(report: Callable[..., str]) -> None:
    try:
        report(file=sys.stderr)
    except Exception as error:  # noqa: BLE001 - at exit a report that fails must not abort it
        print(f"graphed: the report at exit failed: {error!r}", file=sys.stderr)


def apply_at_import(report: Callable[..., str]) -> None:
    """GRAPHED_LOG and GRAPHED_REPORT, read once when graphed is imported; `report` is
    graphed.report (handed in: graphed._report reads the runners, which read this module)."""
    _apply_log_level()
    if _flag(REPORT_ENV):
        atexit.register(_report_at_exit, report)
