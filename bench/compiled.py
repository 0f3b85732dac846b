"""torch.compile in a child process of bench/run.py, two ways: mode="reduce-overhead" (the
baseline), and GraphedForward over torch.compile(dynamic=False) in the default mode (graphed over
a compiled module: inductor's kernels, graphed's replay).

It has a process of its own for three reasons: a compile can take long or hang, and only a child
can be stopped at a deadline (the big DiT is skipped when its compile passes 60 s); inductor's
CUDA-graph trees keep their own memory pool and worker processes, which must not disturb the
memory and host-cost figures of the other methods; and a crash in the compiler loses only this
baseline. The child builds the same workloads with the same seeds (workloads.py: FirstPlusOne,
build_model, request_inputs) and times them with the same functions (timing.py). Each result says
its method (a key of methods.COMPILED_METHODS) and its first-call time: for reduce-overhead the
calls until its graph is recorded, for graphed the one call that compiles and captures.

The phases, their deadlines and the result lines follow child.py's protocol; child.supervise runs
the child and stops it when a phase outlives its deadline or the whole child its budget.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import child
from methods import COMPILED_METHODS

BIG_COMPILE_DEADLINE_S = 60.0

__all__ = ["BIG_COMPILE_DEADLINE_S", "run_compiled"]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    head = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {head}"[:300]


# -- parent side ------------------------------------------------------------------------------


def run_compiled(
    settings: dict,
    *,
    budget_s: float,
    log: Any = print,
) -> dict:
    """Runs the child with `settings` (see _child_main) and gathers its results: per method,
    per-K host cost and per-size DiT timings; and what was skipped or failed, with why."""
    results: dict[str, Any] = {"host": {}, "dit": {}, "skipped": []}
    for kind in ("host", "dit"):
        results[kind] = {method: {} for method in COMPILED_METHODS}
    command, env = _child_command(settings)
    outcome = child.supervise(
        command,
        env=env,
        budget_s=budget_s,
        on_result=lambda result: _take_result(results, result, log),
        name="torch.compile",
        log=log,
    )
    _collect(results, outcome, log)
    return results


def _child_command(settings: dict) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of the child: this file, run with `settings`."""
    bench_dir = Path(__file__).resolve().parent
    # The child imports graphed as this process does (installed, or through the inherited
    # PYTHONPATH); only bench/ is added, for the shared model.
    paths = [str(bench_dir), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(p for p in paths if p))
    command = [sys.executable, str(bench_dir / "compiled.py"), "--child", json.dumps(settings)]
    return command, env


def _collect(results: dict, outcome: child.Outcome, log: Any) -> None:
    """Records why the child stopped early, if it did, with its last lines and its duration."""
    if outcome.killed_for is not None:
        what, why = outcome.killed_for
        results["skipped"].append(
            {"what": f"{_describe(what)} (and any later torch.compile phase)", "why": why}
        )
        log(f"  torch.compile: stopped: {why}")
    elif outcome.returncode != 0:
        tail = outcome.tail
        last = tail[-1] if tail else "no output"
        why = f"the torch.compile child exited with status {outcome.returncode} ({last})"
        results["skipped"].append({"what": "torch.compile phases it had not reported", "why": why})
        log(f"  {why}; last lines:\n    " + "\n    ".join(tail))
    results["child_tail"] = outcome.tail
    results["seconds"] = outcome.seconds


def _describe(phase: str) -> str:
    """A phase name as the report says it: host-METHOD-kK or dit-METHOD-SIZE."""
    kind, method, where = phase.split("-", 2) if phase.count("-") >= 2 else ("", "", phase)
    label = COMPILED_METHODS.get(method, method)
    if kind == "host":
        return f"{label}: host cost at K={where.removeprefix('k')}"
    if kind == "dit":
        return f"{label}: the {where} DiT"
    return phase


def _take_result(results: dict, result: dict, log: Any) -> None:
    kind = result.pop("kind")
    if kind == "skip":
        results["skipped"].append({"what": result["what"], "why": result["why"]})
        return
    method = result.pop("method")
    label = COMPILED_METHODS[method]
    if kind == "host":
        results["host"][method][str(result["k"])] = result
        where, figure = f"K={result['k']}", "burst"
    else:
        results["dit"][method][result["size"]] = result
        where, figure = f"DiT {result['size']}", "forward_ms"
    if "error" in result:
        log(f"  {label} {where}: failed: {result['error']}")
    elif figure == "burst":
        log(
            f"  {label} {where}: {result['burst']['median']:.2f} us/call "
            f"(first calls {result['compile_s']:.1f} s)"
        )
    else:
        log(
            f"  {label} {where}: {result['forward_ms']:.3f} ms/forward "
            f"(first calls {result['compile_s']:.1f} s)"
        )


# -- child side -------------------------------------------------------------------------------


