"""Device launches per call, counted with torch.profiler (CPU runtime-API events and CUDA activity),
for GraphedForward and the seed wrapper at K = 4 and K = 64 input tensors: graphed's promise is a
constant number of launches per replay (one graph launch: the input and output copies are nodes of
the graph) whatever K is, where a Python wrapper issues one copy per tensor.

It runs after every timing in bench/run.py, since attaching the profiler can slow later launches.
"""

from __future__ import annotations

import collections
from typing import Any

import graphed
import torch
from seed_wrapper import SeedGraphedForward
from workloads import FirstPlusOne

__all__ = ["run_launches"]

_LAUNCH_PREFIXES = ("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset")


def _is_launch(name: str) -> bool:
    """Runtime or driver API calls that put work on a stream."""
    return "Launch" in name or name.startswith(_LAUNCH_PREFIXES)


def _profile(fn: Any, calls: int) -> dict:
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = profiler.events()
    launches = collections.Counter(event.name for event in events if _is_launch(event.name))
    device = collections.Counter(
        event.name for event in events if event.device_type == torch.autograd.DeviceType.CUDA
    )
    return {
        "calls": calls,
        "launches_per_call": sum(launches.values()) / calls,
        "graph_launches_per_call": sum(
            count for name, count in launches.items() if "GraphLaunch" in name
        )
        / calls,
        "device_activities_per_call": sum(device.values()) / calls,
        "launches": {name: count / calls for name, count in sorted(launches.items())},
        "device_activities": {name: count / calls for name, count in sorted(device.items())},
    }


def run_launches(device: torch.device, ks: tuple[int, ...] = (4, 64), calls: int = 8) -> dict:
    """Launches and device activities per call, for graphed and the seed wrapper at each K."""
    results: dict[str, dict] = {"graphed": {}, "seed": {}}
    module = FirstPlusOne()
    with torch.no_grad():
        # A first profiled session pays for the profiler's own set-up.
        warm = torch.zeros(8, device=device)
        _profile(lambda: warm + 1, 2)
        for k in ks:
            xs = [torch.randn(8, device=device) for _ in range(k)]
            runners = {
                "graphed": graphed.GraphedForward(module, device=device, name=f"launch-k{k}"),
                "seed": SeedGraphedForward(module, device=device),
            }
            for name, runner in runners.items():
                for _ in range(3):
                    runner(xs=xs)
                torch.cuda.synchronize()
                counted = _profile(lambda runner=runner, xs=xs: runner(xs=xs), calls)
                counted["stats"] = runner.stats()
                results[name][str(k)] = counted
    return results
