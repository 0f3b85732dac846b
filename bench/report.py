"""Turns one benchmark run's results (DIR/results.json, written by bench/run.py) into what a person
reads: DIR/benchmarks.md (the machine, the targets with PASS/MISS, and every table) and
DIR/benchmarks.png (host cost per call against the number of input tensors K, one line per
method, log scale). Run it alone to redo both from a results.json:
`python bench/report.py DIR`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import plotting

__all__ = ["write_plot", "write_report"]

_MIB = 2**20

# What the first-call times of the torch.compile methods cover (see compiled.py).
FIRST_CALLS = {
    "compile": "compile, CUDA-graph warm-up, recording",
    "graphed_compile": "one call: compile, probe, warm-up and capture; compiled after "
    "reduce-overhead in the same process, so with inductor's caches warm",
}


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return lines + [""]


def _machine(results: dict) -> list[str]:
    meta = results["meta"]
    clock = meta.get("clock", {})
    rows = [
        ["device", meta.get("device_name", "-")],
        ["driver", meta.get("driver", "-")],
        ["torch", f"{meta.get('torch')} (CUDA {meta.get('torch_cuda') or '-'})"],
        ["python", meta.get("python", "-")],
        ["date", meta.get("date", "-")],
        ["host", f"{meta.get('hostname', '-')}, {meta.get('cpu_count', '-')} CPUs"],
        ["graphed backend", meta.get("graphed_backend", "-")],
        ["pass", "quick (--quick)" if meta.get("quick") else "full"],
        [
            "host clock",
            f"{clock.get('name', '-')} (step {clock.get('step_ns', '-')} ns, two reads "
            f"{clock.get('overhead_ns', '-')} ns, subtracted): {clock.get('note', '')}",
        ],
        ["duration", f"{meta.get('duration_s', 0):.0f} s"],
        ["command", f"`{meta.get('command', '')}`"],
    ]
    return ["## Machine", "", *_table(["", ""], rows)]


def _targets(results: dict) -> list[str]:
    rows = [[t["target"], t["measured"], f"**{t['status']}**"] for t in results.get("targets", [])]
    return ["## Targets", "", *_table(["target", "measured (this run)", "status"], rows)]


def _host_cost(results: dict) -> list[str]:
    host = results.get("host_cost")
    if not host or not host.get("methods"):
        return []
    ks = host["K"]
    methods = host["methods"]
    bare = methods.get("bare", {}).get("burst", {})
    lines = [
        "## Host cost per call",
        "",
        f"Forward: `xs[0] + 1` on an 8-element tensor, K input tensors. Median over "
        f"{host['bursts']} bursts of {host['burst_len']} calls (after {host['warmup_bursts']} "
        "warm-up bursts), bursts of all methods interleaved, device synchronized outside each "
        f"burst; microseconds of host time per call, read with "
        f"{results['meta'].get('clock', {}).get('name', '-')} (see Machine).",
        "",
    ]
    header = ["method", *(f"K={k}" for k in ks)]
    rows, ratio_rows, rate_rows = [], [], []
    for entry in methods.values():
        burst, rates, errors = entry["burst"], entry["throughput_us"], entry.get("error", {})
        cells, ratios, rate_cells = [], [], []
        for k in ks:
            key = str(k)
            if key in burst:
                cells.append(_fmt(burst[key]["median"]))
                base = bare.get(key, {}).get("median")
                ratios.append(f"{burst[key]['median'] / base:.2f}x" if base else "-")
                rate_cells.append(_fmt(rates.get(key)))
            else:
                why = errors.get(key)
                if why is None:
                    cells.append("-")
                else:
                    plain = why.startswith(("failed", "not measured", "WRONG"))
                    cells.append((why if plain else f"failed ({why})")[:90])
                ratios.append("-")
                rate_cells.append("-")
        rows.append([entry["label"], *cells])
        ratio_rows.append([entry["label"], *ratios])
        rate_rows.append([entry["label"], *rate_cells])
    lines += _table(header, rows)
    if bare:
        lines += ["Host cost as a multiple of the bare replay's, same run:", ""]
        lines += _table(header, ratio_rows)
    lines += [
        f"Throughput: wall-clock microseconds per call over {host['throughput_calls']} "
        "back-to-back calls with one synchronize at the end (the device's pace once the host "
        "outruns it):",
        "",
    ]
    lines += _table(header, rate_rows)
    for name, what in FIRST_CALLS.items():
        compile_times = methods.get(name, {}).get("compile_s", {})
        if compile_times:
            spent = ", ".join(f"K={k}: {seconds:.1f} s" for k, seconds in compile_times.items())
            lines += [f"{methods[name]['label']}, first calls ({what}): {spent}.", ""]
    return lines


def _launches(results: dict) -> list[str]:
    launches = results.get("launches")
    if not launches:
        return []
    rows = []
    for method, per_k in launches.items():
        for k, counted in per_k.items():
            names = ", ".join(f"{name} {count:g}" for name, count in counted["launches"].items())
            rows.append(
                [
                    method,
                    k,
                    f"{counted['launches_per_call']:g}",
                    f"{counted['graph_launches_per_call']:g}",
                    f"{counted['device_activities_per_call']:g}",
                    names or "-",
                ]
            )
    header = ["method", "K", "launches/call", "graph launches/call", "device activities/call"]
    return [
        "## Device launches per call",
        "",
        "torch.profiler (CPU and CUDA activity) over 8 calls after warm-up: runtime/driver API "
        "calls that enqueue work (`*Launch*`, `cudaMemcpy*`, `cudaMemset*`), and the kernels and "
        "copies the device ran.",
        "",
        *_table([*header, "launch calls per call"], rows),
    ]


def _dit(results: dict) -> list[str]:
    dit = results.get("dit")
    if not dit:
        return []
    lines = ["## DiT request: nine forwards, fresh x and timestep each", ""]
    for size, entry in dit.items():
        cfg = entry["config"]
        lines += [
            f"### {size}: {cfg['blocks']} blocks, width {cfg['dim']}, {cfg['heads']} heads, "
            f"{cfg['batch']}x{cfg['rows']} rows, {cfg['dtype']}",
            "",
            f"Median over {entry['rounds']} rounds (after {entry['warmup_rounds']} warm-up "
            "rounds), every method once per round in turn; a request is "
            f"{entry['forwards_per_request']} forwards, timed between two synchronizes; host "
            "ms/request is the host clock's time for the calls alone, before the final "
            "synchronize.",
            "",
        ]
        methods = entry["methods"]
        bare = methods.get("bare", {}).get("forward_ms")
        errors = entry.get("rel_err_vs_eager", {})
        rows = []
        for name, method in methods.items():
            ratio = f"{method['forward_ms'] / bare:.4f}" if bare else "-"
            rows.append(
                [
                    method["label"],
                    _fmt(method["forward_ms"], 3),
                    _fmt(method["request_ms"], 2),
                    f"{_fmt(method.get('request_ms_p10'))}-{_fmt(method.get('request_ms_p90'))}",
                    _fmt(method.get("host_ms_per_request"), 3),
                    ratio,
                    f"{errors[name]:.1e}" if name in errors else "-",
                ]
            )
        for name, why in entry.get("unavailable", {}).items():
            rows.append([name, why, "", "", "", "", ""])
        header = [
            "method",
            "ms/forward",
            "ms/request",
            "p10-p90 ms/request",
            "host ms/request",
            "x bare",
            "rel. err vs eager",
        ]
        lines += _table(header, rows)
        for name, seconds in entry.get("first_call_s", {}).items():
            label = methods[name]["label"] if name in methods else name
            lines += [f"{label}, first calls ({FIRST_CALLS[name]}): {seconds:.1f} s.", ""]
    return lines


def _capture(results: dict) -> list[str]:
    lines = []
    first = results.get("first_call")
    if first:
        rows = []
        for size, entry in first.items():
            for name, method in entry["methods"].items():
                every = ", ".join(f"{value:.1f}" for value in method["first_call_ms_all"])
                rows.append(
                    [size, name, _fmt(method["first_call_ms"], 1), every, _fmt(method["create_ms"])]
                )
        repeats = next(iter(first.values()))["repeats"]
        lines += [
            "## First-call latency (capture)",
            "",
            "A fresh instance's first call (probe, warm-up, capture, then the seed's first replay; "
            "graphed answers it from its last warm-up where it can), wall clock to a synchronize; "
            f"median of {repeats} fresh instances, graphed and seed alternating (and which goes "
            "first), after one untimed instance of each. warmup_iters=2 for both.",
            "",
            *_table(["DiT", "method", "first call ms", "each ms", "create ms"], rows),
        ]
    memory = results.get("memory")
    if memory:
        rows = []
        for name, entry in memory["methods"].items():
            stats = entry.get("stats", {})
            rows.append(
                [
                    name,
                    _fmt(entry["allocated_bytes"] / _MIB, 1),
                    _fmt(entry["peak_allocated_bytes"] / _MIB, 1),
                    _fmt(entry["reserved_bytes"] / _MIB, 1),
                    str(stats.get("graphs", "-")),
                    _fmt(entry["left_after_release_bytes"] / _MIB, 1),
                ]
            )
        header = ["method", "allocated MiB", "peak MiB", "reserved MiB", "graphs", "left MiB"]
        lines += [
            "## Device memory: 16 resident graphs",
            "",
            f"The {memory['size']} DiT captured at 16 row counts ({memory['rows'][0]} to "
            f"{memory['rows'][-1]}), max_entries=16, inputs allocated beforehand; deltas of "
            "torch.cuda.memory_allocated, max_memory_allocated (after reset_peak_memory_stats) "
            "and memory_reserved; 'left' is what stayed allocated after the wrapper was deleted. "
            "seed_shared_pool is the seed wrapper with one pool for all its graphs (information "
            "only; the target compares with the plain seed wrapper).",
            "",
            *_table(header, rows),
        ]
    return lines


def _skipped(results: dict) -> list[str]:
    skipped = results.get("skipped", [])
    errors = results.get("errors", [])
    if not skipped and not errors:
        return []
    lines = ["## Skipped or failed", ""]
    lines += [f"- skipped: {item['what']}: {item['why']}" for item in skipped]
    lines += [f"- FAILED: {item['what']}: {item['why']}" for item in errors]
    return lines + [""]


def _notes() -> list[str]:
    return [
        "## Method",
        "",
        "- One command runs everything (`bench/run.py`); warm-ups are excluded, every figure is "
        "a median, every ratio uses figures of this run.",
        "- Seed wrapper (`bench/seed_wrapper.py`): Python signature of the kwargs, one `copy_` "
        "per tensor into static buffers, torch.cuda.graph capture after a side-stream warm-up, "
        "replay, Python clones of the outputs.",
        "- Bare replay: a graph captured by hand with torch.cuda.graph on static inputs, "
        "replayed with `g.replay()` and nothing else (no input copies, no output clones).",
        "- Empty torch.ops call: `torch.ops.graphed_bench.passthrough(Tensor[] xs) -> Tensor`, "
        "whose (Python) kernel returns an empty tensor made once.",
        "- torch.ops.graphed.forward row: the op called directly with the kwargs flattened once "
        "outside the timed region and a fixed key. Python-path row: GraphedForward called with a "
        "tuple variant, which its C entry point does not take, so every call runs "
        "graphed.flatten_kwargs and the op. keep_alive=(t,) row: the path it took is in "
        "brackets (keep_alive now goes through the C entry point).",
        "- torch.compile runs in a child process (own memory pool and compile workers); its "
        "outputs are CUDA-graph-tree static outputs (no clone), and it prunes inputs the "
        "compiled graph does not read, so at K>1 it copies fewer tensors than the wrappers.",
        "",
    ]


def write_report(results: dict[str, Any], out_dir: Path) -> Path:
    meta = results["meta"]
    plotted = not any(item["what"] == "benchmarks.png" for item in results.get("skipped", []))
    lines = [
        "# graphed benchmarks",
        "",
        f"{meta.get('device_name', '-')}, {meta.get('date', '-')}; raw numbers in results.json"
        + (", host cost plotted in benchmarks.png." if plotted else "."),
        "",
        *_machine(results),
        *_targets(results),
        *_host_cost(results),
        *_launches(results),
        *_dit(results),
        *_capture(results),
        *_skipped(results),
        *_notes(),
    ]
    path = out_dir / "benchmarks.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def _minor_label(value: float, _position: int) -> str:
    """Labels the 2x and 5x minor ticks of a log axis, in plain numbers."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
    return f"{value:g}" if mantissa in (2, 5) else ""


