"""Decode tokens per second at the sizes people serve on one GPU: graphed over torch.compile
against transformers' own compiled decode step, with eager and graphed without compile beside them.

    PYTHONPATH=python:bench python bench/compiled_decode_bench.py --out DIR [--models llama,qwen3]

Why it exists: on the tests' tiny decoders graphed's launch savings decide, but at 0.6-1B
parameters the kernels themselves do, and there the peer a user already has is generate()'s
compiled step (inductor's fused kernels in its CUDA graph trees). The models are built here with
random weights in the public configs' shapes (Llama 3.2 1B, Qwen3 0.6B, Gemma 3 1B with its
sliding windows of 512), bf16, batch 1, a 32-token prompt, 96 new tokens, greedy, a static cache
generate() makes per request; nothing is downloaded. The methods, each in turn on the same model,
Dynamo's caches reset before each compiled one:

- eager: generate(disable_compile=True);
- compiled step: generate() as is (transformers compiles the decode step with
  mode="reduce-overhead" on a GPU with a static cache);
- graphed: graphed.graph_generation(model);
- graphed + compile: graphed.graph_generation(model, compile=True) (inductor's default mode
  compiled inside graphed's first decode step, graphed's graphs around its kernels).

Per method: the first request (alone: the compile, the capture), then rounds of a whole request
and of one new token (the prefill, eager in every method); the decode rate is the new tokens after
the first over the median difference. The tokens of graphed + compile must equal the compiled
code's without graphs (an error otherwise; eager's and the compiled step's are compared and
reported). For graphed + compile it also gives where a token's time goes: the decode graph's
device time per step (the CUDA kernels the profiler saw over one request) against the wall time
per token. Targets (bench/targets.py): graphed + compile >= 1.2x the compiled step's rate, and a
first request no longer than the compiled step's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from generate_bench import _request, _timed  # noqa: E402

PROMPT, NEW_TOKENS, ROUNDS = 32, 96, 2
METHODS = ("eager", "compiled step", "graphed", "graphed + compile")
RATE_TARGET = 1.2  # graphed + compile over the compiled step


def _config(name: str):
    """The public config's shapes of each model (random weights)."""
    import transformers

    common = {"eos_token_id": None, "pad_token_id": 0, "tie_word_embeddings": True}
    if name == "llama":  # Llama 3.2 1B
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
            max_position_embeddings=131072, rms_norm_eps=1e-5, **common,
        )  # fmt: skip
    if name == "qwen3":  # Qwen3 0.6B
        return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=40960, rms_norm_eps=1e-6, **common,
        )  # fmt: skip
    if name == "gemma3":  # Gemma 3 1B: five sliding-window layers (512) to one full one
        layers = 26
        kinds = [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)
        ]
        return transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
            vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
            layer_types=kinds, query_pre_attn_scalar=256, max_position_embeddings=32768,
            rms_norm_eps=1e-6, **common,
        )  # fmt: skip
    raise SystemExit(f"unknown model {name!r} (llama, qwen3, gemma3)")


def _build(name: str) -> torch.nn.Module:
    model_class, config = _config(name)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_class(config)
    return model.to(torch.bfloat16).eval()


def _rate(generate) -> tuple[float, float]:
    """(decode tokens/s, wall ms per decode token) over ROUNDS rounds of a whole request and of
    one new token."""
    whole, one = [], []
    for _ in range(ROUNDS):
        whole.append(_timed(lambda: generate(NEW_TOKENS))[0])
        one.append(_timed(lambda: generate(1))[0])
    per_token = (statistics.median(whole) - statistics.median(one)) / (NEW_TOKENS - 1)
    return 1.0 / per_token, per_token * 1e3


