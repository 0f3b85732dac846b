"""The host-cost measurement: what each way of calling a captured forward costs the CPU, as a
function of the number K of input tensors, with the device never the bottleneck.

The forward (workloads.FirstPlusOne) launches one tiny kernel whatever K is (`xs[0] + 1` on an
8-element tensor; the other K-1 tensors are inputs too, so wrappers must key and copy them), so any
growth with K is the caller's own work. Each method is one zero-argument callable (a
functools.partial or a bound method, so no Python frame is added around the call), built per K,
checked, timed by timing.host_cost_interleaved and timing.throughput_us, and collected under its
key in methods.HOST_COST_METHODS. torch.compile is measured in its own process (compiled.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import graphed
import torch
from baselines import capture_bare, passthrough_op
from methods import HOST_COST_METHODS
from seed_wrapper import SeedGraphedForward
from timing import HostClock, host_cost_interleaved, throughput_us
from workloads import (
    Alternating,
    FirstPlusOne,
    FirstPlusOneReadingExternals,
    WeightedFirstPlusOne,
    with_lora_adapters,
)

__all__ = ["run_host_cost"]

# A tuple variant is no leaf type GraphedForward's C entry point takes, so calls that pass it go
# through the Python path: graphed.flatten_kwargs, then torch.ops.graphed.forward. (keep_alive
# no longer does that: it goes through the C entry point too.)
PYTHON_PATH_VARIANT = ("python-path",)


def _first(result: Any) -> torch.Tensor:
    return result[0] if isinstance(result, (list, tuple)) else result


def _with_xs(runner: Any, xs: list) -> Callable[[], Any] | None:
    return None if runner is None else functools.partial(runner, xs=xs)


def _build_gpu_methods(k: int, device: torch.device) -> tuple[dict, dict, dict]:
    """The callables for one K, plus what is needed to check them and read their stats."""
    module = FirstPlusOne()
    xs = [torch.randn(8, device=device) for _ in range(k)]
    expected = xs[0] + 1
    bare = capture_bare(module, {"xs": xs})
    fast = graphed.GraphedForward(module, device=device, name=f"host-k{k}")
    via_op = graphed.GraphedForward(module, device=device, name=f"host-k{k}-op")
    held = torch.zeros(1, device=device)
    notes, problems = {}, {}
    # Which path keep_alive takes: the C entry point keys it like a plain call (same entry), the
    # Python path under a key of its own (a second capture).
    for _ in range(2):
        fast(xs=xs)
    captures = fast.stats()["captures"]
    try:
        for _ in range(2):
            fast(xs=xs, keep_alive=(held,))
        same_entry = fast.stats()["captures"] == captures
        notes["graphed_keep_alive"] = "C fast path" if same_entry else "Python path"
    except Exception as error:  # reported; the other methods still run
        problems["graphed_keep_alive"] = f"failed: {type(error).__name__}: {_first_line(error)}"
    # The op path: flatten once here, outside the timed region. The first calls go through
    # GraphedForward's Python path, which registers the call with the module's forward operator
    # and captures the graph under exactly this key; entry_replays confirms the entry exists.
    tensors, key, _ = graphed.flatten_kwargs({"xs": xs}, PYTHON_PATH_VARIANT)
    why = "a tuple variant no longer forces the Python path: no entry under its key"
    try:
        for _ in range(2):
            via_op(xs=xs, variant=PYTHON_PATH_VARIANT)
        python_path = torch.ops.graphed.entry_replays(via_op.runner_id, key, tensors) >= 0
    except Exception as error:  # reported; the other methods still run
        python_path = False
        why = f"failed: {type(error).__name__}: {_first_line(error)}"
    # The watch of what graphs bake in (graphed._baked) over a DiT's 300 parameters, and a
    # positional call bound to the forward's parameter names, on one runner: each row's
    # difference from "graphed" (no parameters, a keyword call) is what it costs.
    weighted = graphed.GraphedForward(
        WeightedFirstPlusOne().to(device), device=device, name=f"host-k{k}-weights"
    )
    # cpu_inputs="to_device" with one CPU input (one the forward does not read, so the row's
    # output is the others'): its difference from "graphed" is what staging costs.
    staging = graphed.GraphedForward(
        module, device=device, name=f"host-k{k}-cpu", cpu_inputs="to_device"
    )
    xs_one_on_cpu = [*xs[:-1], xs[-1].cpu()] if k > 1 else xs
    # Four tensors read from a plain object: each capture's externals, checked before each
    # replay (two loads each) where the build has the check; the difference from "graphed" is
    # that check plus four more kernels in the graph, which an older build times alike.
    externals = graphed.GraphedForward(
        FirstPlusOneReadingExternals(device), device=device, name=f"host-k{k}-externals"
    )

    def optional(method: str, make: Callable[[], Any]) -> Any:
        """A runner only some builds or machines can make (peft absent, an older graphed
        timed by device_check.sh compare): None, and the reason under `method`."""
        try:
            return make()
        except (ImportError, TypeError) as error:
            problems[method] = f"not measured: {type(error).__name__}: {_first_line(error)}"
            return None

    # The same DiT tree with LoRA adapters on its 96 attention projections (peft): its
    # difference from "graphed_weights" is what watching the adapters' state costs.
    with_lora = optional("graphed_lora", lambda: graphed.GraphedForward(
        with_lora_adapters(WeightedFirstPlusOne()).to(device), device=device,
        name=f"host-k{k}-lora"))  # fmt: skip
    # Verification sampled in serving (graphed._verify): a runner whose calls are almost never
    # sampled, for what an unsampled call costs over "graphed", and one whose every call is, for
    # what a sampled call costs (one eager forward and the comparison).
    sampling = optional("graphed_verify_unsampled", lambda: graphed.GraphedForward(
        module, device=device, name=f"host-k{k}-sampling", verify_every=1 << 40))  # fmt: skip
    each_sampled = optional("graphed_verify_sampled", lambda: graphed.GraphedForward(
        module, device=device, name=f"host-k{k}-sampled", verify_every=1))  # fmt: skip
    seed = SeedGraphedForward(module, device=device, max_entries=16, warmup_iters=2)
    passthrough = passthrough_op()
    methods: dict[str, Callable[[], Any]] = {
        "bare": bare.replay,
        "graphed": functools.partial(fast, xs=xs),
        "graphed_changing": Alternating(fast, xs, [x.clone() for x in xs]).__call__,
        "graphed_static": functools.partial(fast, xs=xs, static_outputs=True),
        "graphed_keep_alive": functools.partial(fast, xs=xs, keep_alive=(held,)),
        "graphed_weights": functools.partial(weighted, xs=xs),
        "graphed_positional": functools.partial(weighted, xs),
        "graphed_cpu_input": functools.partial(staging, xs=xs_one_on_cpu),
        "graphed_externals": functools.partial(externals, xs=xs),
        # None where `optional` could not make the runner: dropped with the problems below.
        "graphed_lora": _with_xs(with_lora, xs),
        "graphed_verify_unsampled": _with_xs(sampling, xs),
        "graphed_verify_sampled": _with_xs(each_sampled, xs),
        # keep_alive, pin and static_outputs keep their schema defaults, as a caller that needs
        # none of them writes the call: torch converts and checks every argument passed from
        # Python.
        "graphed_op": functools.partial(torch.ops.graphed.forward, via_op.runner_id, key, tensors),
        "graphed_python": functools.partial(via_op, xs=xs, variant=PYTHON_PATH_VARIANT),
        "seed": functools.partial(seed, xs=xs),
        "passthrough": functools.partial(passthrough, tensors),
        "eager": functools.partial(module, xs=xs),
    }
    if python_path:
        notes["graphed_python"] = "Python path"
    else:
        for name in ("graphed_op", "graphed_python"):
            problems[name] = f"not measured: {why}"
    for name in problems:
        del methods[name]
    context = {
        "expected": expected,
        "bare": bare,
        "runners": {"graphed": fast, "op": via_op, "weights": weighted, "cpu_input": staging},
        "notes": notes,
        "problems": problems,
    }
    return methods, context, {"seed": seed}


def _build_cpu_methods(k: int, device: torch.device) -> tuple[dict, dict, dict]:
    module = FirstPlusOne()
    xs = [torch.randn(8, device=device) for _ in range(k)]
    fast = graphed.GraphedForward(module, device=device, name=f"host-k{k}")
    tensors, _, _ = graphed.flatten_kwargs({"xs": xs}, None)
    methods = {
        "graphed": functools.partial(fast, xs=xs),
        "passthrough": functools.partial(passthrough_op(), tensors),
        "eager": functools.partial(module, xs=xs),
    }
    context = {"expected": xs[0] + 1, "runners": {"graphed": fast}, "notes": {}, "problems": {}}
    return methods, context, {}


def _check(methods: dict, context: dict) -> tuple[dict, dict]:
    """Calls each method a few times (its warm-up and capture) and checks its result; returns the
    methods that work and, for each method, 'ok' or what went wrong."""
    expected = context["expected"]
    working, verdicts = {}, dict(context["problems"])
    for name, fn in methods.items():
        try:
            for _ in range(3):
                result = fn()
            if name == "bare":
                result = context["bare"].static_output
            if name == "passthrough":
                verdicts[name] = "ok"
            else:
                got = _first(result)
                same = torch.equal(got.cpu(), expected.cpu())
                verdicts[name] = "ok" if same else "WRONG RESULT"
            working[name] = fn
        except Exception as error:  # reported; the other methods still run
            verdicts[name] = f"failed: {type(error).__name__}: {_first_line(error)}"
    return working, verdicts


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def run_host_cost(
    device: torch.device,
    ks: list[int],
    clock: HostClock,
    *,
    bursts: int,
    burst_len: int,
    warmup_bursts: int,
    throughput_calls: int,
    graphs: bool,
    log: Callable[[str], None] = print,
) -> dict:
    """Host microseconds per call and throughput for every method and K (see
    methods.HOST_COST_METHODS); with graphs=False (no CUDA) only eager, the empty op and
    GraphedForward's eager fallback."""
    sync = torch.cuda.synchronize if graphs else (lambda: None)
    timing = {
        "bursts": bursts,
        "burst_len": burst_len,
        "warmup_bursts": warmup_bursts,
        "throughput_calls": throughput_calls,
    }
    results: dict[str, Any] = {
        "K": ks,
        **timing,
        "methods": {},
        "checks": {},
        "paths": {},
        "stats": {},
    }
    build = _build_gpu_methods if graphs else _build_cpu_methods
    _settle(build, ks[0], device, clock, sync, timing)
    for k in ks:
        _measure(results, build, k, device, clock, sync, timing, log)
    return _in_display_order(results)


