"""generate() across the decoder families whose static caches are not all StaticLayers: sliding
windows (Gemma 2 and 3, GPT-OSS, Mistral with its default window, Cohere2, Exaone4, Llama 4's
chunked layers), linear-attention hybrids (Qwen3-Next, LFM2), and Falcon; Llama beside them as
the plain static cache. Per family: decode tokens per second of eager generate()
(`disable_compile=True`) and of graph_generation, the speedup, whether the tokens are equal at
every step, the graphs captured, and why graph_generation declined where it did.

    PYTHONPATH=<graphed>:bench python bench/generate_families.py [--compiled] [--families A,B]

Tiny random configs built here (nothing downloaded), bf16 on a GPU, batch 2, greedy. The prompt
(PROMPT tokens) is shorter than the sliding window (WINDOW) and the generation goes past it, so
a sliding layer's both regimes (filling, then full and rolling) are decoded. Each request is timed
whole with NEW_TOKENS new tokens and with one (the prefill, eager in every method); the decode
rate is the batch's tokens after the first over the difference, the median of ROUNDS
interleaved rounds. --compiled adds transformers' default static-cache generate() (its decode
step compiled, mode="reduce-overhead"), whose first request compiles. Target: graphed at least
SPEEDUP_TARGET times eager's decode rate on every family, tokens equal (bench/targets.py has the
project's other targets)."""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

SPEEDUP_TARGET = 2.0
BATCH, PROMPT, WINDOW, NEW_TOKENS, ROUNDS = 2, 12, 16, 40, 5

# Sizes every family shares; each family adds what its config needs (its window, its layer kinds).
COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "max_position_embeddings": 256, "pad_token_id": 0, "eos_token_id": None}  # fmt: skip
SLIDING_FULL = ["sliding_attention", "full_attention"] * 2
DROP = object()  # a COMMON size a family's config does not take
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "Llama (StaticLayer only)": ("LlamaForCausalLM", "LlamaConfig", {}),
    "Gemma 2": ("Gemma2ForCausalLM", "Gemma2Config",
                {"sliding_window": WINDOW, "layer_types": SLIDING_FULL}),
    "Gemma 3 (text)": ("Gemma3ForCausalLM", "Gemma3TextConfig",
                       {"sliding_window": WINDOW, "layer_types": SLIDING_FULL}),
    "GPT-OSS": ("GptOssForCausalLM", "GptOssConfig",
                {"sliding_window": WINDOW, "layer_types": SLIDING_FULL, "num_local_experts": 4,
                 "num_experts_per_tok": 2}),
    "Mistral (default sliding_window)": ("MistralForCausalLM", "MistralConfig", {}),
    "Mistral (sliding_window 16)": ("MistralForCausalLM", "MistralConfig",
                                    {"sliding_window": WINDOW}),
    "Cohere2": ("Cohere2ForCausalLM", "Cohere2Config",
                {"sliding_window": WINDOW, "layer_types": SLIDING_FULL}),
    "Exaone4": ("Exaone4ForCausalLM", "Exaone4Config",
                {"sliding_window": WINDOW, "layer_types": SLIDING_FULL}),
    "Llama 4 (text)": ("Llama4ForCausalLM", "Llama4TextConfig",
                       {"attention_chunk_size": WINDOW, "intermediate_size_mlp": 128,
                        "num_local_experts": 2, "num_experts_per_tok": 1,
                        "layer_types": ["chunked_attention", "full_attention"] * 2}),
    "Qwen3-Next": ("Qwen3NextForCausalLM", "Qwen3NextConfig",
                   {"linear_num_key_heads": 2, "linear_num_value_heads": 2,
                    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                    "shared_expert_intermediate_size": 64,
                    "layer_types": ["linear_attention", "full_attention"] * 2}),
    "LFM2": ("Lfm2ForCausalLM", "Lfm2Config",
             {"layer_types": ["conv", "full_attention"] * 2}),
    "Falcon": ("FalconForCausalLM", "FalconConfig",
               {"num_kv_heads": 2, "new_decoder_architecture": True, "head_dim": DROP,
                "num_key_value_heads": DROP}),
}  # fmt: skip


def build(name: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The family's tiny random model; ValueError naming what this transformers lacks."""
    import transformers

    model_name, config_name, extra = FAMILIES[name]
    if not hasattr(transformers, model_name) or not hasattr(transformers, config_name):
        raise ValueError(f"transformers {transformers.__version__} has no {model_name}")
    config_class = getattr(transformers, config_name)
    config = config_class(**{k: v for k, v in {**COMMON, **extra}.items() if v is not DROP})
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).to(device=device, dtype=dtype).eval()