def _device_ms_per_step(generate) -> float | None:
    """The CUDA kernels' time over one request, per decode step (the profiler's view), or None
    where the profiler saw none."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        generate(NEW_TOKENS)
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prefill:
        generate(1)
        torch.cuda.synchronize()

    def kernels_us(p) -> float:
        return sum(
            getattr(e, "self_device_time_total", 0.0)
            for e in p.key_averages()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        )

    spent = kernels_us(prof) - kernels_us(prefill)
    return spent / 1e3 / (NEW_TOKENS - 1) if spent > 0 else None


def _method(model, name: str, prompt: dict, log) -> tuple[dict, torch.Tensor, object]:
    import graphed

    handle = None
    if name in ("compiled step", "graphed + compile"):
        torch._dynamo.reset()
    if name == "graphed":
        handle = graphed.graph_generation(model, device="cuda")
    elif name == "graphed + compile":
        handle = graphed.graph_generation(model, device="cuda", compile=True)
    generate = _request(model, prompt, compiled=name == "compiled step")
    first_s, tokens = _timed(lambda: generate(NEW_TOKENS))
    log(f"  {name}: first request {first_s:.2f} s")
    rate, wall_ms = _rate(generate)
    row = {"tokens_per_s": rate, "wall_ms_per_token": wall_ms, "first_request_s": first_s}
    if handle is not None:
        stats = handle.stats()
        row.update(enabled=stats["enabled"], captures=stats["captures"])
        if not stats["enabled"]:
            row["disabled_reason"] = stats["disabled_reason"]
        if name == "graphed + compile":
            row["device_ms_per_step"] = _device_ms_per_step(generate)
            row["compile_refused"] = handle._step.compile_refused
    log(f"  {name}: {json.dumps(row)}")
    return row, tokens, handle


def run_model(name: str, log=print) -> dict:
    model = _build(name)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (1, PROMPT), generator=generator).cuda()
    prompt = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    rows, tokens = {}, {}
    for method in METHODS:
        rows[method], tokens[method], handle = _method(model, method, prompt, log)
        if method == "graphed + compile":
            # The same compiled step without graphs: what graphed with compile must equal.
            handle.graphed.disable("the benchmark's reference: the compiled step without graphs")
            reference = _request(model, prompt, compiled=False)(NEW_TOKENS)
            rows[method]["equals_compiled_code"] = bool(torch.equal(reference, tokens[method]))
        if handle is not None:
            handle.remove()
    for method in METHODS:
        rows[method]["equals_eager"] = bool(torch.equal(tokens[method], tokens["eager"]))
    ratio = rows["graphed + compile"]["tokens_per_s"] / rows["compiled step"]["tokens_per_s"]
    first = rows["graphed + compile"]["first_request_s"] <= rows["compiled step"]["first_request_s"]
    return {
        "model": name,
        "rows": rows,
        "rate_over_compiled_step": ratio,
        "rate_target": RATE_TARGET,
        "rate_pass": ratio >= RATE_TARGET,
        "first_request_pass": first,
    }


def table(results: list[dict]) -> list[str]:
    lines = [
        "| model | "
        + " | ".join(f"{m} tok/s (first s)" for m in METHODS)
        + " | graphed+compile / compiled step | first request | device ms/step vs wall ms/token |",
        "|" + "---|" * (len(METHODS) + 4),
    ]
    for result in results:
        rows = result["rows"]
        cells = [
            f"{rows[m]['tokens_per_s']:.1f} ({rows[m]['first_request_s']:.2f})" for m in METHODS
        ]
        mine = rows["graphed + compile"]
        device = mine.get("device_ms_per_step")
        split = f"{device:.2f} vs {mine['wall_ms_per_token']:.2f}" if device else "n/a"
        verdict = "PASS" if result["rate_pass"] else "MISS"
        lines.append(
            f"| {result['model']} | "
            + " | ".join(cells)
            + f" | {result['rate_over_compiled_step']:.2f}x {verdict} (target {RATE_TARGET}x)"
            + f" | {'PASS' if result['first_request_pass'] else 'MISS'} | {split} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="llama,qwen3,gemma3")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("compiled_decode_bench: no CUDA device; nothing measured")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    results = []
    for name in args.models.split(","):
        started = time.perf_counter()
        print(f"{name}:")
        results.append(run_model(name))
        print(f"  ({time.perf_counter() - started:.0f} s)")
        print("\n".join(table(results[-1:])[2:]))  # this model's row now: a later one may not end
        (args.out / "compiled_decode_results.json").write_text(json.dumps(results, indent=1))
        torch.cuda.empty_cache()
    print("\n".join(table(results)))
    failed = [
        r["model"]
        for r in results
        if not r["rows"]["graphed + compile"].get("equals_compiled_code")
    ]
    if failed:
        print(f"ERROR: graphed + compile's tokens differ from the compiled code's on {failed}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
