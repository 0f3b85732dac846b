"""The benchmark of graphed: one command that measures, on whatever machine it runs, everything the
benchmark issue asks for, and writes DIR/results.json, DIR/benchmarks.md and DIR/benchmarks.png.

    PYTHONPATH=python:bench python bench/run.py --out DIR [--quick]

On a CUDA machine: host cost per call against K input tensors for every way of calling a graph
(host_cost.py), a nine-forward DiT request at two sizes (dit_request.py), first-call capture
latency and the memory of 16 resident graphs (capture.py), device launches per replay
(launches.py), and torch.compile in a child process (compiled.py: mode="reduce-overhead", and
GraphedForward over a default-mode compile, each with its first-call time); then
the issue's targets with PASS/MISS (targets.py) and the report (report.py). The full pass takes
about five minutes on an H200, --quick about two. Without CUDA it times what the CPU can (the
small DiT eager, the empty dispatcher call, GraphedForward's eager fallback), says what it skipped
and why, and exits 0. The last lines printed are a compact summary, for runs whose output only
comes back as a tail.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import logging
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import graphed  # noqa: E402
import torch  # noqa: E402
from graphed._doctor import driver_version  # noqa: E402
from methods import COMPILE_LABEL, COMPILED_METHODS, HOST_COST_METHODS  # noqa: E402
from report import write_plot, write_report  # noqa: E402
from targets import evaluate  # noqa: E402
from timing import choose_host_clock  # noqa: E402

SETTINGS = {
    "full": {
        "ks": [4, 16, 32, 64],
        "bursts": 200,
        "burst_len": 16,
        "warmup_bursts": 5,
        "throughput_calls": 2000,
        "dit_rounds": {"small": 30, "big": 12},
        "dit_warmup_rounds": 2,
        # A fresh instance's first call moves by 10 ms from one to the next on the H200's host
        # (12.3 to 23.7 ms for the small DiT in one run): nine, the order alternating, for a
        # steadier median than three gave.
        "first_call_repeats": 9,
        "compile_ks": [4, 32, 64],
        "compile_dit_sizes": ["small", "big"],
        "compile_budget_s": 420,
    },
    "quick": {
        "ks": [4, 16, 32, 64],
        "bursts": 60,
        "burst_len": 16,
        "warmup_bursts": 3,
        "throughput_calls": 500,
        "dit_rounds": {"small": 10, "big": 5},
        "dit_warmup_rounds": 1,
        "first_call_repeats": 9,
        "compile_ks": [4, 64],
        "compile_dit_sizes": ["small"],
        "compile_budget_s": 240,
    },
    "cpu": {
        "ks": [4, 16, 32, 64],
        "bursts": 50,
        "burst_len": 16,
        "warmup_bursts": 2,
        "throughput_calls": 300,
        "dit_rounds": {"small": 3},
        "dit_warmup_rounds": 1,
    },
}


def log(message: str) -> None:
    print(message, flush=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="graphed benchmark (see bench/run.py)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--quick", action="store_true", help="a smaller, faster pass")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    return parser.parse_args()


# -- the machine ------------------------------------------------------------------------------


def _meta(args: argparse.Namespace, on_gpu: bool) -> dict:
    backend, why = graphed.backend()
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "graphed_backend": f"{backend} ({why})",
        "quick": bool(args.quick),
        "command": "PYTHONPATH=python:bench python " + " ".join(sys.argv),
    }
    if on_gpu:
        meta["device_name"] = torch.cuda.get_device_name(0)
        meta["driver"] = driver_version()
        meta["gpu_count"] = torch.cuda.device_count()
    else:
        meta["device_name"] = f"CPU only ({platform.processor() or platform.machine()})"
        meta["driver"] = "- (no CUDA device)"
    return meta


# -- sections ---------------------------------------------------------------------------------


def _section(results: dict, name: str, fn: Callable[[], Any]) -> Any:
    """Runs one part of the benchmark; a failure is recorded and the others still run."""
    log(f"[{name}]")
    started = time.monotonic()
    try:
        value = fn()
    except Exception as error:  # recorded in the report and the exit status
        text = str(error).strip().splitlines()
        why = f"{type(error).__name__}: {text[0] if text else ''}"
        results["errors"].append({"what": name, "why": why})
        log(f"  FAILED: {why}")
        traceback.print_exc(file=sys.stdout)
        value = None
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    log(f"  ({time.monotonic() - started:.1f} s)")
    return value


def _host_cost_section(results, title, device, settings, clock, graphs, log):
    """The host-cost sweep over K with this run's settings, recorded under `title`."""
    from host_cost import run_host_cost

    return _section(
        results,
        title,
        lambda: run_host_cost(
            device,
            settings["ks"],
            clock,
            bursts=settings["bursts"],
            burst_len=settings["burst_len"],
            warmup_bursts=settings["warmup_bursts"],
            throughput_calls=settings["throughput_calls"],
            graphs=graphs,
            log=log,
        ),
    )


