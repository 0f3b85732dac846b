"""The third-party models whose forwards copy host constants to the device, timed: graphed against
the same model called eagerly, in the same process.

These are the models of tests/python/test_host_constant_models.py (diffusers' Chroma, HiDream,
CogView4 and Qwen-Image transformers as their pipelines call them, transformers' Falcon through
generate()), built from the test's own tiny random configs so that what is timed is what the
test proves bitwise equal; the test file is imported for them. Each diffusers model is timed as
back-to-back calls with one synchronize (bench/timing.throughput_us), Falcon as whole greedy
requests against generate() with its compiled decode step turned off (eager decode). A CUDA
device is needed:

    PYTHONPATH=<graphed>:bench python bench/host_constant_models.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import graphed
import torch
from timing import throughput_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import test_host_constant_models as models  # noqa: E402

CALLS, ROUNDS = 50, 3
FALCON_NEW_TOKENS, FALCON_REQUESTS = 32, 5


def _sync() -> None:
    torch.cuda.synchronize()


def time_diffusers_model(name: str) -> dict:
    """Microseconds per call, eager and graphed (median of ROUNDS), and what graphed did."""
    case = models.CASES[name]
    model = models._build(case, "cuda")
    kwargs = case.inputs(model, "cuda", torch.Generator(device="cuda").manual_seed(0))
    gf = graphed.GraphedForward(model, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            gf(**kwargs)
            model(**kwargs)
        eager, graphed_us = [], []
        for _ in range(ROUNDS):
            eager.append(throughput_us(lambda: model(**kwargs), _sync, calls=CALLS))
            graphed_us.append(throughput_us(lambda: gf(**kwargs), _sync, calls=CALLS))
    stats = gf.stats()
    how = "captured whole" if stats["enabled"] else f"regions ({len(gf.regions())} entries)"
    return {
        "model": name,
        "how": how,
        "eager_us": statistics.median(eager),
        "graphed_us": statistics.median(graphed_us),
        "captures": stats["captures"],
        "staged": stats["staged_constants"],
    }


def time_falcon() -> dict:
    """Tokens per second of FALCON_REQUESTS greedy requests, eager decode and graph_generation."""
    model = models._falcon().cuda()
    prompts = [models._prompt("cuda", seed) for seed in range(FALCON_REQUESTS)]

    def requests(**options) -> tuple[float, list[torch.Tensor]]:
        outputs = []
        _sync()
        start = time.perf_counter()
        for prompt in prompts:
            outputs.append(
                model.generate(
                    **prompt,
                    max_new_tokens=FALCON_NEW_TOKENS,
                    do_sample=False,
                    cache_implementation="static",
                    **options,
                )
            )
        _sync()
        tokens = FALCON_NEW_TOKENS * len(prompts) * models.BATCH
        return tokens / (time.perf_counter() - start), outputs

    requests(disable_compile=True)  # warm-up
    eager_rate, want = requests(disable_compile=True)
    generation = graphed.graph_generation(model, device="cuda")
    requests()  # the capture
    graphed_rate, got = requests()
    stats = generation.stats()
    return {
        "model": "Falcon generate()",
        "how": "decode step captured" if stats["enabled"] else "disabled",
        "eager_tokens_per_s": eager_rate,
        "graphed_tokens_per_s": graphed_rate,
        "tokens_equal": all(torch.equal(a, b) for a, b in zip(got, want, strict=True)),
        "captures": stats["captures"],
    }


def main() -> None:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| model | what graphed did | eager us/call | graphed us/call | speedup | staged |")
    for name in models.CASES:
        r = time_diffusers_model(name)
        speedup = r["eager_us"] / r["graphed_us"]
        print(f"| {name} | {r['how']}, {r['captures']} captures | {r['eager_us']:.0f} | "
              f"{r['graphed_us']:.0f} | {speedup:.2f}x | {r['staged']} |")  # fmt: skip
    r = time_falcon()
    print(f"| {r['model']} | {r['how']}, {r['captures']} captures, tokens equal: "
          f"{r['tokens_equal']} | {r['eager_tokens_per_s']:.0f} tok/s | "
          f"{r['graphed_tokens_per_s']:.0f} tok/s | "
          f"{r['graphed_tokens_per_s'] / r['eager_tokens_per_s']:.2f}x | |")  # fmt: skip


if __name__ == "__main__":
    main()
