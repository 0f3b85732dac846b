"""diffusers' step caches with and without graphed: a 9-step request of a Flux transformer, eager,
eager with each cache, graphed, and graphed with each cache, timed in one process (every method
once per round, in turn, the median over the rounds; bench/timing.wall_ms_interleaved).

    PYTHONPATH=<graphed>:bench python bench/step_caches_bench.py

The caches and the request are tests/python/test_step_caches.py's (imported for them: the same
configs, the step's other inputs made once as a pipeline makes them before its loop, the timestep
taken from a table on the device, the latents of each step from the model's output, each call in
`cache_context("cond")`, the cache reset after the request): FirstBlockCache, TaylorSeer, MagCache
and PyramidAttentionBroadcast. Two transformers: the test's tiny Flux (2 double and 2 single blocks)
and a deeper one (8 and 16 blocks, still small), launch-bound on a GPU. The targets (the issue's):
graphed with a cache at most 0.4x eager with the same cache on the tiny Flux, and at most 0.5x
graphed without a cache wherever the cache computed at most half of its modules' calls. A CUDA
device is needed.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import graphed
import torch
from timing import choose_host_clock, wall_ms_interleaved

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import test_step_caches as cases  # noqa: E402

ROUNDS, WARMUP_ROUNDS = 7, 2
MODELS = {
    "tiny Flux (2+2 blocks)": {},
    "Flux (8+16 blocks)": {"num_layers": 8, "num_single_layers": 16},
}
EAGER_TARGET, GRAPHED_TARGET = 0.4, 0.5


def _flux(overrides: dict) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(**{**cases.FLUX, **overrides}).cuda().eval()


def _one_request(model: object, cached_model: torch.nn.Module, clock: cases.Timestep):
    """A request of cases.STEPS steps (its first request's latents); the cache reset after it."""

    def request() -> None:
        latents = torch.randn(1, 16, 4, generator=torch.Generator("cuda").manual_seed(0),
                              device="cuda")  # fmt: skip
        with torch.no_grad():
            for step in range(cases.STEPS):
                clock.value = int(1000 * (1 - step / cases.STEPS))
                context = (
                    cached_model.cache_context("cond")
                    if cached_model.is_cache_enabled
                    else contextlib.nullcontext()
                )
                with context:
                    output = model(**cases._inputs(latents, step))[0]
                latents = latents - output / cases.STEPS
        if cached_model.is_cache_enabled:
            cached_model._reset_stateful_cache()

    return request


def _computed_share(runner: graphed.GraphedForward, calls: int) -> float:
    """About the share of its cached modules' calls that computed: their regions' captures and
    replays over the calls (a region's first, eager call is not counted)."""
    regions = {entry["path"]: entry for entry in runner.regions()}
    paths = [path for path, _ in graphed._step_caches.cached_modules(runner.module)]
    runs = sum(
        (regions[path]["stats"] or {}).get("replays", 0)
        + (regions[path]["stats"] or {}).get("captures", 0)
        for path in paths
        if path in regions
    )
    return runs / (calls * len(paths)) if paths else 1.0


def run_model(name: str, overrides: dict) -> list[str]:
    methods, runners, clock = {}, {}, cases.Timestep()
    plain = _flux(overrides)
    methods["eager"] = _one_request(plain, plain, clock)
    plain_graphed = graphed.GraphedForward(_flux(overrides), device="cuda", name="no cache")
    methods["graphed"] = _one_request(plain_graphed, plain_graphed.module, clock)
    for cache, config in cases._configs(clock).items():
        eager_model, graphed_model = _flux(overrides), _flux(overrides)
        eager_model.enable_cache(config())
        graphed_model.enable_cache(config())
        methods[f"eager + {cache}"] = _one_request(eager_model, eager_model, clock)
        runners[cache] = graphed.GraphedForward(graphed_model, device="cuda", name=cache)
        methods[f"graphed + {cache}"] = _one_request(runners[cache], graphed_model, clock)
    timed = wall_ms_interleaved(
        methods,
        torch.cuda.synchronize,
        choose_host_clock(),
        rounds=ROUNDS,
        warmup_rounds=WARMUP_ROUNDS,
    )
    ms = {method: timed[method]["wall_ms"]["median"] for method in methods}
    lines = [f"\n{name}: ms per {cases.STEPS}-step request (median of {ROUNDS})",
             f"| eager {ms['eager']:.2f} | graphed {ms['graphed']:.2f} "
             f"({ms['graphed'] / ms['eager']:.2f}x eager) |",
             "| cache | eager + cache | graphed + cache | vs eager + cache | vs graphed | "
             "computed |"]  # fmt: skip
    calls = (ROUNDS + WARMUP_ROUNDS) * cases.STEPS
    for cache in runners:
        cached, eager = ms[f"graphed + {cache}"], ms[f"eager + {cache}"]
        share = _computed_share(runners[cache], calls)
        to_eager = cached / eager
        to_graphed = cached / ms["graphed"]
        verdicts = []
        if not overrides:
            verdicts.append("PASS" if to_eager <= EAGER_TARGET else "MISS")
        if share <= 0.5:
            verdicts.append("PASS" if to_graphed <= GRAPHED_TARGET else "MISS")
        lines.append(f"| {cache} | {eager:.2f} | {cached:.2f} | {to_eager:.2f}x | "
                     f"{to_graphed:.2f}x | {share:.0%} | {' '.join(verdicts)}")  # fmt: skip
    return lines


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("step_caches_bench: needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"targets: graphed + cache <= {EAGER_TARGET}x eager + cache (tiny Flux); <= "
          f"{GRAPHED_TARGET}x graphed where the cache computed <= 50% of its calls")  # fmt: skip
    for name, overrides in MODELS.items():
        print("\n".join(run_model(name, overrides)))


if __name__ == "__main__":
    main()