def _skip(results: dict, what: str, why: str) -> None:
    results["skipped"].append({"what": what, "why": why})
    log(f"  SKIPPED: {what}: {why}")


def _merge_compiled(results: dict, compiled: dict) -> None:
    """Puts the child's figures (reduce-overhead, and graphed over a default compile) beside the
    other methods."""
    host = results.get("host_cost")
    for method, label in COMPILED_METHODS.items():
        per_k = compiled["host"][method]
        if not host or not per_k:
            continue
        entry = {"label": label, "burst": {}, "throughput_us": {}, "error": {}, "compile_s": {}}
        for k, result in per_k.items():
            if "error" in result:
                entry["error"][k] = result["error"]
                continue
            entry["burst"][k] = result["burst"]
            entry["throughput_us"][k] = result["throughput_us"]
            entry["compile_s"][k] = result["compile_s"]
            if not result.get("ok", True):
                entry["error"][k] = "WRONG RESULT"
        methods = {**host["methods"], method: entry}
        host["methods"] = {name: methods[name] for name in HOST_COST_METHODS if name in methods}
    for size, entry in results.get("dit", {}).items():
        if not entry:
            continue
        for method, label in COMPILED_METHODS.items():
            result = compiled["dit"][method].get(size)
            unavailable = entry.setdefault("unavailable", {})
            if result is None:
                unavailable[label] = "skipped (see Skipped)"
            elif "error" in result:
                unavailable[label] = f"failed: {result['error']}"
            else:
                keys = (
                    "forward_ms",
                    "request_ms",
                    "request_ms_p10",
                    "request_ms_p90",
                    "host_ms_per_request",
                )
                entry["methods"][method] = {"label": label, **{key: result[key] for key in keys}}
                entry["rel_err_vs_eager"][method] = result["rel_err_vs_eager"]
                entry.setdefault("first_call_s", {})[method] = result["compile_s"]
    results["skipped"].extend(compiled["skipped"])
    results["compile_child"] = {
        "seconds": compiled.get("seconds"),
        "last_lines": compiled.get("child_tail"),
    }


def _bench_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _run_gpu(results: dict, settings: dict, clock: Any, args: argparse.Namespace) -> None:
    """Every in-process section, then the replay check of what they timed, then torch.compile's
    child process."""
    device = _bench_device()
    _time_calls(results, settings, clock, device)
    _time_capture(results, settings, device)
    _time_traffic(results, device)
    _check_replays(results)
    _time_compiled(results, settings, args)
    _time_audio_pipeline(results, args)
    _time_generate(results, args)


def _time_calls(results: dict, settings: dict, clock: Any, device: torch.device) -> None:
    """Host cost against K, then the DiT request at each size."""
    from dit_request import run_dit_request

    host = _host_cost_section(results, "host cost vs K", device, settings, clock, True, log)
    if host is not None:
        results["host_cost"] = host
    results["dit"] = {}
    for size in ("big", "small"):
        value = _section(
            results,
            f"DiT request, {size}",
            lambda size=size: run_dit_request(
                size,
                device,
                clock,
                rounds=settings["dit_rounds"][size],
                warmup_rounds=settings["dit_warmup_rounds"],
                graphs=True,
                log=log,
            ),
        )
        if value is not None:
            results["dit"][size] = value


