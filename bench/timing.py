"""Timing primitives shared by every benchmark in bench/, so that all methods are timed the same
way and their ratios mean something.

Host cost is the calling thread's CPU time per call (time.thread_time_ns) over short bursts of
calls, with the device synchronized outside each burst: a burst is short enough never to fill
the launch queue, so no call ever waits for the GPU and the time is purely host work. Bursts of
several methods are interleaved so that slow drifts (clocks, caches, other tenants) hit them
alike. Throughput is the plain wall-clock rate of many back-to-back calls with one synchronize at
the end. Device-bound work (a whole DiT request) is timed by wall clock between synchronizes.
Warm-up calls are always excluded; every figure is a median.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "HostClock",
    "choose_host_clock",
    "gc_paused",
    "host_cost_interleaved",
    "summarize",
    "throughput_us",
    "wall_ms_interleaved",
]

# A thread clock coarser than this cannot time a burst of a few microsecond-long calls.
_MAX_CLOCK_STEP_NS = 2_000


@dataclass(frozen=True)
class HostClock:
    """The clock host cost is read with, its observed step and the cost of reading it twice."""

    name: str
    read_ns: Callable[[], int]
    step_ns: int
    overhead_ns: int
    note: str

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "step_ns": self.step_ns,
            "overhead_ns": self.overhead_ns,
            "note": self.note,
        }


def _observed_step_ns(read_ns: Callable[[], int], budget_s: float = 0.5) -> int:
    """The smallest non-zero difference between consecutive readings (the clock's real step)."""
    steps = []
    deadline = time.perf_counter() + budget_s
    while len(steps) < 200 and time.perf_counter() < deadline:
        first = read_ns()
        second = read_ns()
        while second == first and time.perf_counter() < deadline:
            second = read_ns()
        if second > first:
            steps.append(second - first)
    return min(steps) if steps else 1 << 62


def _read_overhead_ns(read_ns: Callable[[], int]) -> int:
    samples = []
    for _ in range(2_000):
        first = read_ns()
        samples.append(read_ns() - first)
    return int(statistics.median(samples))


def choose_host_clock() -> HostClock:
    """time.thread_time_ns when its step is fine enough, else time.perf_counter_ns (which, with
    the device synchronized outside a burst that never fills the queue, also measures only host
    work, but counts any time the thread is descheduled)."""
    step = _observed_step_ns(time.thread_time_ns)
    if step <= _MAX_CLOCK_STEP_NS:
        return HostClock(
            "thread_time_ns",
            time.thread_time_ns,
            step,
            _read_overhead_ns(time.thread_time_ns),
            "calling thread's CPU time",
        )
    return HostClock(
        "perf_counter_ns",
        time.perf_counter_ns,
        _observed_step_ns(time.perf_counter_ns),
        _read_overhead_ns(time.perf_counter_ns),
        f"thread_time_ns steps by {step} ns here, too coarse for bursts; wall clock used instead",
    )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Collects once, then keeps the cyclic collector out of the timed region."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def summarize(samples: list[float]) -> dict:
    ordered = sorted(samples)
    count = len(ordered)
    return {
        "median": statistics.median(ordered),
        "p10": ordered[count // 10],
        "p90": ordered[min(count - 1, (count * 9) // 10)],
        "min": ordered[0],
        "n": count,
    }


def host_cost_interleaved(
    methods: dict[str, Callable[[], object]],
    clock: HostClock,
    sync: Callable[[], None],
    *,
    bursts: int,
    burst_len: int,
    warmup_bursts: int,
) -> dict[str, dict]:
    """Host microseconds per call of each method: the median over `bursts` bursts of `burst_len`
    back-to-back calls, bursts of all methods interleaved, the device synchronized before each
    burst and outside its timing, the clock's own reading cost subtracted."""
    read = clock.read_ns
    samples: dict[str, list[float]] = {name: [] for name in methods}
    calls = range(burst_len)
    with gc_paused():
        for index in range(warmup_bursts + bursts):
            for name, fn in methods.items():
                sync()
                start = read()
                for _ in calls:
                    fn()
                elapsed = read() - start
                if index >= warmup_bursts:
                    samples[name].append(max(elapsed - clock.overhead_ns, 0) / burst_len / 1e3)
        sync()
    return {name: summarize(values) for name, values in samples.items()}


def throughput_us(fn: Callable[[], object], sync: Callable[[], None], *, calls: int) -> float:
    """Wall-clock microseconds per call over `calls` back-to-back calls, one synchronize at the
    end (the device's pace once the host outruns it)."""
    with gc_paused():
        sync()
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        sync()
        elapsed = time.perf_counter_ns() - start
    return elapsed / calls / 1e3


def wall_ms_interleaved(
    methods: dict[str, Callable[[], object]],
    sync: Callable[[], None],
    host_clock: HostClock,
    *,
    rounds: int,
    warmup_rounds: int,
) -> dict[str, dict]:
    """Per method: wall-clock milliseconds of one call of `fn` (say, a whole request) between two
    synchronizes, and the host time the calls took before the final synchronize; the median over
    `rounds` rounds, each round running every method once, in turn."""
    wall: dict[str, list[float]] = {name: [] for name in methods}
    host: dict[str, list[float]] = {name: [] for name in methods}
    read = host_clock.read_ns
    with gc_paused():
        for index in range(warmup_rounds + rounds):
            for name, fn in methods.items():
                sync()
                start = time.perf_counter_ns()
                host_start = read()
                fn()
                host_elapsed = read() - host_start
                sync()
                elapsed = time.perf_counter_ns() - start
                if index >= warmup_rounds:
                    wall[name].append(elapsed / 1e6)
                    host[name].append(host_elapsed / 1e6)
    return {
        name: {"wall_ms": summarize(wall[name]), "host_ms": summarize(host[name])}
        for name in methods
    }
