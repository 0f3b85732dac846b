"""Graphs go before their process group. A runner created with `group=` lets go of the group,
and of every graph it captured, before the group is destroyed: NCCL waits, when a communicator is
destroyed, for the graphs that use it, and a group kept alive past destroy_process_group() is torn
down at interpreter exit instead, by threads that can no longer take the interpreter's lock (a
process that aborts at exit). torch has no hook for a group's end, so when the first runner with a
group is made, graphed wraps torch.distributed.destroy_process_group and registers an atexit
handler (which runs before the interpreter tears modules down); importing graphed changes
neither. Code that took destroy_process_group by name before that runner was made (`from
torch.distributed import destroy_process_group`) calls torch's own, and its runners are
released at exit only. Either way graphed drops the graphs of the runners of the groups that
end, disables those runners (their calls run eager from then on, saying why) and forgets the
group. The agreement itself holds no reference to the group: the shim finds it by name at each
agreement (shim/gf_shim_group.h)."""

from __future__ import annotations

import atexit
import functools
import threading
from typing import Any

import torch

from . import _ops

__all__ = ["group_name_of", "release_all", "release_before_teardown"]

DESTROYED_REASON = "graphed: its process group was destroyed; calls run eager"
EXITING_REASON = "graphed: the interpreter is exiting; calls run eager"

_lock = threading.Lock()
_installed = False


def group_name_of(group: Any) -> str:
    """The name under which torch registered `group` (the shim resolves it at each agreement)."""
    name = getattr(group, "group_name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"graphed: group must be a torch.distributed ProcessGroup (for example "
            f"torch.distributed.group.WORLD or one from new_group()), got {type(group).__name__}"
        )
    return name


def release_before_teardown() -> None:
    """Makes every runner with a group (graphed._ops' registry: each answers `group` and
    release_group(reason)) let go of it before the group is destroyed or the interpreter exits:
    installs the wrapper of destroy_process_group and the atexit handler, at the first call."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    if torch.distributed.is_available():
        _install_destroy_hook()
    # Registered after torch and after the group was made: atexit runs it before torch's own exit
    # handlers, while the interpreter is whole.
    atexit.register(_release_at_exit)


def release_all(reason: str, group: Any = None) -> None:
    """Releases the registered runners of `group` (None: of every group)."""
    for runner in _ops.registered_owners():
        runner_group = getattr(runner, "group", None)
        if runner_group is not None and (group is None or runner_group is group):
            runner.release_group(reason)


def _install_destroy_hook() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        everything = group is None or group is dist.GroupMember.WORLD
        release_all(DESTROYED_REASON, None if everything else group)
        return original(group)

    destroy_process_group.__graphed_original__ = original  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    if getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group


def _release_at_exit() -> None:
    if torch.distributed.is_available():
        release_all(EXITING_REASON)
