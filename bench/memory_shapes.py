"""Why this exists: the memory rows of the benchmark (issue 22). How much device memory N resident
shapes of the Stable Audio Open DiT (diffusers' StableAudioDiTModel() default configuration, random
weights, bf16, CFG batch 2) cost each method: GraphedForward, torch.compile reduce-overhead
(CUDAGraph Trees) and the seed wrapper, for 1, 2, 4 and 6 latent lengths, each (method, N) in a
fresh child process so that no cache of one measurement lends memory to the next. A child reports
the growth of torch.cuda.memory_reserved and memory_allocated from before the first call to after
one call of each shape, and the first call's latency (the first request of a server), where the
new memory sits (pool and stream of each new segment), and for graphed what its graph pool
reserves of that. Two last rows put two GraphedForwards of one graphed.MemoryPool beside one
alone, and capture the six shapes with graphed.warm_up before the first call, largest first (where
a graph pool grows by plain segments it reuses the free blocks of the graphs before it only where
they fit, so the order of captures counts; that row's first call is a replay, and warm_up_ms the
captures' time). Rows named *_expandable and *_plain run their child with PYTORCH_ALLOC_CONF set
to expandable_segments:True or :False, as a user may (graphed's pools grow by expandable segments
where the settings are empty, and leave a user's setting alone); with
`--methods graphed_compile`, GraphedForward over torch.compile(dynamic=False) is the row to read
against reduce-overhead's like for like (the same inductor kernels, so the same intermediates).

Runs only on a CUDA device; importing it does nothing. `python bench/memory_shapes.py --out DIR
[--quick]` writes memory_shapes.json, memory_shapes.md and memory_shapes.png to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import plotting
import torch

FRAMES = [64, 108, 216, 432, 864, 1024]
COUNTS = {"full": [1, 2, 4, 6], "quick": [6]}
METHODS = {
    "graphed": "GraphedForward",
    "compile": "torch.compile reduce-overhead",
    "seed": "seed wrapper",
    # torch.cuda.graph as its docs say for many graphs: one pool for all, warm-ups in torch's
    # ordinary pool. The floor for eager kernels in graphs, with nothing of graphed's.
    "seed_shared_pool": "torch.cuda.graph, one shared pool (seed wrapper, share_pool=True)",
    "graphed_pool_pair": "two GraphedForwards on one MemoryPool",
    "graphed_largest_first": "GraphedForward, captured by graphed.warm_up (largest first)",
    # Like for like with CUDAGraph Trees: inductor's kernels, graphed's graphs.
    "graphed_compile": "GraphedForward over torch.compile (dynamic=False)",
    # With the allocator settings as a user may set them (PYTORCH_ALLOC_CONF). graphed's pools
    # grow by expandable segments where the settings are empty; a user's setting wins:
    # expandable_segments:True everywhere (so for CUDAGraph Trees too), False for plain segments
    # (graphed's pools as they grew before).
    "graphed_expandable": "GraphedForward, expandable_segments:True",
    "compile_expandable": "torch.compile reduce-overhead, expandable_segments:True",
    "graphed_plain": "GraphedForward, expandable_segments:False",
}
ALLOC_CONF = {"_expandable": "expandable_segments:True", "_plain": "expandable_segments:False"}
# Rows measured at the most shapes only (and graphed_expandable's largest alone).
MOST_SHAPES_ONLY = (
    "graphed_pool_pair",
    "graphed_largest_first",
    "graphed_compile",
    "graphed_expandable",
    "compile_expandable",
    "graphed_plain",
)
COMPILING = ("compile", "graphed_compile", "compile_expandable")
CHILD_TIMEOUT_S = (
    900  # reduce-overhead compiles each of six shapes of a 1B DiT: over 300 s on an H200
)
TEXT_ROWS = 130  # the prompt rows and the two duration rows
MIB = 2**20


def _model() -> Any:
    from diffusers import StableAudioDiTModel

    torch.manual_seed(0)
    with torch.device("cuda"):  # random init on the device: seconds instead of a minute
        return StableAudioDiTModel().to(torch.bfloat16).eval()


def _inputs(model: Any, frames: int) -> dict:
    """One transformer call's keyword arguments for `frames` latent frames (CFG batch 2)."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    config = model.config
    generator = torch.Generator("cpu").manual_seed(frames)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to("cuda", torch.bfloat16)

    rotary = get_1d_rotary_pos_embed(
        config.attention_head_dim // 2, frames + 1, use_real=True, repeat_interleave_real=False
    )
    return {
        "hidden_states": randn(2, config.in_channels, frames),
        "timestep": torch.full((1,), 0.5, device="cuda"),
        "encoder_hidden_states": randn(2, TEXT_ROWS, config.cross_attention_input_dim),
        "global_hidden_states": randn(2, 1, config.global_states_input_dim),
        "rotary_embedding": tuple(part.to("cuda") for part in rotary),
        "return_dict": False,
    }


