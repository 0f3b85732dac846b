"""A child process that reports its work in phases, and the parent's side that reads the reports
and stops the child at a deadline: what the benchmark needs for work that may run long, hang or
crash (torch.compile, in compiled.py) without losing the run.

Protocol, one line each on the child's stdout (`say` writes them): `GRAPHED_BENCH BEGIN <phase>
<deadline_s>`, `GRAPHED_BENCH RESULT <json>`, `GRAPHED_BENCH END <phase>`; a deadline of 0 means
DEFAULT_PHASE_DEADLINE_S. Any other line is the child's own output, of which the parent keeps
the last 15. The parent (`supervise`) kills the child's process group when a phase outlives its
deadline or the whole child outlives its budget; the child (`exit_with_parent`) ends itself when
the parent goes away.

It knows nothing of what the child measures: the parent hands each RESULT to a callback.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_PHASE_DEADLINE_S", "Outcome", "exit_with_parent", "say", "supervise"]

TAG = "GRAPHED_BENCH"
DEFAULT_PHASE_DEADLINE_S = 150.0
_TAIL_LINES = 15
_AFTER_EXIT_S = 5.0  # how long to keep reading after the child exited


@dataclass
class Outcome:
    """How the child ended: its exit status; (phase, why) when it was stopped; its last lines of
    output; and the seconds from its start to the end of the supervision."""

    returncode: int
    killed_for: tuple[str, str] | None
    tail: list[str]
    seconds: float


# -- parent side ------------------------------------------------------------------------------


def supervise(
    command: list[str],
    *,
    env: dict[str, str],
    budget_s: float,
    on_result: Callable[[dict], None],
    name: str,
    log: Callable[[str], None] = print,
) -> Outcome:
    """Runs `command` in a session of its own, hands each RESULT to `on_result` as it arrives,
    and stops the child (and the workers it started) at a phase's deadline or at `budget_s`.
    `name` is what the log lines call the child."""
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: stopping it stops its workers
    )
    lines = _pump(process)
    watch = _Watch(name, on_result, log)
    exited_at = 0.0
    while True:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            line = ""
        if line is None:
            break
        now = time.monotonic()
        watch.read(line, now)
        watch.check(now, now - started, budget_s)
        if watch.killed_for is not None and process.poll() is None:
            stop(process)
        # A worker the child left behind may hold the pipe open: stop reading soon after it exits.
        if process.poll() is not None:
            exited_at = exited_at or now
            if now - exited_at > _AFTER_EXIT_S:
                break
    process.wait()
    stop(process)  # workers it may have left behind
    return Outcome(process.returncode, watch.killed_for, watch.tail, time.monotonic() - started)


def stop(process: subprocess.Popen) -> None:
    """Kills the child's process group (the child and the workers it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _pump(process: subprocess.Popen) -> queue.Queue[str | None]:
    """The child's output lines, read by a thread so that the parent can watch the clock; None
    after the last one."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            lines.put(raw.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


@dataclass
class _Watch:
    """What the parent knows of the child from its lines: the phase under way and its deadline,
    why it was stopped (if it was), and its last lines of its own output."""

    name: str
    on_result: Callable[[dict], None]
    log: Callable[[str], None]
    phase: str | None = None
    phase_started: float = 0.0
    phase_deadline: float = 0.0
    killed_for: tuple[str, str] | None = None
    tail: list[str] = field(default_factory=list)

    def read(self, line: str, now: float) -> None:
        if not line.startswith(TAG + " "):
            if line:
                self.tail = (self.tail + [line])[-_TAIL_LINES:]
            return
        words = line.split(" ", 3)
        if words[1] == "BEGIN":
            self.phase, self.phase_started = words[2], now
            deadline = float(words[3]) if len(words) > 3 else 0.0
            self.phase_deadline = deadline or DEFAULT_PHASE_DEADLINE_S
            self.log(f"  {self.name}: {self.phase} ...")
        elif words[1] == "END":
            self.phase = None
        elif words[1] == "RESULT":
            try:
                result = json.loads(line.split(" ", 2)[2])
            except (IndexError, ValueError):
                self.log(f"  {self.name}: unreadable result line: {line[:200]}")
            else:
                self.on_result(result)

    def check(self, now: float, elapsed: float, budget_s: float) -> None:
        """Decides, once, that the child must be stopped: its phase or its budget ran out."""
        if self.killed_for is not None:
            return
        if self.phase is not None and now - self.phase_started > self.phase_deadline:
            why = f"it took longer than {self.phase_deadline:.0f} s, so it was stopped"
            self.killed_for = (self.phase, why)
        elif elapsed > budget_s:
            why = f"the child passed its {budget_s:.0f} s budget"
            self.killed_for = (self.phase or self.name, why)


# -- child side -------------------------------------------------------------------------------


def say(*words: Any) -> None:
    """One protocol line on stdout, flushed at once."""
    print(TAG, *words, flush=True)


def exit_with_parent() -> None:
    """Ends this child if its parent goes away (it runs in a session of its own)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