def _request_s(model, prompt: dict, new_tokens: int, compiled: bool) -> tuple[float, Any]:
    options = {} if compiled else {"disable_compile": True}
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = model.generate(
        **prompt,
        max_new_tokens=new_tokens,
        do_sample=False,
        cache_implementation="static",
        **options,
    )
    torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def run_family(name: str, device: torch.device, compiled: bool) -> dict:
    eager_model = build(name, device, torch.bfloat16)
    graphed_model = copy.deepcopy(eager_model)
    import graphed

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        generation = graphed.graph_generation(graphed_model, device=device)
        ids = torch.randint(1, COMMON["vocab_size"], (BATCH, PROMPT), device=device)
        prompt = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        methods = {"eager": (eager_model, False), "graphed": (graphed_model, False)}
        if compiled:
            methods["compiled"] = (eager_model, True)
        first, tokens = {}, {}
        for method, (model, compile_) in methods.items():
            first[method], tokens[method] = _request_s(model, prompt, NEW_TOKENS, compile_)
        for model, compile_ in methods.values():  # a second request of each, untimed
            _request_s(model, prompt, NEW_TOKENS, compile_)
        whole: dict[str, list] = {method: [] for method in methods}
        prefill: dict[str, list] = {method: [] for method in methods}
        for _ in range(ROUNDS):
            for method, (model, compile_) in methods.items():
                seconds, got = _request_s(model, prompt, NEW_TOKENS, compile_)
                whole[method].append(seconds)
                tokens[method] = tokens[method] if torch.equal(got, tokens[method]) else got
                prefill[method].append(_request_s(model, prompt, 1, compile_)[0])
    rate = {
        method: BATCH
        * (NEW_TOKENS - 1)
        / (statistics.median(whole[method]) - statistics.median(prefill[method]))
        for method in methods
    }
    stats = generation.stats()
    return {
        "family": name,
        "rates": rate,
        "first_request_s": first,
        "speedup": rate["graphed"] / rate["eager"],
        "tokens_equal": {m: bool(torch.equal(tokens[m], tokens["eager"])) for m in methods},
        "captures": stats["captures"],
        "replays": stats["replays"],
        "enabled": stats["enabled"],
        "disabled_reason": stats["disabled_reason"],
        "said": sorted({str(w.message)[:240] for w in said if "graphed" in str(w.message)}),
    }


def table(results: list[dict], compiled: bool) -> list[str]:
    import transformers

    lines = [
        f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name()}; tiny random configs, bf16, batch {BATCH}, prompt "
        f"{PROMPT} (window {WINDOW}), {NEW_TOKENS} new tokens, greedy, static cache",
        "",
        "| family | eager tokens/s | graphed tokens/s | speedup (target >= "
        f"{SPEEDUP_TARGET}x) |"
        + (" compiled tokens/s (first request s) |" if compiled else "")
        + " tokens equal | captures | graphed's word |",
        "|---|---|---|---|" + ("---|" if compiled else "") + "---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['family']} | not run: {r['error']} |")
            continue
        verdict = (
            "PASS" if r["speedup"] >= SPEEDUP_TARGET and r["tokens_equal"]["graphed"] else "MISS"
        )
        extra = (
            f" {r['rates']['compiled']:.0f} ({r['first_request_s']['compiled']:.1f} s, tokens "
            f"equal {r['tokens_equal']['compiled']}) |"
            if compiled
            else ""
        )
        word = "; ".join(r["said"]) or ("" if r["enabled"] else f"disabled: {r['disabled_reason']}")
        lines.append(
            f"| {r['family']} | {r['rates']['eager']:.0f} | {r['rates']['graphed']:.0f} | "
            f"{r['speedup']:.2f}x {verdict} |{extra} {r['tokens_equal']['graphed']} | "
            f"{r['captures']} | {word} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiled", action="store_true", help="add transformers' compiled step")
    parser.add_argument("--families", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    chosen = [f for f in FAMILIES if not args.families or f in args.families.split(",")]
    results = []
    for name in chosen:
        try:
            results.append(run_family(name, device, args.compiled))
        except Exception as error:  # a family this transformers builds differently: reported
            results.append({"family": name, "error": f"{type(error).__name__}: {error}"[:200]})
        print(f"  {name} done", file=sys.stderr, flush=True)
    print("\n".join(table(results, args.compiled)))
    failed = [r for r in results if "error" not in r and not r["tokens_equal"]["graphed"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
