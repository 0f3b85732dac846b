"""A diffusers Flux transformer at a launch-bound size: graphed over regional compilation against
torch.compile(mode="reduce-overhead"), the peer a diffusers user reaches for.

    PYTHONPATH=python:bench python bench/compiled_flux_bench.py

Why it exists: graph_pipeline(compile=True) compiles a transformer's repeated blocks (diffusers'
compile_repeated_blocks) inside graphed's first call and captures the whole forward around the
compiled blocks; reduce-overhead compiles the whole forward and records its own CUDA graphs. The
model: FluxTransformer2DModel of hidden 1536 (12 heads of 128) with 4 double-stream and 8
single-stream blocks over 256 image and 64 text tokens, random weights, bf16, batch 1. Per
method: the first calls until the method replays (the compile, the recording or the capture),
then the median of 5 rounds of 20 forwards (ms a forward, timed by the host around a
synchronised loop). Target: graphed over regional compile <= 0.95x reduce-overhead's time a
forward; its first call is reported beside reduce-overhead's. The outputs of graphed over
regional compile must equal the regional compile's without graphs (an error otherwise).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from timing import throughput_us  # noqa: E402

TARGET = 0.95
ROUNDS, CALLS = 5, 20


def _model() -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=4, num_single_layers=8, attention_head_dim=128,
        num_attention_heads=12, joint_attention_dim=4096, pooled_projection_dim=768,
        guidance_embeds=False, axes_dims_rope=(16, 56, 56),
    )  # fmt: skip
    return model.to("cuda", torch.bfloat16).eval()


def _inputs() -> dict:
    generator = torch.Generator("cuda").manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=torch.bfloat16)

    return {
        "hidden_states": randn(1, 256, 64),
        "encoder_hidden_states": randn(1, 64, 4096),
        "pooled_projections": randn(1, 768),
        "timestep": torch.tensor([0.5], device="cuda", dtype=torch.bfloat16),
        "img_ids": torch.zeros(256, 3, device="cuda"),
        "txt_ids": torch.zeros(64, 3, device="cuda"),
        "return_dict": False,
    }


def _first_calls(call, inputs: dict, calls: int) -> float:
    """Seconds the first `calls` calls took (the compile, the recording or the capture)."""
    return throughput_us(lambda: call(**inputs), torch.cuda.synchronize, calls=calls) * calls / 1e6


def _ms_a_forward(call, inputs: dict) -> float:
    """The median over ROUNDS rounds of CALLS back-to-back forwards, ms a forward."""
    rounds = [
        throughput_us(lambda: call(**inputs), torch.cuda.synchronize, calls=CALLS) / 1e3
        for _ in range(ROUNDS)
    ]
    return statistics.median(rounds)


def _row(call, inputs: dict, first_calls: int = 1) -> tuple[float, float]:
    """One method's row: seconds its first `first_calls` calls took, then ms a forward."""
    first = _first_calls(call, inputs, first_calls)
    return first, _ms_a_forward(call, inputs)


def _variants(model: torch.nn.Module, inputs: dict) -> dict:
    """With --variants, two more rows on a fresh model: the repeated blocks and each other child
    of the transformer compiled in place (the glue between them eager), and the whole forward
    compiled in place (inductor's default mode), each graphed."""
    import graphed

    rows = {}
    model.compile_repeated_blocks(fullgraph=True, dynamic=False)
    for child in model.children():
        if not isinstance(child, torch.nn.ModuleList):
            child.compile(fullgraph=True, dynamic=False)
    runner = graphed.GraphedForward(model, device="cuda", name="flux-children")
    rows["graphed + every child compiled"] = _row(runner, inputs)
    runner.reset()
    torch._dynamo.reset()
    whole = _model()
    whole.compile(fullgraph=True, dynamic=False)
    runner = graphed.GraphedForward(whole, device="cuda", name="flux-whole")
    rows["graphed + whole compile"] = _row(runner, inputs)
    return rows


def _under_graphed_mode(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """The model's output run eagerly under the torch function mode graphed's capture runs
    under: the compiled frames the capture ran, without a graph."""
    from graphed import _inventory

    inventory = _inventory.Inventory("flux-bench", "cuda")
    with inventory.mode(None, None, capturing=False):
        output = model(**inputs)[0].clone()
    inventory.end_run()
    return output


def main() -> int:
    if not torch.cuda.is_available():
        print("compiled_flux_bench: no CUDA device; nothing measured")
        return 0
    import graphed

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    model, inputs = _model(), _inputs()
    rows = {}
    with torch.no_grad():
        rows["eager"] = _row(model, inputs)
        overhead = torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False)
        rows["reduce-overhead"] = _row(overhead, inputs, 3)  # warm-up, record, replay
        del overhead
        torch._dynamo.reset()
        plain = graphed.GraphedForward(model, device="cuda", name="flux")
        rows["graphed"] = _row(plain, inputs)
        plain.reset()
        model.compile_repeated_blocks(fullgraph=True, dynamic=False)
        runner = graphed.GraphedForward(model, device="cuda", name="flux-compiled")
        # compile (in the probe), warm-up, capture
        rows["graphed + regional compile"] = _row(runner, inputs)
        got = runner(**inputs)[0].clone()
        stats = runner.stats()
        runner.disable("the benchmark's reference: the compiled blocks without graphs")
        # Which compiled code the capture ran: the frames Dynamo compiled under graphed's mode,
        # run here under the same mode with no graph (a difference from `got` is the capture's),
        # against the reference, compiled again without the mode (a difference there is the
        # compile's; inductor's cache counters say whether it compiled the kernels again).
        same_code = _under_graphed_mode(model, inputs)
        counters = torch._dynamo.utils.counters
        graphs_before = counters["stats"]["unique_graphs"]
        cache_before = dict(counters["inductor"])
        reference = runner(**inputs)[0]
        compiled_again = counters["stats"]["unique_graphs"] - graphs_before
        cache = {
            key: counters["inductor"][key] - cache_before.get(key, 0)
            for key in ("fxgraph_cache_hit", "fxgraph_cache_miss")
        }
        if "--variants" in sys.argv:
            runner.reset()
            torch._dynamo.reset()
            rows.update(_variants(_model(), inputs))
    for name, (first, ms) in rows.items():
        print(f"| {name} | {ms:.3f} ms a forward | first calls {first:.2f} s |")
    ratio = rows["graphed + regional compile"][1] / rows["reduce-overhead"][1]
    verdict = "PASS" if ratio <= TARGET else "MISS"
    print(
        f"graphed + regional compile / reduce-overhead: {ratio:.3f}x {verdict} (target {TARGET}x)"
    )
    print(f"runner enabled {stats['enabled']}, captures {stats['captures']}")
    print(
        f"the captured code run without a graph equals the replay: {torch.equal(got, same_code)}; "
        f"the reference compiled {compiled_again} frame(s) again (inductor's graph cache: {cache})"
    )
    if not torch.equal(got, reference):
        largest = (got.float() - reference.float()).abs().max().item()
        print(
            "ERROR: graphed over regional compile differs from the compiled blocks alone (largest "
            f"difference {largest:.3g})"
        )
        return 1
    print("graphed over regional compile equals the compiled blocks without graphs, bitwise")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