def _wrap(method: str, model: Any) -> Any:
    import graphed

    if method == "compile":
        return torch.compile(model, mode="reduce-overhead", dynamic=False)
    if method == "graphed_compile":
        return graphed.GraphedForward(
            torch.compile(model, dynamic=False), device="cuda", max_entries=16, churn_limit=0
        )
    if method in ("seed", "seed_shared_pool"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from seed_wrapper import SeedGraphedForward

        return SeedGraphedForward(
            model, device=torch.device("cuda"), share_pool=method == "seed_shared_pool"
        )
    # churn_limit=0: the shapes are captured in a row, each at first sight, as the peers do.
    return graphed.GraphedForward(model, device="cuda", max_entries=16, churn_limit=0)


def _new_segments(before: set[int]) -> dict[str, list[float]]:
    """Where the memory reserved since `before` (segment addresses) sits: [reserved, in use] MiB
    by the pool that owns it (torch's ordinary pool, or a private one: a graph pool, a scratch
    pool) and the stream it was allocated on (the caller's, or another: a side stream)."""
    caller = torch.cuda.current_stream().cuda_stream
    where: dict[str, list[float]] = {}
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] in before:
            continue
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        place = (
            f"{'ordinary' if pool == (0, 0) else f'private {pool}'} pool, "
            f"{'caller' if segment['stream'] == caller else 'other'} stream"
            f"{', expandable' if segment.get('is_expandable') else ''}"
        )
        held = where.setdefault(place, [0.0, 0.0])
        held[0] += segment["total_size"] / MIB
        held[1] += segment["allocated_size"] / MIB
    return where


def _measure(method: str, count: int) -> dict:
    """In the child: memory growth over `count` shapes and the first call's latency."""
    for suffix in ALLOC_CONF:  # its child runs under that setting
        method = method.removesuffix(suffix)
    model = _model()
    shapes = [_inputs(model, frames) for frames in (FRAMES[:count] if count > 0 else FRAMES[-1:])]
    torch.cuda.synchronize()
    # The model's random initialisation leaves blocks cached in torch's ordinary pool. Given back
    # first, so that every method starts from the same place: torch.cuda.graph (the seed wrapper)
    # and CUDAGraph Trees empty that cache themselves, which a baseline taken over it would count
    # as negative growth (seen on the H200: -1512 MiB for reduce-overhead's six shapes).
    torch.cuda.empty_cache()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    segments_before = {segment["address"] for segment in torch.cuda.memory_snapshot()}
    wrapped = [_wrap(method, model)]
    if method == "graphed_pool_pair":
        import graphed

        pool = graphed.MemoryPool("cuda")
        wrapped = [
            graphed.GraphedForward(model, device="cuda", memory_pool=pool, churn_limit=0),
            graphed.GraphedForward(model, device="cuda", memory_pool=pool, churn_limit=0),
        ]
    first_ms = warm_up_ms = None
    with torch.no_grad():
        if method == "graphed_largest_first":  # captured before the first call, largest first
            import graphed

            started = time.perf_counter()
            graphed.warm_up(wrapped[0], shapes)
            torch.cuda.synchronize()
            warm_up_ms = (time.perf_counter() - started) * 1e3
        for runner in wrapped:
            for kwargs in shapes:
                started = time.perf_counter()
                runner(**kwargs)
                torch.cuda.synchronize()
                if first_ms is None:
                    first_ms = (time.perf_counter() - started) * 1e3
            for kwargs in shapes:  # one more call each, after the captures
                runner(**kwargs)
    torch.cuda.synchronize()
    result = {
        "reserved_mib": (torch.cuda.memory_reserved() - reserved) / MIB,
        "allocated_mib": (torch.cuda.memory_allocated() - allocated) / MIB,
        "first_call_ms": first_ms,
        "new_segments_mib": _new_segments(segments_before),
    }
    if warm_up_ms is not None:
        result["warm_up_ms"] = warm_up_ms
    if method not in ("compile", "seed", "seed_shared_pool"):
        stats = wrapped[0].stats()
        result["pool_mib"] = stats["pool_bytes"] / MIB
        result["graph_pool_reserved_mib"] = stats["pool_reserved_bytes"] / MIB
        result["shared_input_mib"] = stats.get("shared_input_bytes", 0) / MIB
        # whether graphed replays at all (over torch.compile, a failed capture runs eager)
        result["captures"], result["graphs"] = stats["captures"], stats["graphs"]
        result["disabled_reason"] = stats["disabled_reason"]
    return result


