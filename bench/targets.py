"""The benchmark issue's targets, checked against the numbers of one run (every ratio uses figures
measured in that same run): each target gets PASS, MISS, or N/A with the reason it could not be
checked (not measured here, for example on a machine without CUDA).
"""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate"]

# (K, the most GraphedForward may cost, as a multiple of a bare replay)
HOST_RATIO_LIMITS = ((4, 2.5), (32, 3.0), (64, 4.0))
OP_BARE_MULTIPLE = 2.0
DIT_LIMITS = {"big": 0.01, "small": 0.10}
# Traffic that varies: a storm's total time against eager's, and the reserved memory after a
# 60-shape churn against after its first 16.
STORM_LIMIT = 1.3
MEMORY_LIMIT = 1.2
_NOT_MEASURED = "not measured in this run (see Skipped or failed)"


def _target(ident: str, text: str, status: str, measured: str) -> dict:
    return {"id": ident, "target": text, "status": status, "measured": measured}


def _host_us(results: dict, method: str, k: int) -> float | None:
    entry = results.get("host_cost", {}).get("methods", {}).get(method, {})
    burst = entry.get("burst", {}).get(str(k))
    return None if burst is None else burst["median"]


def _host_targets(results: dict) -> list[dict]:
    targets = []
    for k, limit in HOST_RATIO_LIMITS:
        text = f"host cost GraphedForward <= {limit:g}x bare replay at K={k}"
        graphed, bare = _host_us(results, "graphed", k), _host_us(results, "bare", k)
        if graphed is None or bare is None or bare <= 0:
            targets.append(_target(f"host_k{k}", text, "N/A", _NOT_MEASURED))
            continue
        ratio = graphed / bare
        status = "PASS" if ratio <= limit else "MISS"
        measured = f"{graphed:.2f} us / {bare:.2f} us = {ratio:.2f}x"
        targets.append(_target(f"host_k{k}", text, status, measured))
    text = f"host cost torch.ops.graphed.forward <= empty op + {OP_BARE_MULTIPLE:g}x bare, every K"
    parts, verdicts = [], []
    for k in results.get("host_cost", {}).get("K", []):
        op = _host_us(results, "graphed_op", k)
        empty = _host_us(results, "passthrough", k)
        bare = _host_us(results, "bare", k)
        if op is None or empty is None or bare is None:
            continue
        bound = empty + OP_BARE_MULTIPLE * bare
        verdicts.append(op <= bound)
        parts.append(f"K={k}: {op:.2f} vs {bound:.2f}")
    if verdicts:
        status = "PASS" if all(verdicts) else "MISS"
        targets.append(_target("op_path", text, status, "; ".join(parts) + " us"))
    else:
        targets.append(_target("op_path", text, "N/A", _NOT_MEASURED))
    return targets


# What the watch of baked-in tensors may add to a call over a DiT's 300 parameters, and what a
# positional call may add at K=32 (microseconds, against rows of the same run).
WATCH_LIMIT_US = 1.0
POSITIONAL_LIMIT_US = 1.0
POSITIONAL_K = 32
# What staging one CPU input (cpu_inputs="to_device") may add to a call: the copy to the device
# itself, and nothing of the failed fast call, exception and Python walk it once cost.
CPU_INPUT_LIMIT_US = 5.0
# What checking four externals before a replay may add (graphed._inventory; Note [A graph's
# externals]): two loads each; the row's graph also holds four more tiny kernels.
EXTERNALS_LIMIT_US = 0.3


# What watching the state of LoRA adapters (peft, rank 16) on a DiT's 96 attention projections
# may add over the same module without them, and what verify_every may add to a call it does not
# sample (microseconds, against rows of the same run).
LORA_LIMIT_US = 1.0
UNSAMPLED_LIMIT_US = 0.2
# A sampled call pays one eager forward and the comparison of the outputs, queued on the device
# and read at a later call (graphed._verify): at most an eager call of the same run plus this
# many microseconds.
SAMPLED_COMPARE_LIMIT_US = 5.0