def write_plot(results: dict[str, Any], out_dir: Path) -> tuple[Path | None, str]:
    """The host-cost plot; returns (path, '') or (None, why it was not drawn)."""
    host = results.get("host_cost")
    if not host or not host.get("methods"):
        return None, "no host-cost figures in this run"
    plt, why = plotting.pyplot()
    if plt is None:
        return None, why
    import matplotlib.ticker

    figure, axes = plt.subplots(figsize=(12, 5.5))
    markers = "os^vD<>px*h"
    for index, entry in enumerate(host["methods"].values()):
        points = [
            (k, entry["burst"][str(k)]["median"]) for k in host["K"] if str(k) in entry["burst"]
        ]
        if not points:
            continue
        ks, values = zip(*points, strict=True)
        axes.plot(ks, values, marker=markers[index % len(markers)], label=entry["label"])
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    axes.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_minor_label))
    axes.set_xticks(host["K"])
    axes.set_xticklabels([str(k) for k in host["K"]])
    axes.set_xlabel("K (input tensors per call)")
    axes.set_ylabel("host cost, us per call (median of bursts)")
    meta = results["meta"]
    axes.set_title(f"Host cost per call, {meta.get('device_name', '-')}, torch {meta.get('torch')}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return plotting.save(plt, figure, out_dir / "benchmarks.png")


def main() -> int:
    parser = argparse.ArgumentParser(description="Redo benchmarks.md and .png from results.json")
    parser.add_argument("out", type=Path, help="the folder holding results.json")
    out = parser.parse_args().out
    results = json.loads((out / "results.json").read_text())
    path, why = write_plot(results, out)
    skipped = [item for item in results.get("skipped", []) if item["what"] != "benchmarks.png"]
    if path is None:
        skipped.append({"what": "benchmarks.png", "why": why})
    results["skipped"] = skipped
    print(path or f"no plot: {why}")
    print(write_report(results, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
