"""graphed.report(): one table of every live runner of the process (GraphedForward, graphed.Runner,
a region's), for a person at a console or at exit (GRAPHED_REPORT=1): what each captured and
replayed, what ran eagerly and why, what it holds, and why it is disabled. It reads stats() and
nothing else, so what it prints is what a program can read for itself."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from . import _ops

__all__ = ["report"]

_COLUMNS = (
    "runner",
    "state",
    "graphs",
    "captures",
    "replays",
    "hits",
    "eager",
    "held back",
    "pool MiB",
)


def _row(name: str, stats: dict[str, Any]) -> tuple[str, ...]:
    state = "enabled" if stats["enabled"] else f"eager: {stats['disabled_cause']}"
    return (
        name,
        state,
        str(stats["graphs"]),
        str(stats["captures"]),
        str(stats["replays"]),
        str(stats["hits"]),
        str(stats["eager_calls"]),
        str(stats["churn_eager_calls"]),
        f"{stats['pool_bytes'] / 2**20:.1f}",
    )


def _details(name: str, stats: dict[str, Any]) -> list[str]:
    lines = []
    by_reason = stats.get("eager_by_reason") or {}
    if by_reason:
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(by_reason.items()))
        lines.append(f"  {name}: eager calls it ran itself: {reasons}")
    if not stats["enabled"]:
        lines.append(f"  {name}: {stats['disabled_reason']}")
    return lines


def report(file: TextIO | None = None) -> str:
    """The table of every live runner, printed to `file` (standard output when None, so that
    `graphed.report()` in a script shows it) and returned as text. Each
    row: the runner's name, enabled or why not (stats()["disabled_cause"]), resident graphs,
    captures, replays, hits (calls served by a graph an earlier call captured), eager calls,
    those the churn guard held back, and the static buffers' MiB; below the table, each
    runner's eager calls by reason and its disabled_reason."""
    rows, details = [], []
    for name, stats in _ops.live_runner_stats():
        rows.append(_row(name, stats))
        details.extend(_details(name, stats))
    if not rows:
        text = "graphed: no live runner\n"
    else:
        widths = [max(len(row[i]) for row in (_COLUMNS, *rows)) for i in range(len(_COLUMNS))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in (_COLUMNS, *rows)
        ]
        text = "\n".join(["graphed: runners of this process", *lines, *details]) + "\n"
    out = sys.stdout if file is None else file
    if out is not None:  # sys.stdout is None under pythonw and some embedders
        out.write(text)
        out.flush()
    return text
