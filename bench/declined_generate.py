"""What graph_generation costs where it declines a decode step: transformers' `generate()` of a
decoder on a static cache that offloads its layers (`cache_implementation="offloaded_static"`,
which moves the tensors a graph would hold, so graph_generation leaves it eager with one
warning), timed with graph_generation installed against the same model without it, in one
process. The target: at most 2% slower (bench/targets.py, DECLINED_LIMIT). (Sliding-window
caches, which this timed before, are graphed now: bench/generate_families.py.)

    PYTHONPATH=<graphed>:bench python bench/declined_generate.py [--device cuda]

Tiny random configs (nothing downloaded), bf16 on a GPU (fp32 on the CPU), greedy decoding of one
prompt a row with `cache_implementation="offloaded_static"` and `disable_compile=True` (eager
decode, the baseline graph_generation is measured against everywhere). The two models are
copies with the same weights; their requests alternate over ROUNDS rounds (which goes first
alternating too) and each time is the median.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from typing import Any

import graphed
import torch

DECLINED_LIMIT = 1.02
ROUNDS, NEW_TOKENS, PROMPT = 9, 48, 6


def _families() -> dict[str, Any]:
    import transformers

    common = {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "max_position_embeddings": 256, "pad_token_id": 0, "eos_token_id": None}  # fmt: skip
    families = {
        "Gemma 2": ("Gemma2ForCausalLM", "Gemma2Config", {"intermediate_size": 128,
                                                          "sliding_window": 16}),
        "Llama": ("LlamaForCausalLM", "LlamaConfig", {"intermediate_size": 128}),
    }  # fmt: skip
    found = {}
    for name, (model, config, extra) in families.items():
        if hasattr(transformers, model) and hasattr(transformers, config):
            made = getattr(transformers, config)(**common, **extra)
            found[name] = (getattr(transformers, model), made)
    return found


def _requests_per_second(model: torch.nn.Module, prompt: torch.Tensor, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    tokens = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        cache_implementation="offloaded_static",
        disable_compile=True,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, tokens


def run_family(name: str, model_class: type, config: Any, device: torch.device) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    plain = model_class(config).to(device=device, dtype=dtype).eval()
    hooked = copy.deepcopy(plain)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        generation = graphed.graph_generation(hooked, device=device)
        prompt = torch.randint(1, config.vocab_size, (1, PROMPT), device=device)
        _requests_per_second(plain, prompt, device)
        _requests_per_second(hooked, prompt, device)
    times: dict[str, list[float]] = {"without": [], "declined": []}
    equal = True
    for round_ in range(ROUNDS):  # which model goes first alternates, so drift hits both alike
        order = (("without", plain), ("declined", hooked))
        outputs = {}
        for key, model in order if round_ % 2 == 0 else order[::-1]:
            seconds, outputs[key] = _requests_per_second(model, prompt, device)
            times[key].append(seconds)
        equal = equal and torch.equal(outputs["declined"], outputs["without"])
    without, declined = (statistics.median(times[key]) for key in ("without", "declined"))
    stats = generation.stats()
    generation.remove()
    return {
        "family": name,
        "without_ms": without * 1e3,
        "declined_ms": declined * 1e3,
        "ratio": declined / without,
        "tokens_equal": equal,
        "captures": stats["captures"],
        "warned": [str(w.message)[:90] for w in said if "graphed" in str(w.message)][:1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    device = torch.device(parser.parse_args().device)
    print(f"torch {torch.__version__}, {device}")
    print("| family | generate() without graphed | with graph_generation (declined) | ratio |")
    for name, (model_class, config) in _families().items():
        r = run_family(name, model_class, config, device)
        verdict = "PASS" if r["ratio"] <= DECLINED_LIMIT else "MISS"
        print(f"| {name} | {r['without_ms']:.1f} ms | {r['declined_ms']:.1f} ms | "
              f"{r['ratio']:.3f} ({verdict}: <= {DECLINED_LIMIT}) | tokens equal "
              f"{r['tokens_equal']}, captures {r['captures']}, said: {r['warned']} |")  # fmt: skip


if __name__ == "__main__":
    main()