def _time_capture(results: dict, settings: dict, device: torch.device) -> None:
    """First-call latency at each size, the memory of 16 resident graphs, launches per replay
    (last: attaching the profiler can slow later launches)."""
    from capture import run_first_call, run_memory
    from launches import run_launches

    results["first_call"] = {}
    for size in ("small", "big"):
        value = _section(
            results,
            f"first-call latency, {size} DiT",
            lambda size=size: run_first_call(size, device, settings["first_call_repeats"]),
        )
        if value is not None:
            results["first_call"][size] = value
            _log_first_call(value)
    memory = _section(results, "memory of 16 resident graphs", lambda: run_memory(device))
    if memory is not None:
        results["memory"] = memory
        _log_memory(memory)
    launches = _section(results, "launches per replay", lambda: run_launches(device))
    if launches is not None:
        results["launches"] = launches
        _log_launches(launches)


def _time_traffic(results: dict, device: torch.device) -> None:
    """The storms of traffic that varies (churn_bench.py): a float kwarg that changes every call
    and 60 sequence lengths, against eager in the same run, and the memory the second leaves."""
    from churn_bench import run_storms

    storms = _section(results, "traffic that varies (storms)", lambda: run_storms(device))
    if storms is not None:
        results["traffic"] = storms
        log(
            f"  float storm {storms['float_storm']['ratio']:.2f}x eager, shape storm "
            f"{storms['shape_storm']['ratio']:.2f}x eager, reserved after 60 / after 16 "
            f"{storms['shape_storm']['memory_ratio']:.2f}"
        )


def _log_first_call(value: dict) -> None:
    log(
        "  first call ms: "
        + "  ".join(
            f"{name}={method['first_call_ms']:.1f}" for name, method in value["methods"].items()
        )
    )


def _log_memory(memory: dict) -> None:
    log(
        "  allocated/peak MiB: "
        + "  ".join(
            f"{name}={entry['allocated_bytes'] / 2**20:.1f}/"
            f"{entry['peak_allocated_bytes'] / 2**20:.1f}"
            for name, entry in memory["methods"].items()
        )
    )


def _log_launches(launches: dict) -> None:
    for name, per_k in launches.items():
        counts = "  ".join(f"K={k}: {entry['launches_per_call']:g}" for k, entry in per_k.items())
        log(f"  {name} launches/call: {counts}")


def _time_compiled(results: dict, settings: dict, args: argparse.Namespace) -> None:
    """torch.compile's two methods in their child process, merged beside the others."""
    from compiled import run_compiled

    if args.no_compile:
        _skip(results, COMPILE_LABEL, "--no-compile given")
        return
    if "big" not in settings["compile_dit_sizes"]:
        _skip(results, f"{COMPILE_LABEL} of the big DiT", "--quick (its compile alone is ~1 min)")
    child_settings = _compile_settings(settings)
    compiled = _section(
        results,
        f"{COMPILE_LABEL} (child process)",
        lambda: run_compiled(child_settings, budget_s=settings["compile_budget_s"], log=log),
    )
    if compiled is not None:
        _merge_compiled(results, compiled)


def _time_audio_pipeline(results: dict, args: argparse.Namespace) -> None:
    """The Stable Audio Open DiT in its pipeline's loop (audio_pipeline.py): its table and plot
    beside the report, its figures in results.json."""
    from audio_pipeline import FRAMES, ROUNDS, audio_table, run_audio_pipeline, write_audio_plot

    what, size = (
        "Stable Audio Open DiT in StableAudioPipeline's loop",
        "quick" if args.quick else "full",
    )
    if importlib.util.find_spec("diffusers") is None:
        _skip(results, what, "diffusers is not installed")
        return
    audio = _section(
        results,
        what,
        lambda: run_audio_pipeline(
            FRAMES[size],
            rounds=ROUNDS[size],
            with_compile=not args.no_compile,
            log=log,
        ),
    )
    if audio is not None:
        results["audio_pipeline"] = audio
        (args.out / "audio_pipeline.md").write_text("\n".join(audio_table(audio)) + "\n")
        plot, why = write_audio_plot(audio, args.out)
        if plot is None:
            _skip(results, "audio_pipeline.png", why)