def _compiled_callable(method: str, module: Any) -> tuple[Any, int]:
    """The module as `method` runs it, and how many calls it takes to be ready (reduce-overhead:
    compile, CUDA-graph warm-up, recording; graphed: the first call compiles and captures)."""
    import graphed
    import torch

    if method == "compile":
        return torch.compile(module, mode="reduce-overhead"), 3
    compiled = torch.compile(module, dynamic=False)
    return graphed.GraphedForward(compiled, device="cuda", name="over-compile"), 1


def _child_host(method: str, settings: dict, clock: Any) -> None:
    import torch
    from timing import host_cost_interleaved, throughput_us
    from workloads import FirstPlusOne

    for k in settings["ks"]:
        child.say("BEGIN", f"host-{method}-k{k}", 0)
        result: dict[str, Any] = {"kind": "host", "method": method, "k": k}
        try:
            torch._dynamo.reset()
            xs = [torch.randn(8, device="cuda") for _ in range(k)]
            runnable, first_calls = _compiled_callable(method, FirstPlusOne())
            call = functools.partial(runnable, xs=xs)
            with torch.no_grad():
                start = time.perf_counter()
                for _ in range(first_calls):
                    out = call()
                torch.cuda.synchronize()
                result["compile_s"] = time.perf_counter() - start
                for _ in range(3):
                    out = call()
                result["ok"] = bool(torch.equal(out, xs[0] + 1))
                timed = host_cost_interleaved(
                    {method: call},
                    clock,
                    torch.cuda.synchronize,
                    bursts=settings["bursts"],
                    burst_len=settings["burst_len"],
                    warmup_bursts=settings["warmup_bursts"],
                )
                result["burst"] = timed[method]
                result["throughput_us"] = throughput_us(
                    call, torch.cuda.synchronize, calls=settings["throughput_calls"]
                )
        except Exception as error:  # reported as the method's failure
            result["error"] = _first_line(error)
        child.say("RESULT", json.dumps(result))
        child.say("END", f"host-{method}-k{k}")


def _child_dit(method: str, size: str, settings: dict, clock: Any, deadline_s: float) -> None:
    import torch
    from timing import wall_ms_interleaved
    from workloads import build_model, dit_config, rel_err, request_inputs

    result: dict[str, Any] = {"kind": "dit", "method": method, "size": size}
    try:
        torch._dynamo.reset()
        cfg = dit_config(size, torch.device("cuda"), torch.bfloat16)
        model = build_model(cfg)
        calls = request_inputs(cfg)
        with torch.no_grad():
            expected = model(**calls[0])
            runnable, first_calls = _compiled_callable(method, model)
            torch.cuda.synchronize()
            child.say("BEGIN", f"dit-{method}-{size}", deadline_s)
            start = time.perf_counter()
            for index in range(first_calls):
                runnable(**calls[index])
            torch.cuda.synchronize()
            result["compile_s"] = time.perf_counter() - start
            child.say("END", f"dit-{method}-{size}")
            result["rel_err_vs_eager"] = rel_err(runnable(**calls[0]), expected)

            def request() -> None:
                for kwargs in calls:
                    runnable(**kwargs)

            timed = wall_ms_interleaved(
                {method: request},
                torch.cuda.synchronize,
                clock,
                rounds=settings["dit_rounds"][size],
                warmup_rounds=settings["dit_warmup_rounds"],
            )[method]
        result["request_ms"] = timed["wall_ms"]["median"]
        result["forward_ms"] = timed["wall_ms"]["median"] / len(calls)
        result["request_ms_p10"] = timed["wall_ms"]["p10"]
        result["request_ms_p90"] = timed["wall_ms"]["p90"]
        result["host_ms_per_request"] = timed["host_ms"]["median"]
    except Exception as error:  # reported as the method's failure
        result["error"] = _first_line(error)
    child.say("RESULT", json.dumps(result))


def _child_main(settings: dict) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    child.exit_with_parent()
    import torch
    from timing import choose_host_clock

    if not torch.cuda.is_available():
        child.say("RESULT", json.dumps({"kind": "skip", "what": "torch.compile", "why": "no CUDA"}))
        return 0
    clock = choose_host_clock()
    # Loaded before the first phase, so that every phase, reduce-overhead's too, compiles in a
    # process that has graphed's operators registered: the same state for all of them.
    import graphed  # noqa: F401

    for method in COMPILED_METHODS:
        _child_host(method, settings, clock)
    for size in settings["dit_sizes"]:
        for method in COMPILED_METHODS:
            deadline = BIG_COMPILE_DEADLINE_S if size == "big" else 0
            _child_dit(method, size, settings, clock, deadline)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="torch.compile baseline (child of bench/run.py)")
    parser.add_argument("--child", required=True, help="the settings, as JSON")
    sys.exit(_child_main(json.loads(parser.parse_args().child)))
