"""Traffic that varies, on a CUDA device: the two storms of the dynamic-traffic issue, each run
eagerly and through GraphedForward (defaults) in the same process, with the targets checked.

    PYTHONPATH=<graphed>:bench python bench/churn_bench.py --out DIR

- float storm: an 8-layer MLP-like module called 40 times with a Python float kwarg (a sigma, a
  guidance scale) that differs every call: total wall time against eager's (target <= 1.3x).
  Before the storms, one eager call and one graphed call (of another shape) pay the process's
  one-time costs of kernels and of graphs.
- shape storm: the same module called with 60 sequence lengths, max_entries=16: total wall time
  against eager's (<= 1.3x), and torch.cuda.memory_reserved() after all 60 against after the
  first 16 (<= 1.2x).
- server shapes: six lengths in turn, three rounds, then 100 calls: every shape replays (captures
  and the rounds' wall time reported).
Writes DIR/churn_results.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import graphed
import torch
from targets import MEMORY_LIMIT, STORM_LIMIT


class MLP(torch.nn.Module):
    def __init__(self, width: int = 1024, layers: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x, scale=1.0):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x * scale


def _timed(calls) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for call in calls:
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def _float_storm(module: MLP, device: torch.device) -> dict:
    x = torch.randn(64, 1024, device=device, dtype=torch.bfloat16)
    scales = [0.5 + call / 40 for call in range(40)]
    runner = graphed.GraphedForward(module, device=device, name="float-storm")
    with torch.no_grad():
        eager_ms = _timed([lambda s=s: module(x, scale=s) for s in scales])
        graphed_ms = _timed([lambda s=s: runner(x, scale=s) for s in scales])
        same = all(torch.equal(runner(x, scale=s), module(x, scale=s)) for s in scales[:3])
    return {
        "eager_ms": eager_ms,
        "graphed_ms": graphed_ms,
        "ratio": graphed_ms / eager_ms,
        "bitwise": same,
        "stats": runner.stats(),
    }


def _shape_storm(module: MLP, device: torch.device) -> dict:
    inputs = [
        torch.randn(rows * 8, 1024, device=device, dtype=torch.bfloat16) for rows in range(1, 61)
    ]
    runner = graphed.GraphedForward(module, device=device, name="shape-storm", max_entries=16)
    with torch.no_grad():
        eager_ms = _timed([lambda x=x: module(x) for x in inputs])
        torch.cuda.empty_cache()
        start_reserved = torch.cuda.memory_reserved(device)
        first_ms = _timed([lambda x=x: runner(x) for x in inputs[:16]])
        after_16 = torch.cuda.memory_reserved(device)
        rest_ms = _timed([lambda x=x: runner(x) for x in inputs[16:]])
        after_60 = torch.cuda.memory_reserved(device)
    grown_16, grown_60 = after_16 - start_reserved, after_60 - start_reserved
    return {
        "eager_ms": eager_ms,
        "graphed_ms": first_ms + rest_ms,
        "ratio": (first_ms + rest_ms) / eager_ms,
        "reserved_after_16": after_16,
        "reserved_after_60": after_60,
        "memory_ratio": after_60 / after_16,
        "grown_after_16": grown_16,
        "grown_after_60": grown_60,
        "stats": runner.stats(),
    }


def _server_shapes(module: MLP, device: torch.device) -> dict:
    inputs = [
        torch.randn(rows, 1024, device=device, dtype=torch.bfloat16)
        for rows in (8, 16, 32, 64, 128, 256)
    ]
    runner = graphed.GraphedForward(module, device=device, name="server")
    with torch.no_grad():
        rounds_ms = _timed([lambda x=x: runner(x) for _ in range(3) for x in inputs])
        steady_ms = _timed([lambda x=x: runner(x) for _ in range(17) for x in inputs[:6]])
        eager_ms = _timed([lambda x=x: module(x) for _ in range(17) for x in inputs[:6]])
    return {
        "rounds_ms": rounds_ms,
        "steady_ms": steady_ms,
        "eager_steady_ms": eager_ms,
        "stats": runner.stats(),
    }


def run_storms(device: torch.device) -> dict:
    """Every scenario on `device`, eager and graphed in this process (bench/run.py's section)."""
    module = MLP().to(device=device, dtype=torch.bfloat16).eval()
    warm_up = torch.randn(8, 1024, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        module(warm_up)  # kernels loaded
        # The process's one-time costs of graphs (the first runner's set-up, the first capture's
        # side stream and library handles) paid before any storm, as eager's kernel loading is:
        # the storms measure traffic, not start-up (which the first-call rows time).
        graphed.GraphedForward(module, device=device, name="storm-warm-up")(warm_up)
    return {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device),
        "float_storm": _float_storm(module, device),
        "shape_storm": _shape_storm(module, device),
        "server_shapes": _server_shapes(module, device),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("churn_bench: needs a CUDA device")
        return 0
    results = run_storms(torch.device("cuda", torch.cuda.current_device()))
    float_storm, shape_storm = results["float_storm"], results["shape_storm"]
    server = results["server_shapes"]
    rows = [
        ("float storm, 40 calls: graphed / eager total", float_storm["ratio"], STORM_LIMIT),
        ("shape storm, 60 lengths: graphed / eager total", shape_storm["ratio"], STORM_LIMIT),
        ("shape storm: reserved after 60 / after 16", shape_storm["memory_ratio"], MEMORY_LIMIT),
    ]
    print(f"{results['device']}, torch {results['torch']}")
    for text, value, limit in rows:
        print(f"| {text} | {value:.2f}x | <= {limit}x | {'PASS' if value <= limit else 'MISS'} |")
    for name in ("float_storm", "shape_storm"):
        entry, stats = results[name], results[name]["stats"]
        print(
            f"{name}: eager {entry['eager_ms']:.1f} ms, graphed {entry['graphed_ms']:.1f} ms; "
            f"captures {stats['captures']}, churn_eager_calls {stats['churn_eager_calls']}"
        )
    print(f"float storm bitwise: {float_storm['bitwise']}")
    print(
        f"server shapes: captures {server['stats']['captures']}, three rounds "
        f"{server['rounds_ms']:.1f} ms, then 102 calls {server['steady_ms']:.1f} ms against eager "
        f"{server['eager_steady_ms']:.1f} ms"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "churn_results.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
