"""The host-cost sweep alone, for comparing two builds of graphed in one device session: run it once
per build with that build's python/ first on PYTHONPATH (scripts/device_check.sh compare does),
alternating builds, and compare the medians and their ratios to the bare replay of the same run.

    PYTHONPATH=<tree>/python:bench python bench/host_cost_only.py --label NAME --json FILE

It also prints the targets of what an option adds to a call (bench/targets.py: the watch, LoRA
state, positional binding, CPU staging, externals, sampled verification), each from this run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import graphed
import torch
from host_cost import run_host_cost
from targets import added_cost_targets
from timing import choose_host_clock, gc_paused

RATIO_METHODS = (
    "graphed", "graphed_changing", "graphed_op", "graphed_python", "graphed_positional",
    "graphed_weights", "graphed_lora", "graphed_verify_unsampled", "graphed_verify_sampled",
    "graphed_externals", "eager",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="the build's name in the output")
    parser.add_argument("--json", type=Path, help="append this run's medians to FILE")
    parser.add_argument("--bursts", type=int, default=120)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_cost_only: needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    with gc_paused():
        results = run_host_cost(
            device,
            [4, 32, 64],
            choose_host_clock(),
            bursts=args.bursts,
            burst_len=16,
            warmup_bursts=5,
            throughput_calls=500,
            graphs=True,
            log=lambda line: None,
        )
    medians = {
        name: {k: entry["burst"][k]["median"] for k in entry["burst"]}
        for name, entry in results["methods"].items()
    }
    for k in ("4", "32", "64"):
        bare = medians["bare"][k]
        parts = [
            f"{name} {medians[name][k]:.2f} us ({medians[name][k] / bare:.2f}x)"
            for name in RATIO_METHODS
            if k in medians.get(name, {})
        ]
        empty = medians.get("passthrough", {}).get(k)
        if empty is not None:
            parts.append(
                f"empty op {empty:.2f} us (op bound, empty + 2x bare: {empty + 2 * bare:.2f})"
            )
        print(f"[{args.label}] K={k}: bare {bare:.2f} us; " + "; ".join(parts), flush=True)
    for target in added_cost_targets({"host_cost": results}):
        print(f"[{args.label}] {target['status']}: {target['target']}: {target['measured']}")
    if args.json is not None:
        with args.json.open("a") as out:
            out.write(
                json.dumps({"label": args.label, "graphed": graphed.__file__, "medians": medians})
                + "\n"
            )


if __name__ == "__main__":
    main()
