"""Graph memory as users see it: graphed.MemoryPool, one graph memory pool that several runners
(the GraphedForwards of one pipeline) share, so that they reserve about what the largest of them
needs rather than the sum; and memory_table, a runner's memory in one table.

Runners sharing a pool share the memory their graphs work in, so their replays must not overlap:
captures and warm-ups into one pool take turns (the pool's lock), and a replay on another stream
than the pool's last one first waits for the work queued on that stream (an event), so replays
from several streams are made to follow each other rather than refused. Outputs are fresh tensors
as without a pool; static_outputs=True buffers are the graph's own and survive until the next
replay of the same graph, as without a pool."""

from __future__ import annotations

import sys
import weakref
from typing import Any, TextIO

import torch

from . import _library
from ._device_hooks import resolve_device


class MemoryPool:
    """One graph memory pool on `device`, for runners made with `memory_pool=` this object.

    On CUDA the runners' graphs, warm-ups and sync probes all allocate from one private pool of
    torch's caching allocator. Where the device's backend has no pools to share (the CPU, the
    emulated test backend) the pool only groups its runners; each keeps its own memory. The pool
    lives while this object or a runner made on it does."""

    def __init__(self, device: torch.device | str | int) -> None:
        _library.load_library()
        self.device = resolve_device(torch.device(device))
        self._id: int | None = torch.ops.graphed.pool_create(self.device)
        self._finalizer = weakref.finalize(self, torch.ops.graphed.pool_release, self._id)

    @property
    def pool_id(self) -> int:
        """The id torch.ops.graphed.create's memory_pool takes for this pool."""
        if self._id is None:
            raise ValueError("graphed: this memory pool is released")
        return self._id

    def release(self) -> None:
        """Lets go of the pool: runners made on it keep it; no new runner can be. Idempotent."""
        if self._id is not None:
            self._id = None
            self._finalizer()

    def __repr__(self) -> str:
        state = "released" if self._id is None else f"id={self._id}"
        return f"MemoryPool(device={self.device}, {state})"


def pool_id_of(memory_pool: MemoryPool | None) -> int | None:
    """The id create takes for `memory_pool` (None: the runner gets a pool of its own)."""
    if memory_pool is None:
        return None
    if not isinstance(memory_pool, MemoryPool):
        raise TypeError(
            f"memory_pool must be a graphed.MemoryPool or None, got {type(memory_pool).__name__}"
        )
    return memory_pool.pool_id


def _size(count: int) -> str:
    """Bytes as a person reads them: B, KiB or MiB; "unknown" for -1."""
    if count < 0:
        return "unknown"
    if count < 2**10:
        return f"{count} B"
    if count < 2**20:
        return f"{count / 2**10:.1f} KiB"
    return f"{count / 2**20:.1f} MiB"


def memory_table(runner: Any, file: TextIO | None = sys.stdout) -> str:
    """A runner's memory (a GraphedForward or a graphed.Runner): one row per resident graph, most
    recently used first, with its input shapes, its static buffers, the static input bytes it
    shares with other graphs of the runner, the device memory its capture took (in use) and added
    to what the allocator reserves; then the runner's totals and what its graph pool reserves now.
    Printed to `file` (None: only returned)."""
    stats = runner.stats()
    rows = [("shapes", "replays", "static", "shared inputs", "capture took", "capture reserved")]
    for entry in runner.entries():
        rows.append(
            (
                entry["shapes"] or "-",
                str(entry["replays"]),
                _size(entry["static_bytes"]),
                _size(entry["shared_input_bytes"]),
                _size(entry["device_bytes"]),
                _size(entry["reserved_bytes"]),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.append(
        f"{stats['graphs']} graph(s): static buffers {_size(stats['pool_bytes'])} "
        f"(of which {_size(stats['shared_input_bytes'])} shared between graphs saved), "
        f"captures took {_size(stats['graph_bytes'])} on the device; the graph pool reserves "
        f"{_size(stats['pool_reserved_bytes'])} (shared by the runners of one pool)"
    )
    text = "\n".join(lines)
    if file is not None:
        print(text, file=file)
    return text


__all__ = ["MemoryPool", "memory_table", "pool_id_of"]
