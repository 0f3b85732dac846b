"""Decode tokens per second of transformers' own `model.generate(...)` on a static cache: eager,
graphed.graph_generation, and transformers' own compiled decode step (torch.compile
mode="reduce-overhead", what generate() does on a GPU with a static cache).

    PYTHONPATH=python:bench python bench/generate_bench.py --out DIR [--quick]

A Llama-family decoder with random weights built from a config here (bf16; nothing downloaded),
greedy decoding of one prompt a row into one StaticCache per method, reset between requests (so
each method's graphs are reused across requests, as a server would). A request is timed whole
and with one new token only (the prefill, eager in every method); the decode rate is the batch's
tokens after the first over the difference. Rounds interleave the methods. graphed's tokens must
be eager's (an error otherwise); compile's are compared and reported. bench/run.py runs it as one
section on a CUDA machine; without CUDA or transformers it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from timing import choose_host_clock, wall_ms_interleaved  # noqa: E402

METHODS = {
    "eager": "eager (static cache)",
    "graphed": "graphed.graph_generation",
    "compiled": 'torch.compile mode="reduce-overhead" (transformers\' decode compile)',
}
SIZES = {
    "full": {"layers": 8, "new_tokens": 128, "rounds": 10, "warmup_rounds": 1},
    "quick": {"layers": 8, "new_tokens": 32, "rounds": 3, "warmup_rounds": 1},
}
BATCH, PROMPT = 1, 32


def _model(layers: int, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        max_position_embeddings=1024,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()


def _requests(model, cache, prompt: dict, compiled: bool):
    """generate() of one request with `new_tokens` new tokens, on `cache` reset first."""
    options = {} if compiled else {"disable_compile": True}

    def generate(new_tokens: int) -> torch.Tensor:
        cache.reset()
        return model.generate(
            **prompt, past_key_values=cache, max_new_tokens=new_tokens, do_sample=False, **options
        )

    return generate


def run_generate(
    device: torch.device, *, quick: bool, with_compile: bool = True, log=print
) -> dict:
    """Each method's decode tokens per second, first-request seconds and token check
    (with_compile=False leaves torch.compile's out)."""
    import graphed
    from transformers import StaticCache

    size = SIZES["quick" if quick else "full"]
    new_tokens = size["new_tokens"]
    model, graphed_model = _model(size["layers"], device), _model(size["layers"], device)
    generation = graphed.graph_generation(graphed_model, device=device, name="generate")
    input_ids = torch.randint(1, 32000, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    prompt = {"input_ids": input_ids.to(device), "attention_mask": torch.ones_like(input_ids)}
    prompt["attention_mask"] = prompt["attention_mask"].to(device)
    length = PROMPT + new_tokens
    owners = {"eager": model, "graphed": graphed_model, "compiled": model}
    if not with_compile:
        del owners["compiled"]
    generate = {
        name: _requests(
            owner,
            StaticCache(config=owner.config, max_cache_len=length),
            prompt,
            name == "compiled",
        )
        for name, owner in owners.items()
    }
    result: dict = {"config": {**size, "batch": BATCH, "prompt": PROMPT, "dtype": "bfloat16"}}
    result["first_request_s"], tokens = {}, {}
    for name, fn in generate.items():
        torch.cuda.synchronize()
        started = time.perf_counter()
        tokens[name] = fn(new_tokens)
        torch.cuda.synchronize()
        result["first_request_s"][name] = time.perf_counter() - started
        log(f"  first request, {name}: {result['first_request_s'][name]:.2f} s")
    result["tokens_equal_eager"] = {
        name: bool(torch.equal(tokens[name], tokens["eager"])) for name in generate
    }
    clock = choose_host_clock()
    whole = wall_ms_interleaved(
        {name: lambda fn=fn: fn(new_tokens) for name, fn in generate.items()},
        torch.cuda.synchronize,
        clock,
        rounds=size["rounds"],
        warmup_rounds=size["warmup_rounds"],
    )
    prefill = wall_ms_interleaved(
        {name: lambda fn=fn: fn(1) for name, fn in generate.items()},
        torch.cuda.synchronize,
        clock,
        rounds=size["rounds"],
        warmup_rounds=size["warmup_rounds"],
    )
    decoded = BATCH * (new_tokens - 1)
    result["methods"] = {}
    for name in generate:
        label = METHODS[name]
        request_ms = whole[name]["wall_ms"]["median"]
        decode_ms = request_ms - prefill[name]["wall_ms"]["median"]
        result["methods"][name] = {
            "label": label,
            "request_ms": request_ms,
            "prefill_ms": prefill[name]["wall_ms"]["median"],
            "decode_ms_per_token": decode_ms / (new_tokens - 1),
            "decode_tokens_per_s": decoded / (decode_ms / 1e3),
        }
        log(
            f"  {label}: {result['methods'][name]['decode_tokens_per_s']:.0f} decode tokens/s, "
            f"{request_ms:.1f} ms a request, tokens equal eager's: "
            f"{result['tokens_equal_eager'][name]}"
        )
    result["stats"] = generation.stats()
    if not result["tokens_equal_eager"]["graphed"]:
        raise AssertionError("graphed.graph_generation's greedy tokens differ from eager's")
    return result


def generate_table(result: dict) -> list[str]:
    """The results as a Markdown table (bench/run.py writes it beside the report)."""
    config = result["config"]
    lines = [
        f"Llama-family decoder, {config['layers']} layers of 1024, bf16, batch {config['batch']}, "
        f"prompt {config['prompt']}, {config['new_tokens']} new tokens, greedy, static cache",
        "",
        "| method | decode tokens/s | ms per decode token | prefill ms | first request s "
        "| tokens equal eager's |",
        "|---|---|---|---|---|---|",
    ]
    for name, method in result["methods"].items():
        lines.append(
            f"| {method['label']} | {method['decode_tokens_per_s']:.0f} "
            f"| {method['decode_ms_per_token']:.3f} | {method['prefill_ms']:.2f} "
            f"| {result['first_request_s'][name]:.2f} | {result['tokens_equal_eager'][name]} |"
        )
    return lines


def missing_reason() -> str | None:
    """Why this benchmark cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description="transformers generate() decode rate")
    parser.add_argument("--out", type=Path, required=True, help="folder for generate_results.json")
    parser.add_argument("--quick", action="store_true", help="fewer new tokens and rounds")
    args = parser.parse_args()
    why = missing_reason()
    if why is not None:
        print(f"SKIPPED: {why}")
        return 0
    result = run_generate(torch.device("cuda", torch.cuda.current_device()), quick=args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "generate_results.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(generate_table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
