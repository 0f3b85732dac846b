"""How deep a forward runs on this thread now: the one per-thread guard the layers above the C
entry points use to tell a call from inside a forward from a call of its own (Note [The call in
flight], pyext/gf_call_state.h, lists every per-thread state graphed keeps and why). Per thread,
because "this call comes from inside that forward" is a fact about the thread's stack: another
thread's call is a call of its own.

A `with depth:` block counts one level; `depth.level` is how many are open on this thread. Entering
and leaving cost two attribute writes (a class, not a generator context manager, whose frames cost
about ten times that on the disabled path, which answers every call in Python)."""

from __future__ import annotations

import threading

__all__ = ["ReentryDepth"]


class ReentryDepth(threading.local):
    """The open levels of one forward on this thread (0 on a thread that never entered)."""

    level = 0

    def __enter__(self) -> ReentryDepth:
        self.level += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.level -= 1