def _settle(
    build: Callable, k: int, device: torch.device, clock: HostClock, sync: Callable, timing: dict
) -> None:
    """A settling pass over the first K, discarded: in a full run the first column used to read
    every method, bare replay included, about 2 us slower than the columns after it (the host
    coming out of the device-bound phases before), which inflated that column's bounds too."""
    with torch.no_grad():
        settling, settling_context, _ = build(k, device)
        settling, _ = _check(settling, settling_context)
        sync()
        host_cost_interleaved(
            settling,
            clock,
            sync,
            bursts=max(1, timing["bursts"] // 4),
            burst_len=timing["burst_len"],
            warmup_bursts=timing["warmup_bursts"],
        )


def _measure(results, build, k, device, clock, sync, timing, log) -> None:
    """One K: builds and checks its methods, times them, and records the figures in `results`;
    its graphs are released when it returns, before the next K is built."""
    with torch.no_grad():
        methods, context, keep = build(k, device)
        working, verdicts = _check(methods, context)
        timed, rates = _time(working, clock, sync, timing)
    _collect(results, k, methods, context, keep, verdicts, timed, rates)
    line = "  ".join(f"{name}={timed[name]['median']:.2f}" for name in methods if name in timed)
    log(
        f"  host cost K={k} (us/call, median of {timing['bursts']} bursts of "
        f"{timing['burst_len']}): {line}"
    )
    bad = {name: verdict for name, verdict in verdicts.items() if verdict != "ok"}
    if bad:
        log(f"  K={k} problems: {bad}")


def _time(working: dict, clock: HostClock, sync: Callable, timing: dict) -> tuple[dict, dict]:
    """The timing step: interleaved bursts of every working method, then each one's throughput."""
    sync()
    timed = host_cost_interleaved(
        working,
        clock,
        sync,
        bursts=timing["bursts"],
        burst_len=timing["burst_len"],
        warmup_bursts=timing["warmup_bursts"],
    )
    rates = {
        name: throughput_us(fn, sync, calls=timing["throughput_calls"])
        for name, fn in working.items()
    }
    return timed, rates


def _collect(results, k, methods, context, keep, verdicts, timed, rates) -> None:
    """The collect step of one K: its verdicts, paths, runner stats and per-method figures."""
    results["checks"][str(k)] = verdicts
    results["paths"][str(k)] = context["notes"]
    stats = {name: runner.stats() for name, runner in context["runners"].items()}
    if "seed" in keep:
        stats["seed"] = keep["seed"].stats()
    results["stats"][str(k)] = stats
    for name in [*methods, *context["problems"]]:
        entry = results["methods"].setdefault(
            name,
            {"label": HOST_COST_METHODS[name], "burst": {}, "throughput_us": {}, "error": {}},
        )
        if name in timed:
            entry["burst"][str(k)] = timed[name]
            entry["throughput_us"][str(k)] = rates[name]
        else:
            entry["error"][str(k)] = verdicts[name]


def _in_display_order(results: dict) -> dict:
    """The methods in HOST_COST_METHODS' order, keep_alive's label saying which path it took."""
    keep_alive_path = results["paths"].get(str(results["K"][0]), {}).get("graphed_keep_alive")
    if keep_alive_path and "graphed_keep_alive" in results["methods"]:
        results["methods"]["graphed_keep_alive"]["label"] += f" [{keep_alive_path}]"
    results["methods"] = {
        name: results["methods"][name] for name in HOST_COST_METHODS if name in results["methods"]
    }
    return results