def _added_target(results: dict, ident: str, text: str, method: str, against: str,
                  limit_us: Any) -> dict:  # fmt: skip
    """`method` - `against` at every K of one run, each at most `limit_us` (a number, or a
    function of K giving one)."""
    parts, verdicts = [], []
    for k in results.get("host_cost", {}).get("K", []):
        added, plain = _host_us(results, method, k), _host_us(results, against, k)
        limit = limit_us(k) if callable(limit_us) else limit_us
        if added is None or plain is None or limit is None:
            continue
        verdicts.append(added - plain <= limit)
        parts.append(f"K={k}: {added:.2f} - {plain:.2f} = {added - plain:+.2f} (<= {limit:.2f})")
    if not verdicts:
        return _target(ident, text, "N/A", _NOT_MEASURED)
    return _target(ident, text, "PASS" if all(verdicts) else "MISS", "; ".join(parts) + " us")


def added_cost_targets(results: dict) -> list[dict]:
    """What the watch, LoRA adapters' state, positional binding, CPU staging and sampled
    verification add to a call, each a difference of two medians of one run."""
    text = f"a positional call adds <= {POSITIONAL_LIMIT_US:g} us at K={POSITIONAL_K}"
    positional = _host_us(results, "graphed_positional", POSITIONAL_K)
    keyword = _host_us(results, "graphed_weights", POSITIONAL_K)
    if positional is None or keyword is None:
        bound = _target("positional", text, "N/A", _NOT_MEASURED)
    else:
        added = positional - keyword
        status = "PASS" if added <= POSITIONAL_LIMIT_US else "MISS"
        bound = _target(
            "positional", text, status, f"{positional:.2f} - {keyword:.2f} = {added:+.2f} us"
        )

    def eager_bound(k: int) -> float | None:
        eager = _host_us(results, "eager", k)
        return None if eager is None else eager + SAMPLED_COMPARE_LIMIT_US

    return [
        _added_target(results, "watch",
                      f"the watch of 300 parameters adds <= {WATCH_LIMIT_US:g} us a call, every K",
                      "graphed_weights", "graphed", WATCH_LIMIT_US),
        _added_target(results, "lora_watch",
                      f"LoRA adapters (rank 16, 96 projections) add <= {LORA_LIMIT_US:g} us a "
                      "call to the watched DiT, every K",
                      "graphed_lora", "graphed_weights", LORA_LIMIT_US),
        bound,
        _added_target(results, "cpu_input",
                      f"one CPU input staged on the device adds <= {CPU_INPUT_LIMIT_US:g} us a "
                      "call, every K",
                      "graphed_cpu_input", "graphed", CPU_INPUT_LIMIT_US),
        _added_target(results, "externals",
                      f"four externals checked before each replay add <= {EXTERNALS_LIMIT_US:g} "
                      "us a call, every K",
                      "graphed_externals", "graphed", EXTERNALS_LIMIT_US),
        _added_target(results, "verify_unsampled",
                      f"verify_every adds <= {UNSAMPLED_LIMIT_US:g} us to a call it does not "
                      "sample, every K",
                      "graphed_verify_unsampled", "graphed", UNSAMPLED_LIMIT_US),
        _added_target(results, "verify_sampled",
                      f"a sampled call adds <= an eager call + {SAMPLED_COMPARE_LIMIT_US:g} us "
                      "(one eager forward and the comparison, no wait for the device), every K",
                      "graphed_verify_sampled", "graphed", eager_bound),
    ]  # fmt: skip


def _launch_target(results: dict) -> dict:
    text = "launches per replay independent of K (GraphedForward, K=4 vs K=64)"
    counts = results.get("launches", {}).get("graphed", {})
    small, large = counts.get("4"), counts.get("64")
    if not small or not large:
        return _target("launches", text, "N/A", _NOT_MEASURED)
    if not small["graph_launches_per_call"] or not large["graph_launches_per_call"]:
        return _target("launches", text, "N/A", "the profiler recorded no graph launch")
    same = (
        small["launches"] == large["launches"]
        and small["device_activities_per_call"] == large["device_activities_per_call"]
    )
    measured = (
        f"K=4: {small['launches_per_call']:g} launches, "
        f"{small['device_activities_per_call']:g} device activities/call; "
        f"K=64: {large['launches_per_call']:g}, {large['device_activities_per_call']:g}"
    )
    return _target("launches", text, "PASS" if same else "MISS", measured)


def _dit_targets(results: dict) -> list[dict]:
    targets = []
    for size, limit in DIT_LIMITS.items():
        text = f"DiT {size}: GraphedForward per forward within {limit:.0%} of bare replay"
        methods = results.get("dit", {}).get(size, {}).get("methods", {})
        if "graphed" not in methods or "bare" not in methods:
            targets.append(_target(f"dit_{size}", text, "N/A", _NOT_MEASURED))
            continue
        graphed, bare = methods["graphed"]["forward_ms"], methods["bare"]["forward_ms"]
        ratio = graphed / bare
        status = "PASS" if ratio <= 1 + limit else "MISS"
        measured = f"{graphed:.3f} ms / {bare:.3f} ms = {ratio:.4f}"
        targets.append(_target(f"dit_{size}", text, status, measured))
    return targets