def _time_generate(results: dict, args: argparse.Namespace) -> None:
    """transformers' generate() decode rate (generate_bench.py): its table beside the report,
    its figures in results.json."""
    from generate_bench import generate_table, missing_reason, run_generate

    what = "transformers generate(), decode tokens per second"
    why = missing_reason()
    if why is not None:
        _skip(results, what, why)
        return
    for family, key in (("llama", "generate"), ("gemma3", "generate_gemma3")):
        # Gemma 3: the sliding-window family beside Llama's plain static cache.
        value = _section(
            results,
            what if family == "llama" else f"{what}, Gemma 3 (sliding windows)",
            lambda family=family: run_generate(
                _bench_device(),
                quick=args.quick,
                with_compile=not args.no_compile,
                log=log,
                family=family,
            ),
        )
        if value is not None:
            results[key] = value
            (args.out / f"{key}.md").write_text("\n".join(generate_table(value)) + "\n")


def _compile_settings(settings: dict) -> dict:
    """What the child measures (see compiled._child_main), from this run's settings."""
    return {
        "ks": settings["compile_ks"],
        "bursts": settings["bursts"],
        "burst_len": settings["burst_len"],
        "warmup_bursts": settings["warmup_bursts"],
        "throughput_calls": settings["throughput_calls"],
        "dit_sizes": settings["compile_dit_sizes"],
        "dit_rounds": settings["dit_rounds"],
        "dit_warmup_rounds": settings["dit_warmup_rounds"],
    }


def _check_replays(results: dict) -> None:
    """Records an error when a GraphedForward that was timed ran eager instead of replaying: its
    figures would then not be graph figures at all."""
    runners = []
    for k, stats in results.get("host_cost", {}).get("stats", {}).items():
        runners += [
            (f"host cost K={k}, {name}", stats.get(name, {}))
            for name in ("graphed", "op", "weights")
        ]
    for size, entry in results.get("dit", {}).items():
        runners.append((f"DiT {size}", entry["stats"]["graphed"]))
    for what, stats in runners:
        reason = (stats.get("disabled_reason") or "see results.json").strip().splitlines()[0]
        if not stats.get("enabled") or stats.get("eager_calls") or not stats.get("replays"):
            why = (
                f"GraphedForward did not replay graphs only (captures {stats.get('captures')}, "
                f"replays {stats.get('replays')}, eager calls {stats.get('eager_calls')}): "
                f"{reason}"
            )
            results["errors"].append({"what": what, "why": why})
            log(f"  FAILED: {what}: {why}")


def _run_cpu(results: dict, settings: dict, clock: Any) -> None:
    from dit_request import run_dit_request

    device = torch.device("cpu")
    reason = "no CUDA device (torch.cuda.is_available() is False)"
    log(f"No CUDA: {reason}; graphed says: {graphed.backend()[1]}")
    log("Timing on the CPU what can be timed there; GraphedForward runs eager (its fallback).")
    host = _host_cost_section(
        results,
        "host cost vs K (CPU: eager, empty op, GraphedForward fallback)",
        device,
        settings,
        clock,
        False,
        log,
    )
    if host is not None:
        host["methods"]["graphed"]["label"] = "GraphedForward (eager fallback, no graphs)"
        host["methods"]["eager"]["label"] = "eager (one CPU op)"
        results["host_cost"] = host
    small = _section(
        results,
        "DiT request, small (CPU, float32)",
        lambda: run_dit_request(
            "small",
            device,
            clock,
            rounds=settings["dit_rounds"]["small"],
            warmup_rounds=settings["dit_warmup_rounds"],
            graphs=False,
            log=log,
        ),
    )
    if small is not None:
        small["methods"]["graphed"]["label"] = "GraphedForward (eager fallback, no graphs)"
    results["dit"] = {"small": small} if small is not None else {}
    log("[skipped without CUDA]")
    graph_methods = (
        "host cost of bare replay, GraphedForward replay (fast path, static_outputs, op path, "
        "Python path) and the seed wrapper"
    )
    _skip(results, graph_methods, f"they replay CUDA graphs; {reason}")
    _skip(results, "DiT request: seed wrapper, GraphedForward replay, bare replay", reason)
    _skip(
        results,
        "DiT request, big (24 blocks, width 1024, 300 rows)",
        "its targets compare CUDA graph replays; eager on this CPU would take minutes",
    )
    _skip(results, "first-call capture latency and memory of 16 resident graphs", reason)
    _skip(results, "launches per replay (torch.profiler CUDA activity)", reason)
    _skip(results, "traffic that varies: the float and shape storms against eager", reason)
    _skip(results, COMPILE_LABEL, f"reduce-overhead means CUDA graphs; {reason}")
    _skip(results, "Stable Audio Open DiT in StableAudioPipeline's loop", reason)
    _skip(results, "transformers generate(), decode tokens per second", reason)
    _skip(
        results,
        "transformers generate(), decode tokens per second, Gemma 3 (sliding windows)",
        reason,
    )


