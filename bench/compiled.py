"""torch.compile in a child process of bench/run.py, two ways: mode="reduce-overhead" (the
baseline), and GraphedForward over torch.compile(dynamic=False) in the default mode (graphed over
a compiled module: inductor's kernels, graphed's replay).

It has a process of its own for three reasons: a compile can take long or hang, and only a child
can be stopped at a deadline (the big DiT is skipped when its compile passes 60 s); inductor's
CUDA-graph trees keep their own memory pool and worker processes, which must not disturb the
memory and host-cost figures of the other methods; and a crash in the compiler loses only this
baseline. The child builds the same workloads with the same seeds (host_cost.FirstPlusOne,
dit_request.build_model/request_inputs) and times them with the same functions (timing.py).
Each result says its method ("compile" or "graphed_compile") and its first-call time: for
reduce-overhead the calls until its graph is recorded, for graphed the one call that compiles and
captures.

Protocol, one line each on the child's stdout: `GRAPHED_BENCH BEGIN <phase> <deadline_s>`,
`GRAPHED_BENCH RESULT <json>`, `GRAPHED_BENCH END <phase>`. The parent kills the child when a
phase outlives its deadline or the whole child outlives its budget.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_TAG = "GRAPHED_BENCH"
_DEFAULT_PHASE_DEADLINE_S = 150.0
BIG_COMPILE_DEADLINE_S = 60.0

# The methods the child measures, and how the report names them.
COMPILED_METHODS = {
    "compile": "torch.compile reduce-overhead",
    "graphed_compile": "GraphedForward over torch.compile (default, dynamic=False)",
}

__all__ = ["BIG_COMPILE_DEADLINE_S", "COMPILED_METHODS", "run_compiled"]


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
    bench_dir = Path(__file__).resolve().parent
    # The child imports graphed as this process does (installed, or through the inherited
    # PYTHONPATH); only bench/ is added, for the shared model.
    paths = [str(bench_dir), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(p for p in paths if p))
    command = [sys.executable, str(bench_dir / "compiled.py"), "--child", json.dumps(settings)]
    started = time.monotonic()
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: stopping it stops its compile workers
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for raw in child.stdout:
            lines.put(raw.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    tail: list[str] = []
    phase, phase_started, phase_deadline = None, 0.0, 0.0
    killed_for = None
    exited_at = 0.0
    while True:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            line = ""
        if line is None:
            break
        now = time.monotonic()
        if line.startswith(_TAG + " "):
            words = line.split(" ", 3)
            if words[1] == "BEGIN":
                phase, phase_started = words[2], now
                phase_deadline = float(words[3]) if len(words) > 3 else 0.0
                phase_deadline = phase_deadline or _DEFAULT_PHASE_DEADLINE_S
                log(f"  torch.compile: {phase} ...")
            elif words[1] == "END":
                phase = None
            elif words[1] == "RESULT":
                try:
                    result = json.loads(line.split(" ", 2)[2])
                except (IndexError, ValueError):
                    log(f"  torch.compile: unreadable result line: {line[:200]}")
                else:
                    _take_result(results, result, log)
        elif line:
            tail = (tail + [line])[-15:]
        if killed_for is None and phase is not None and now - phase_started > phase_deadline:
            killed_for = (phase, f"it took longer than {phase_deadline:.0f} s, so it was stopped")
        elif killed_for is None and now - started > budget_s:
            killed_for = (phase or "torch.compile", f"the child passed its {budget_s:.0f} s budget")
        if killed_for is not None and child.poll() is None:
            _stop(child)
        # A worker the child left behind may hold the pipe open: stop reading soon after it exits.
        if child.poll() is not None:
            exited_at = exited_at or now
            if now - exited_at > 5:
                break
    child.wait()
    _stop(child)  # compile workers it may have left behind
    if killed_for is not None:
        what, why = killed_for
        results["skipped"].append(
            {"what": f"{_describe(what)} (and any later torch.compile phase)", "why": why}
        )
        log(f"  torch.compile: stopped: {why}")
    elif child.returncode != 0:
        last = tail[-1] if tail else "no output"
        why = f"the torch.compile child exited with status {child.returncode} ({last})"
        results["skipped"].append({"what": "torch.compile phases it had not reported", "why": why})
        log(f"  {why}; last lines:\n    " + "\n    ".join(tail))
    results["child_tail"] = tail
    results["seconds"] = time.monotonic() - started
    return results


def _stop(child: subprocess.Popen) -> None:
    """Kills the child's process group (the child and the workers it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)


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


def _say(*words: Any) -> None:
    print(_TAG, *words, flush=True)


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
    from host_cost import FirstPlusOne
    from timing import host_cost_interleaved, throughput_us

    for k in settings["ks"]:
        _say("BEGIN", f"host-{method}-k{k}", 0)
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
        _say("RESULT", json.dumps(result))
        _say("END", f"host-{method}-k{k}")


def _child_dit(method: str, size: str, settings: dict, clock: Any, deadline_s: float) -> None:
    import torch
    from dit_request import build_model, dit_config, rel_err, request_inputs
    from timing import wall_ms_interleaved

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
            _say("BEGIN", f"dit-{method}-{size}", deadline_s)
            start = time.perf_counter()
            for index in range(first_calls):
                runnable(**calls[index])
            torch.cuda.synchronize()
            result["compile_s"] = time.perf_counter() - start
            _say("END", f"dit-{method}-{size}")
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
    _say("RESULT", json.dumps(result))


def _exit_with_parent() -> None:
    """Ends this child if bench/run.py goes away (it runs in a session of its own)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _child_main(settings: dict) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _exit_with_parent()
    import torch
    from timing import choose_host_clock

    if not torch.cuda.is_available():
        _say("RESULT", json.dumps({"kind": "skip", "what": "torch.compile", "why": "no CUDA"}))
        return 0
    clock = choose_host_clock()
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
