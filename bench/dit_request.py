"""The DiT-request measurement: a TaoMate-like serving request is nine forwards of a DiT-like
denoiser (bench/dit_model.py) with per-request values changing on every forward (a fresh latent x
and timestep each time; prompt, RoPE table and positions fixed for the request), so a graph
wrapper must copy new values in on every call and must never re-capture.

Two sizes: "big" is the target (24 blocks, width 1024, 300 rows, bf16), device-bound once graphed;
"small" (4 blocks, width 256, 64 rows) is short enough that the host cost of the wrapper shows.
Every method runs the same inputs, in interleaved rounds (timing.wall_ms_interleaved), and its
first forward is checked against eager. The model, its inputs and the sizes are workloads.py's,
which torch.compile's own process (compiled.py) builds too, so they are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import graphed
import torch
from baselines import capture_bare
from methods import DIT_METHODS
from seed_wrapper import SeedGraphedForward
from timing import HostClock, wall_ms_interleaved
from workloads import BF16_REL_TOL, build_model, config_dict, dit_config, rel_err, request_inputs

__all__ = ["run_dit_request"]


def _request(fn: Callable[..., Any], calls: list[dict]) -> None:
    for kwargs in calls:
        fn(**kwargs)


def _bare_request(replay: Callable[[], None], forwards: int) -> None:
    for _ in range(forwards):
        replay()


def run_dit_request(
    size: str,
    device: torch.device,
    clock: HostClock,
    *,
    rounds: int,
    warmup_rounds: int,
    graphs: bool,
    log: Callable[[str], None] = print,
) -> dict:
    """ms per request and per forward for eager, the seed wrapper, graphed and bare replay; with
    graphs=False (no CUDA) eager and GraphedForward's eager fallback only, in float32."""
    dtype = torch.bfloat16 if graphs else torch.float32
    cfg = dit_config(size, device, dtype)
    sync = torch.cuda.synchronize if graphs else (lambda: None)
    model = build_model(cfg)
    calls = request_inputs(cfg)
    forwards = len(calls)
    results: dict[str, Any] = {
        "size": size,
        "config": config_dict(cfg),
        "forwards_per_request": forwards,
        "rounds": rounds,
        "warmup_rounds": warmup_rounds,
        "methods": {},
        "rel_err_vs_eager": {},
        "stats": {},
    }
    with torch.no_grad():
        expected = model(**calls[0])
        gf = graphed.GraphedForward(model, device=device, name=f"dit-{size}")
        methods: dict[str, Callable[[], Any]] = {
            "eager": lambda: _request(model, calls),
            "graphed": lambda: _request(gf, calls),
        }
        outputs = {"graphed": lambda: gf(**calls[0])}
        seed = None
        if graphs:
            seed = SeedGraphedForward(model, device=device, max_entries=16, warmup_iters=2)
            bare = capture_bare(model, calls[0])
            methods["seed"] = lambda: _request(seed, calls)
            methods["bare"] = lambda: _bare_request(bare.replay, forwards)
            outputs["seed"] = lambda: seed(**calls[0])
            outputs["bare"] = lambda: (bare.replay(), bare.static_output)[1]
        for name, produce in outputs.items():
            produce()  # the capture, for the graph wrappers
            results["rel_err_vs_eager"][name] = rel_err(produce(), expected)
        sync()
        timed = wall_ms_interleaved(
            methods, sync, clock, rounds=rounds, warmup_rounds=warmup_rounds
        )
    order = [name for name in DIT_METHODS if name in timed]
    for name in order:
        wall, host = timed[name]["wall_ms"], timed[name]["host_ms"]
        results["methods"][name] = {
            "label": DIT_METHODS[name],
            "request_ms": wall["median"],
            "forward_ms": wall["median"] / forwards,
            "request_ms_p10": wall["p10"],
            "request_ms_p90": wall["p90"],
            "host_ms_per_request": host["median"],
        }
    results["stats"]["graphed"] = gf.stats()
    if seed is not None:
        results["stats"]["seed"] = seed.stats()
    bad = {name: err for name, err in results["rel_err_vs_eager"].items() if not err < BF16_REL_TOL}
    if bad:
        log(f"  DiT {size}: results differ from eager beyond {BF16_REL_TOL}: {bad}")
    summary = "  ".join(f"{name}={results['methods'][name]['forward_ms']:.3f}" for name in order)
    log(f"  DiT {size} ({forwards} forwards/request, {rounds} rounds) ms/forward: {summary}")
    return results
