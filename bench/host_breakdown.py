"""Where the microseconds of a GraphedForward call go, measured by difference on a CUDA device.

    PYTHONPATH=<graphed>:bench python bench/host_breakdown.py [--json FILE]

Each row times a call that does one stage less than the row before it, in the same interleaved
bursts (timing.host_cost_interleaved), on the host-cost workload (workloads.FirstPlusOne, K
tensors in one list kwarg); a stage's cost is the difference of two rows:

- Python layer: `gf(xs=xs)` against the C entry called directly with a prebuilt kwargs dict
  (`_graphed_fastcall.call`), so the `__call__` frame, the option checks and the kwargs dict;
- fresh outputs: the C entry against the same with static_outputs=True (no output allocation);
- walk: the C entry's walk of the kwargs alone (`_graphed_fastcall.flatten`: walk, describe each
  tensor, build the key; plus a list and a bytes object it returns);
- launch: the bare replay of a graph captured by hand (`g.replay()`);
- core: what remains of the static-outputs call after the walk and the launch (signature,
  lookup, the copy tables, the runner's bookkeeping, the shim);
- copy-table rewrites: the C entry with inputs and outputs at new addresses every call, against
  the C entry.

Differences of medians are estimates (stages overlap a little: a cache miss saved in one is paid
in the next); the rows themselves are measurements.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import graphed
import torch
from baselines import capture_bare
from graphed._native import _graphed_fastcall as fastcall
from timing import choose_host_clock, host_cost_interleaved
from workloads import Alternating, FirstPlusOne

KS = (4, 32, 64)


def _rows(k: int, device: torch.device) -> dict:
    module = FirstPlusOne()
    xs = [torch.randn(8, device=device) for _ in range(k)]
    gf = graphed.GraphedForward(module, device=device, name=f"breakdown-k{k}")
    for _ in range(3):
        gf(xs=xs)
    kwargs = {"xs": xs}
    entry = functools.partial(
        fastcall.call, gf.runner_id, kwargs, None, False, False, gf._call_state, [], ()
    )
    static = functools.partial(
        fastcall.call, gf.runner_id, kwargs, None, False, True, gf._call_state, [], ()
    )

    def entry_with(*, xs: list) -> object:
        return fastcall.call(gf.runner_id, {"xs": xs}, None, False, False, gf._call_state, [], ())

    methods = {
        "call": functools.partial(gf, xs=xs),
        "c_entry": entry,
        "c_entry_static_outputs": static,
        "walk_only": functools.partial(fastcall.flatten, kwargs, None),
        "bare_replay": capture_bare(module, kwargs).replay,
        "c_entry_new_addresses": Alternating(entry_with, xs, [x.clone() for x in xs]).__call__,
    }
    for name, fn in methods.items():
        if name not in ("walk_only", "bare_replay"):
            out = fn()
            if not isinstance(out, torch.Tensor) or not torch.equal(out, xs[0] + 1):
                raise RuntimeError(f"{name} did not return the forward's output: {out!r}")
    timed = host_cost_interleaved(
        methods,
        choose_host_clock(),
        torch.cuda.synchronize,
        bursts=200,
        burst_len=16,
        warmup_bursts=5,
    )
    us = {name: result["median"] for name, result in timed.items()}
    stats = gf.stats()
    if stats["captures"] != 1 or stats["eager_calls"] != 0:
        raise RuntimeError(f"the runner did not replay: {stats}")
    return us


def _stages(us: dict) -> dict:
    return {
        "python layer": us["call"] - us["c_entry"],
        "fresh outputs": us["c_entry"] - us["c_entry_static_outputs"],
        "walk": us["walk_only"],
        "launch (bare replay)": us["bare_replay"],
        "core and shim": us["c_entry_static_outputs"] - us["walk_only"] - us["bare_replay"],
        "total (call)": us["call"],
        "copy-table rewrites (new addresses)": us["c_entry_new_addresses"] - us["c_entry"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows and stages to FILE")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    results = {}
    for k in KS:
        us = _rows(k, device)
        results[k] = {"rows_us": us, "stages_us": _stages(us)}
    print("host us per call (median), by row:")
    names = list(results[KS[0]]["rows_us"])
    print("| row | " + " | ".join(f"K={k}" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    for name in names:
        cells = " | ".join(f"{results[k]['rows_us'][name]:.2f}" for k in KS)
        print(f"| {name} | {cells} |")
    print("stages, us (differences of the rows):")
    print("| stage | " + " | ".join(f"K={k}" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    for stage in results[KS[0]]["stages_us"]:
        cells = " | ".join(f"{results[k]['stages_us'][stage]:.2f}" for k in KS)
        print(f"| {stage} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
