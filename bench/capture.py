"""What capturing costs, graphed against the seed wrapper: the latency of the first call of a fresh
instance (probe, warm-up, capture and the first replay, all included) and the device memory that
16 resident graphs of different row counts hold.

First calls are timed for fresh instances, alternating graphed and seed and which of them goes
first in each round, after one untimed instance of each has paid the process's one-time costs
(kernel loading, library handles).
Memory is read from the caching allocator: memory_allocated and max_memory_allocated deltas
after reset_peak_memory_stats (the issue's measure), and memory_reserved deltas, which also show
the free blocks that private graph pools keep.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import graphed
import torch
from seed_wrapper import SeedGraphedForward
from workloads import build_model, dit_config, request_inputs

__all__ = ["run_first_call", "run_memory"]

MEMORY_ROWS = [64 + 8 * index for index in range(16)]


def _settle() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _factories(model: Any, device: torch.device) -> dict[str, Callable[[], Any]]:
    return {
        # churn_limit=0: the memory rows capture 16 shapes in a row, each at first sight, as the
        # seed wrapper does (the churn guard would run all but two eager until they came again).
        "graphed": lambda: graphed.GraphedForward(
            model,
            device=device,
            max_entries=16,
            warmup_iters=2,
            name="capture-bench",
            churn_limit=0,
        ),
        "seed": lambda: SeedGraphedForward(model, device=device, max_entries=16, warmup_iters=2),
    }


def run_first_call(size: str, device: torch.device, repeats: int = 3) -> dict:
    """Milliseconds of a fresh instance's first call (and of creating it), median of `repeats`."""
    cfg = dit_config(size, device, torch.bfloat16)
    model = build_model(cfg)
    kwargs = request_inputs(cfg, forwards=1)[0]
    factories = _factories(model, device)
    first: dict[str, list[float]] = {name: [] for name in factories}
    create: dict[str, list[float]] = {name: [] for name in factories}
    with torch.no_grad():
        model(**kwargs)
        for repeat in range(repeats + 1):
            order = list(factories.items())
            for name, factory in order if repeat % 2 else reversed(order):
                _settle()
                start = time.perf_counter()
                wrapper = factory()
                created = time.perf_counter()
                output = wrapper(**kwargs)
                torch.cuda.synchronize()
                done = time.perf_counter()
                if repeat > 0:  # the first instance of each pays one-time process costs
                    create[name].append((created - start) * 1e3)
                    first[name].append((done - created) * 1e3)
                del wrapper, output
    _settle()
    return {
        "size": size,
        "repeats": repeats,
        "methods": {
            name: {
                "first_call_ms": statistics.median(first[name]),
                "first_call_ms_all": first[name],
                "create_ms": statistics.median(create[name]),
            }
            for name in factories
        },
    }


def run_memory(device: torch.device, size: str = "small") -> dict:
    """Device memory held by 16 resident graphs (one per row count in MEMORY_ROWS)."""
    cfg = dit_config(size, device, torch.bfloat16)
    model = build_model(cfg)
    inputs = {
        rows: request_inputs(dit_config(size, device, torch.bfloat16, rows=rows), forwards=1)[0]
        for rows in MEMORY_ROWS
    }
    factories = _factories(model, device)
    factories["seed_shared_pool"] = lambda: SeedGraphedForward(
        model, device=device, max_entries=16, warmup_iters=2, share_pool=True
    )
    results: dict[str, Any] = {"size": size, "rows": MEMORY_ROWS, "methods": {}}
    with torch.no_grad():
        model(**inputs[MEMORY_ROWS[0]])
        for name, factory in factories.items():
            _settle()
            torch.cuda.reset_peak_memory_stats()
            base_allocated = torch.cuda.memory_allocated()
            base_reserved = torch.cuda.memory_reserved()
            wrapper = factory()
            for rows in MEMORY_ROWS:
                output = wrapper(**inputs[rows])
                del output
            torch.cuda.synchronize()
            entry = {
                "allocated_bytes": torch.cuda.memory_allocated() - base_allocated,
                "peak_allocated_bytes": torch.cuda.max_memory_allocated() - base_allocated,
                "reserved_bytes": torch.cuda.memory_reserved() - base_reserved,
                "stats": wrapper.stats(),
            }
            del wrapper
            _settle()
            entry["left_after_release_bytes"] = torch.cuda.memory_allocated() - base_allocated
            results["methods"][name] = entry
    return results
