"""Why this exists: the order in which a runner captures its shapes decides how much memory its
graph pool keeps, and a server knows its shapes before traffic arrives. graphed.warm_up captures
them ahead, the largest first.

A graph pool gives a new capture the free blocks the graphs before it left, where they fit: the
blocks of a large shape serve every smaller one, while blocks sized for a small shape do not fit a
larger one's, which then takes new segments beside them. On an H200 (torch 2.11) six latent
lengths of the Stable Audio Open DiT reserved 302 MiB captured smallest first, 272 MiB largest
first, and 264 MiB for the largest alone (bench/memory_shapes.py, docs/benchmarks.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ._forward import GraphedForward
from ._tree import flatten_kwargs

_log = logging.getLogger("graphed")
# Fewer calls than this warm up without a progress bar.
_PROGRESS_FROM = 4


def _with_progress(calls: list, runner: GraphedForward, progress: bool | None) -> Iterable:
    """`calls`, through a tqdm bar on stderr where tqdm is installed (diffusers, transformers and
    huggingface_hub bring it) and `progress` asks for one (None: from _PROGRESS_FROM calls)."""
    if progress is False or (progress is None and len(calls) < _PROGRESS_FROM):
        return calls
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return calls
    return tqdm(calls, desc=f"graphed: warming up '{runner.name}'", unit="shape")


def _tensor_bytes(call: Mapping[str, Any]) -> int:
    """The bytes of every tensor in one call's keyword arguments, found by the walker that keys
    graphed's calls (nested containers included; what it refuses is refused here, by path)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in flatten_kwargs(dict(call))[0])


def warm_up(
    runner: GraphedForward, calls: Iterable[Mapping[str, Any]], progress: bool | None = None
) -> int:
    """Calls `runner` once with each of `calls` (the keyword arguments of one call each; a
    positional parameter by its name), the one whose tensors hold the most bytes first, so that
    each new key's graph is captured before traffic arrives and the later, smaller captures reuse
    the memory of the larger ones. Calls of equal size keep their order. The outputs are dropped;
    the calls run in the caller's grad mode and on its stream, as served calls will. Returns the
    number of graphs captured (0 when every key had one already, or when the runner runs eager),
    and logs it at INFO with the time taken and the graph pool's growth. `progress` shows a tqdm
    bar (None, the default: from four calls on, where tqdm is installed). A call that is not a
    mapping, or holds what graphed cannot take (the kwarg path named), is refused before any
    runs."""
    if not isinstance(runner, GraphedForward):
        raise TypeError(
            f"graphed.warm_up takes a GraphedForward, got {type(runner).__name__} (graph_pipeline "
            "returns each component's GraphedForward by name; for a graphed.Runner, call "
            "runner.forward(key, inputs) for each shape, the largest first)"
        )
    if isinstance(calls, Mapping):
        raise TypeError(
            "graphed.warm_up takes a list of calls, each a dict of keyword arguments; got one "
            "dict: wrap it in a list, warm_up(runner, [kwargs])"
        )
    ordered = list(calls)
    for index, call in enumerate(ordered):
        if not isinstance(call, Mapping):
            raise TypeError(
                f"graphed.warm_up: calls[{index}] is a {type(call).__name__}, not a mapping of "
                "keyword arguments; pass each call as dict(name=value, ...)"
            )
    largest_first = sorted(ordered, key=_tensor_bytes, reverse=True)
    before = runner.stats()
    started = time.perf_counter()
    for call in _with_progress(largest_first, runner, progress):
        held_back = runner.stats()["churn_eager_calls"]
        runner(**call)
        if runner.stats()["churn_eager_calls"] > held_back:
            # The churn guard (warm_up's shapes are new keys in a row) ran it eager: a key's
            # second call captures.
            runner(**call)
    after = runner.stats()
    captured = after["captures"] - before["captures"]
    pool = after["pool_reserved_bytes"]
    grown = pool - before["pool_reserved_bytes"] if pool >= 0 else None
    _log.info(
        "runner '%s': warm_up captured %d graph(s) for %d call(s) in %.2f s; graph pool %s",
        runner.name,
        captured,
        len(largest_first),
        time.perf_counter() - started,
        "size unknown" if grown is None else f"{pool / 2**20:.1f} MiB ({grown / 2**20:+.1f})",
    )
    return captured


__all__ = ["warm_up"]