def _capture_targets(results: dict) -> list[dict]:
    text = "first-call capture latency GraphedForward <= seed wrapper"
    parts, verdicts = [], []
    for size, entry in results.get("first_call", {}).items():
        methods = entry.get("methods", {})
        if "graphed" in methods and "seed" in methods:
            graphed = methods["graphed"]["first_call_ms"]
            seed = methods["seed"]["first_call_ms"]
            verdicts.append(graphed <= seed)
            parts.append(f"{size}: {graphed:.1f} vs {seed:.1f} ms")
    if verdicts:
        capture = _target("capture", text, "PASS" if all(verdicts) else "MISS", "; ".join(parts))
    else:
        capture = _target("capture", text, "N/A", _NOT_MEASURED)
    text = "device memory, 16 resident graphs: GraphedForward <= seed wrapper"
    methods = results.get("memory", {}).get("methods", {})
    if "graphed" in methods and "seed" in methods:
        graphed, seed = methods["graphed"], methods["seed"]
        keys = ("allocated_bytes", "peak_allocated_bytes")
        ok = all(graphed[key] <= seed[key] for key in keys)
        measured = (
            f"allocated {graphed['allocated_bytes'] / 2**20:.1f} vs "
            f"{seed['allocated_bytes'] / 2**20:.1f} MiB; peak "
            f"{graphed['peak_allocated_bytes'] / 2**20:.1f} vs "
            f"{seed['peak_allocated_bytes'] / 2**20:.1f} MiB"
        )
        memory = _target("memory", text, "PASS" if ok else "MISS", measured)
    else:
        memory = _target("memory", text, "N/A", _NOT_MEASURED)
    return [capture, memory]


def _traffic_targets(results: dict) -> list[dict]:
    """The storms of traffic that varies (churn_bench.py) against eager, and the memory left."""
    traffic = results.get("traffic")
    rows = (
        ("float_storm", "ratio", STORM_LIMIT, "float kwarg new every call, 40 calls: total"),
        ("shape_storm", "ratio", STORM_LIMIT, "60 sequence lengths, max_entries=16: total"),
        ("shape_storm", "memory_ratio", MEMORY_LIMIT, "60 lengths: reserved after 60 / after 16"),
    )
    targets = []
    for scenario, field, limit, what in rows:
        ident = f"{scenario}_{field}"
        text = f"{what} <= {limit}x" + (" eager" if field == "ratio" else "")
        if traffic is None:
            targets.append(_target(ident, text, "N/A", _NOT_MEASURED))
            continue
        entry = traffic[scenario]
        value = entry[field]
        if field == "ratio":
            measured = f"{entry['graphed_ms']:.1f} / {entry['eager_ms']:.1f} ms = {value:.2f}x"
        else:
            measured = f"{value:.2f}x"
        targets.append(_target(ident, text, "PASS" if value <= limit else "MISS", measured))
    return targets


def _over_compile_targets(results: dict) -> list[dict]:
    """GraphedForward over a default-mode compile against reduce-overhead, per forward."""
    targets = []
    for size in DIT_LIMITS:
        text = f"DiT {size}: GraphedForward over torch.compile <= reduce-overhead per forward"
        methods = results.get("dit", {}).get(size, {}).get("methods", {})
        if "graphed_compile" not in methods or "compile" not in methods:
            targets.append(_target(f"over_compile_{size}", text, "N/A", _NOT_MEASURED))
            continue
        over, reduce = methods["graphed_compile"]["forward_ms"], methods["compile"]["forward_ms"]
        status = "PASS" if over <= reduce else "MISS"
        measured = f"{over:.3f} ms vs {reduce:.3f} ms"
        targets.append(_target(f"over_compile_{size}", text, status, measured))
    return targets


def evaluate(results: dict[str, Any]) -> list[dict]:
    """Every target of the issue, in its order, with its status and the figures behind it."""
    return [
        *_host_targets(results),
        *added_cost_targets(results),
        _launch_target(results),
        *_dit_targets(results),
        *_over_compile_targets(results),
        *_capture_targets(results),
        *_traffic_targets(results),
    ]