# -- summary ----------------------------------------------------------------------------------


def _summary(results: dict, out: Path, files: list[str]) -> list[str]:
    meta = results["meta"]
    lines = [
        "=" * 78,
        f"graphed benchmark: {meta['device_name']}, driver {meta['driver']}, torch "
        f"{meta['torch']}, {'quick' if meta['quick'] else 'full'}, {meta['duration_s']:.0f} s",
    ]
    host = results.get("host_cost")
    if host and host.get("methods"):
        ks = host["K"]
        lines.append(f"{'host us/call (median)':<46}" + "".join(f"{'K=' + str(k):>8}" for k in ks))
        for entry in host["methods"].values():
            cells = "".join(
                f"{entry['burst'][str(k)]['median']:>8.2f}"
                if str(k) in entry["burst"]
                else f"{'-':>8}"
                for k in ks
            )
            lines.append(f"{entry['label'][:45]:<46}{cells}")
    for size, entry in (results.get("dit") or {}).items():
        if not entry:
            continue
        parts = "  ".join(
            f"{name} {method['forward_ms']:.3f}" for name, method in entry["methods"].items()
        )
        lines.append(f"DiT {size} ms/forward: {parts}")
    for size, entry in (results.get("first_call") or {}).items():
        parts = "  ".join(
            f"{name} {method['first_call_ms']:.1f}" for name, method in entry["methods"].items()
        )
        lines.append(f"first call {size} DiT ms: {parts}")
    memory = results.get("memory")
    if memory:
        mib = {
            name: (entry["allocated_bytes"] / 2**20, entry["peak_allocated_bytes"] / 2**20)
            for name, entry in memory["methods"].items()
        }
        parts = "  ".join(f"{name} {alloc:.1f}/{peak:.1f}" for name, (alloc, peak) in mib.items())
        lines.append(f"16 graphs alloc/peak MiB: {parts}")
    lines.append("TARGETS")
    for target in results.get("targets", []):
        lines.append(f"  {target['status']:<4} {target['target']}: {target['measured']}")
    for item in results.get("skipped", []):
        lines.append(f"SKIPPED {item['what']}: {item['why']}")
    for item in results.get("errors", []):
        lines.append(f"FAILED {item['what']}: {item['why']}")
    lines.append(f"wrote {', '.join(str(out / name) for name in files)}")
    return lines


def main() -> int:
    args = _parse_args()
    started = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        logging.getLogger("graphed").setLevel(logging.ERROR)  # said once below, with the reason
    results: dict[str, Any] = {"meta": _meta(args, on_gpu), "skipped": [], "errors": []}
    clock = choose_host_clock()
    results["meta"]["clock"] = clock.as_dict()
    log(
        f"graphed benchmark on {results['meta']['device_name']} (torch {torch.__version__}); "
        f"host clock {clock.name}, step {clock.step_ns} ns"
    )
    if on_gpu:
        settings = SETTINGS["quick" if args.quick else "full"]
        _run_gpu(results, settings, clock, args)
    else:
        settings = SETTINGS["cpu"]
        _run_cpu(results, settings, clock)
    results["settings"] = settings
    results["targets"] = evaluate(results)
    results["meta"]["duration_s"] = time.monotonic() - started
    files = ["results.json", "benchmarks.md"]
    plot, why = write_plot(results, out)
    if plot is None:
        _skip(results, "benchmarks.png", why)
    else:
        files.append(plot.name)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    write_report(results, out)
    print("\n".join(_summary(results, out, files)), flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