def _child(method: str, count: int, deadline: float) -> dict:
    """One measurement in a fresh process, given until `deadline` (time.monotonic()) at most;
    {'error': ...} when it failed or ran out of time."""
    timeout = min(CHILD_TIMEOUT_S, deadline - time.monotonic())
    if timeout <= 0:
        return {"error": ["not run: the run's --deadline-s had passed"]}
    try:
        environment = {
            name: value
            for name, value in os.environ.items()
            if name not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
        }
        for suffix, conf in ALLOC_CONF.items():
            if method.endswith(suffix):
                environment["PYTORCH_ALLOC_CONF"] = conf
        done = subprocess.run(
            [sys.executable, __file__, "--child", method, str(count)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=environment,
        )
    except subprocess.TimeoutExpired:
        return {"error": [f"stopped after {timeout:.0f} s (the run's --deadline-s)"]}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("MEMORY_SHAPES "):
            return json.loads(line.split(" ", 1)[1])
    return {"error": (done.stderr or done.stdout).strip().splitlines()[-3:]}


def run(
    counts: list[int],
    methods: tuple[str, ...],
    jobs: int = 1,
    deadline_s: float = float("inf"),
    on_row: Callable[[dict], None] | None = None,
) -> dict:
    """Every (method, count) row, each in its own child process, printed as it comes.

    With jobs > 1 that many children run at once. Memory is read per process, so the rows keep
    their meaning; first-call times then include the other children's load on the host. The
    compiles of the most shapes run in the first wave and the smaller compile rows after them, so
    these find inductor's cache filled with their shapes.
    """
    rows: dict[str, dict[str, Any]] = {method: {} for method in METHODS}
    plan = [(method, count) for method in methods for count in counts]
    plan = [(m, c) for m, c in plan if m not in MOST_SHAPES_ONLY or c == counts[-1]]
    # The largest shape alone: what "the price of the largest one" is measured against.
    plan[1:1] = [("graphed", -1)] if "graphed" in methods else []
    plan += [(m, -1) for m in ("compile", "graphed_expandable", "graphed_plain") if m in methods]
    # One at a time, the slow compiles last; several at once, first, beside the rest.
    plan.sort(key=lambda row: (row[0] in COMPILING) == (jobs == 1))
    later = [(m, c) for m, c in plan if m == "compile" and c != counts[-1]] if jobs > 1 else []
    waves = [[row for row in plan if row not in later], later]
    results = {
        "frames": FRAMES,
        "counts": counts,
        "labels": METHODS,
        "rows": rows,
        "concurrent_children": jobs,
    }
    deadline = time.monotonic() + deadline_s
    one_at_a_time = threading.Lock()

    def measure(row: tuple[str, int]) -> None:
        method, count = row
        key = LARGEST if count < 0 else str(count)
        measured = _child(method, count, deadline)
        with one_at_a_time:
            rows[method][key] = measured
            print(f"memory_shapes {method} {key}: {json.dumps(measured)}", flush=True)
            if on_row is not None:
                on_row(results)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for wave in waves:
            list(pool.map(measure, wave))
    return results


LARGEST = f"{FRAMES[-1]} alone"
# The bounds: N resident shapes reserve at most reduce-overhead's growth and at most 1.5x
# the largest shape alone; two runners on one pool at most 1.2x one of them alone.
LARGEST_MULTIPLE = 1.5
PAIR_MULTIPLE = 1.2


def verdicts(results: dict) -> list[str]:
    """PASS/MISS lines for the bounds above, from the rows of this run."""
    rows = results["rows"]
    most = str(results["counts"][-1])

    def reserved(method: str, count: str) -> float | None:
        row = rows.get(method, {}).get(count, {})
        return None if "error" in row or not row else row["reserved_mib"]

    graphed, compiled = reserved("graphed", most), reserved("compile", most)
    largest, pair = reserved("graphed", LARGEST), reserved("graphed_pool_pair", most)
    graphed_compiled = reserved("graphed_compile", most)
    torch_graphs = reserved("seed_shared_pool", most)
    largest_first = reserved("graphed_largest_first", most)
    expandable = reserved("graphed_expandable", most)
    compiled_expandable = reserved("compile_expandable", most)
    lines = []
    checks = (
        (f"{most} shapes: graphed <= reduce-overhead", graphed, compiled, 1.0),
        (f"{most} shapes: graphed over compile <= reduce-overhead", graphed_compiled, compiled,
         1.0),
        (f"{most} shapes, largest first (graphed.warm_up's order): graphed <= reduce-overhead",
         largest_first, compiled, 1.0),
        (f"{most} shapes: graphed <= torch.cuda.graph on one shared pool", graphed, torch_graphs,
         1.0),
        (f"{most} shapes: graphed <= {LARGEST_MULTIPLE}x the largest alone", graphed, largest,
         LARGEST_MULTIPLE),
        (f"two runners on one pool <= {PAIR_MULTIPLE}x one alone ({most} shapes)", pair, graphed,
         PAIR_MULTIPLE),
        (f"{most} shapes, both with expandable segments: graphed <= reduce-overhead", expandable,
         compiled_expandable, 1.0),
        (f"{most} shapes: graphed with expandable segments <= reduce-overhead without", expandable,
         compiled, 1.0),
    )  # fmt: skip
    for text, value, reference, multiple in checks:
        if value is None or reference is None:
            lines.append(f"N/A  {text}: not measured")
            continue
        status = "PASS" if value <= multiple * reference + 1e-9 else "MISS"
        lines.append(f"{status} {text}: {value:.1f} MiB vs {multiple:g} x {reference:.1f} MiB")
    return lines


def table(results: dict) -> list[str]:
    """Markdown: reserved / allocated growth (MiB) and first-call ms per method and shape count."""
    lines = [
        "| method | shapes | reserved growth (MiB) | of it, the graph pool (MiB) "
        "| allocated growth (MiB) | first call (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for method, label in results["labels"].items():
        measured = results["rows"][method]
        for count in sorted(measured, key=lambda key: int(key) if key.isdigit() else 1 << 30):
            row = measured[count]
            if "error" in row:
                lines.append(f"| {label} | {count} | failed: {' '.join(row['error'])} | | | |")
                continue
            pool = row.get("graph_pool_reserved_mib")
            lines.append(
                f"| {label} | {count} | {row['reserved_mib']:.1f} "
                f"| {'' if pool is None or pool < 0 else f'{pool:.1f}'} "
                f"| {row['allocated_mib']:.1f} | {row['first_call_ms']:.0f} |"
            )
    return lines


def plot(results: dict, out_dir: Path) -> tuple[Path | None, str]:
    """Reserved growth against resident shapes, a line per method; (path, '') or (None, why)."""
    plt, why = plotting.pyplot()
    if plt is None:
        return None, why
    figure, axes = plt.subplots(figsize=(8, 5))
    for method, label in results["labels"].items():
        points = sorted(
            (int(count), row["reserved_mib"])
            for count, row in results["rows"][method].items()
            if "error" not in row and count.isdigit()  # not the "1024 alone" row
        )
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", label=label)
    axes.set_xlabel("resident shapes (latent lengths 64 ... 1024)")
    axes.set_ylabel("memory_reserved growth (MiB)")
    axes.set_title("Stable Audio Open DiT, bf16, CFG batch 2: memory of resident graphs")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return plotting.save(plt, figure, out_dir / "memory_shapes.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="memory of resident shapes (see its doc)")
    parser.add_argument("--out", type=Path, help="folder for the results")
    parser.add_argument("--quick", action="store_true", help="six shapes only, no seed wrapper")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        help="only these methods' rows (default: all; --quick leaves the seed wrapper out)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="children at once (memory stays per process; first-call times then share the host)",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=float("inf"),
        help="stop children still running this many seconds after the start; rows say so",
    )
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("memory_shapes: needs a CUDA device; nothing measured", flush=True)
        return 0
    if args.child:
        result = _measure(args.child[0], int(args.child[1]))
        print("MEMORY_SHAPES " + json.dumps(result), flush=True)
        return 0
    if args.out is None:
        parser.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    # quick: the six shapes only, the seed wrapper and graphed over compile left out (each child
    # loads a 1B-parameter DiT; each compile of it takes about 30 s); --methods names them
    methods = tuple(
        m
        for m in (args.methods or METHODS)
        if args.methods or not (args.quick and m in ("seed", "graphed_compile"))
    )
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    def write(results: dict) -> None:  # after every row, so a run stopped midway keeps its rows
        (args.out / "memory_shapes.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "memory_shapes.md").write_text("\n".join(table(results)) + "\n")

    results = run(
        COUNTS["quick" if args.quick else "full"], methods, args.jobs, args.deadline_s, write
    )
    write(results)
    path, why = plot(results, args.out)
    print("\n".join(table(results)))
    print("\n".join(verdicts(results)))
    print(f"plot: {path}" if path else f"no plot: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
