"""Decode tokens per second of transformers' own `model.generate(...)` on a static cache: eager,
graphed.graph_generation, and transformers' own compiled decode step (torch.compile
mode="reduce-overhead", what generate() does on a GPU with a static cache), in the two call
patterns a server uses.

    PYTHONPATH=python:bench python bench/generate_bench.py --out DIR [--quick]

Two decoders with random weights built from configs here (bf16; nothing downloaded), greedy
decoding of one prompt a row: a Llama (every layer a StaticLayer) and a Gemma 3 of the same sizes
whose layers are mostly sliding windows (StaticSlidingWindowLayer, WINDOW tokens, shorter than
the prompt and the new tokens: its decode steps fill the window, then roll it). The call
patterns, in this order:

- "fresh": `generate(..., cache_implementation="static")` with no cache passed, so generate()
  makes a new StaticCache each request (the default pattern; graph_generation copies each new
  cache into the tensors its one graph holds, torch.compile's CUDA graphs see new addresses);
- "passed": one StaticCache per method passed as the cache and reset() between requests, of the
  length generate() gives its own caches, so that both patterns are one shape.

Each pattern's first request per method is timed alone (the compile, capture or re-recording it
costs), then a second one (a method whose second request takes over SLOW_S seconds, as if it
recompiled every request, is reported and left out of the rounds). A request is timed whole and
with one new token only (the prefill, eager in every method); the decode rate is the batch's
tokens after the first over the difference. Rounds interleave the methods. "captures" counts the
graphs made during the pattern: graphed's captures, and the CUDA graphs torch.compile's cudagraph
trees recorded (where this torch lets them be counted). graphed's tokens must be eager's (an error
otherwise); compile's are compared and reported. bench/run.py runs it as one section on a CUDA
machine; without CUDA or transformers it says so and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from timing import choose_host_clock, wall_ms_interleaved  # noqa: E402

METHODS = {
    "eager": "eager (static cache)",
    "graphed": "graphed.graph_generation",
    "compiled": 'torch.compile mode="reduce-overhead" (transformers\' decode compile)',
}
PATTERNS = {
    "fresh": 'cache_implementation="static" (a new cache a request)',
    "passed": "a StaticCache passed (reset a request)",
}
SIZES = {
    "full": {"layers": 8, "new_tokens": 128, "rounds": 6},
    "quick": {"layers": 8, "new_tokens": 32, "rounds": 3},
}
BATCH, PROMPT = 1, 32
WINDOW = 48  # Gemma 3's sliding window: the prompt is shorter, prompt plus new tokens longer
FAMILIES = {
    "llama": "Llama-family decoder",
    "gemma3": f"Gemma 3 (text) decoder, 3 of 4 layers sliding windows of {WINDOW}",
}
# A second request slower than this (seconds) is a method that recompiles every request.
SLOW_S = 10.0


def _model(layers: int, device: torch.device, family: str = "llama") -> torch.nn.Module:
    import transformers

    sizes = {
        "vocab_size": 32000,
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "max_position_embeddings": 1024,
        "eos_token_id": None,
        "pad_token_id": 0,
    }
    if family == "gemma3":
        kinds = (["sliding_attention"] * 3 + ["full_attention"]) * (layers // 4)
        config = transformers.Gemma3TextConfig(
            **sizes, head_dim=64, sliding_window=WINDOW, layer_types=kinds
        )
        model_class = transformers.Gemma3ForCausalLM
    else:
        config, model_class = transformers.LlamaConfig(**sizes), transformers.LlamaForCausalLM
    torch.manual_seed(0)
    return model_class(config).to(device=device, dtype=torch.bfloat16).eval()


def _cache_kwarg() -> str:
    """generate()'s cache kwarg: `cache` from transformers 5.24 (`past_key_values` warns there),
    `past_key_values` before."""
    from transformers import LlamaForCausalLM

    parameters = inspect.signature(LlamaForCausalLM.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _request(model, prompt: dict, compiled: bool, **options) -> Callable[[int], torch.Tensor]:
    """generate() of one request with `new_tokens` new tokens: on a StaticCache reset first when
    one is given (`cache=`), else on one generate() makes."""
    options = {**options, **({} if compiled else {"disable_compile": True})}
    cache = options.pop("cache", None)
    if cache is None:
        options["cache_implementation"] = "static"
    else:
        options[_cache_kwarg()] = cache

    def generate(new_tokens: int) -> torch.Tensor:
        if cache is not None:
            cache.reset()
        return model.generate(**prompt, max_new_tokens=new_tokens, do_sample=False, **options)

    return generate


def _length_of_generates_cache(model, prompt: dict, new_tokens: int) -> int:
    """The length generate() gives the static cache it makes for this request."""
    output = model.generate(
        **prompt,
        max_new_tokens=new_tokens,
        do_sample=False,
        cache_implementation="static",
        disable_compile=True,
        return_dict_in_generate=True,
    )
    cache = output.get("cache", output.get("past_key_values"))
    # The longest layer: a sliding window's is the window (Gemma 3's first layer).
    return max(
        int(layer.keys.shape[-2])
        for layer in cache.layers
        if getattr(layer, "keys", None) is not None
    )


@contextlib.contextmanager
def _cudagraph_records() -> Iterator[list[int] | None]:
    """[count] of the CUDA graphs torch.compile's cudagraph trees record meanwhile; None where
    this torch has no CUDAGraphTreeManager.record_function to count them by."""
    try:
        from torch._inductor.cudagraph_trees import CUDAGraphTreeManager
    except ImportError:
        yield None
        return
    original = getattr(CUDAGraphTreeManager, "record_function", None)
    if original is None:
        yield None
        return
    count = [0]

    def record_function(self, *args, **kwargs):
        count[0] += 1
        return original(self, *args, **kwargs)

    CUDAGraphTreeManager.record_function = record_function
    try:
        yield count
    finally:
        CUDAGraphTreeManager.record_function = original


def _timed(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    torch.cuda.synchronize()
    started = time.perf_counter()
    tokens = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - started, tokens


def _run_pattern(generate: dict, new_tokens: int, rounds: int, captures_of, log) -> dict:
    """One call pattern: each method's first and second request, then the timed rounds."""
    result: dict = {"first_request_s": {}, "second_request_s": {}, "not_timed": {}}
    tokens = {}
    with _cudagraph_records() as records:
        before = captures_of()
        for name, fn in generate.items():
            result["first_request_s"][name], tokens[name] = _timed(lambda fn=fn: fn(new_tokens))
            log(f"    first request, {name}: {result['first_request_s'][name]:.2f} s")
        for name, fn in generate.items():
            result["second_request_s"][name], _ = _timed(lambda fn=fn: fn(new_tokens))
            if result["second_request_s"][name] > SLOW_S:
                result["not_timed"][name] = (
                    f"its second request took {result['second_request_s'][name]:.1f} s"
                )
                log(f"    {name}: not timed, {result['not_timed'][name]}")
        timed = {name: fn for name, fn in generate.items() if name not in result["not_timed"]}
        clock = choose_host_clock()
        whole = wall_ms_interleaved(
            {name: lambda fn=fn: fn(new_tokens) for name, fn in timed.items()},
            torch.cuda.synchronize,
            clock,
            rounds=rounds,
            warmup_rounds=0,
        )
        prefill = wall_ms_interleaved(
            {name: lambda fn=fn: fn(1) for name, fn in timed.items()},
            torch.cuda.synchronize,
            clock,
            rounds=rounds,
            warmup_rounds=0,
        )
        result["captures"] = {
            "eager": None,
            "graphed": captures_of() - before,
            "compiled": None if records is None else records[0],
        }
    result["tokens_equal_eager"] = {
        name: bool(torch.equal(tokens[name], tokens["eager"])) for name in generate
    }
    decoded = BATCH * (new_tokens - 1)
    result["methods"] = {}
    for name in timed:
        request_ms = whole[name]["wall_ms"]["median"]
        prefill_ms = prefill[name]["wall_ms"]["median"]
        decode_ms = request_ms - prefill_ms
        result["methods"][name] = {
            "label": METHODS[name],
            "request_ms": request_ms,
            "prefill_ms": prefill_ms,
            "decode_ms_per_token": decode_ms / (new_tokens - 1),
            "decode_tokens_per_s": decoded / (decode_ms / 1e3),
        }
        log(
            f"    {METHODS[name]}: {result['methods'][name]['decode_tokens_per_s']:.0f} decode "
            f"tokens/s, {request_ms:.1f} ms a request, tokens equal eager's: "
            f"{result['tokens_equal_eager'][name]}"
        )
    return result


def run_generate(
    device: torch.device,
    *,
    quick: bool,
    with_compile: bool = True,
    log=print,
    family: str = "llama",
) -> dict:
    """Per call pattern, each method's decode tokens per second, first-request seconds, captures
    and token check (with_compile=False leaves torch.compile's out), for one of FAMILIES."""
    import graphed
    from transformers import StaticCache

    size = SIZES["quick" if quick else "full"]
    new_tokens = size["new_tokens"]
    model = _model(size["layers"], device, family)
    graphed_model = _model(size["layers"], device, family)
    generation = graphed.graph_generation(graphed_model, device=device, name="generate")
    input_ids = torch.randint(1, 32000, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    prompt = {"input_ids": input_ids.to(device), "attention_mask": torch.ones_like(input_ids)}
    prompt["attention_mask"] = prompt["attention_mask"].to(device)
    owners = {"eager": model, "graphed": graphed_model, "compiled": model}
    if not with_compile:
        del owners["compiled"]
    result: dict = {
        "config": {**size, "batch": BATCH, "prompt": PROMPT, "dtype": "bfloat16"},
        "family": family,
        "patterns": {},
    }

    def captures_of() -> int:
        return generation.stats()["captures"]

    for pattern, label in PATTERNS.items():
        log(f"  {label}:")
        if pattern == "fresh":
            generate = {
                name: _request(owner, prompt, name == "compiled") for name, owner in owners.items()
            }
        else:
            length = _length_of_generates_cache(model, prompt, new_tokens)
            generate = {
                name: _request(
                    owner,
                    prompt,
                    name == "compiled",
                    cache=StaticCache(config=owner.config, max_cache_len=length),
                )
                for name, owner in owners.items()
            }
        figures = _run_pattern(generate, new_tokens, size["rounds"], captures_of, log)
        result["patterns"][pattern] = {"label": label, **figures}
        if not figures["tokens_equal_eager"]["graphed"]:
            raise AssertionError(
                f"graphed.graph_generation's greedy tokens differ from eager's ({label})"
            )
    result["stats"] = generation.stats()
    return result


def generate_table(result: dict) -> list[str]:
    """The results as a Markdown table (bench/run.py writes it beside the report)."""
    config = result["config"]
    stats = result["stats"]
    lines = [
        f"{FAMILIES[result.get('family', 'llama')]}, {config['layers']} layers of 1024, bf16, "
        f"batch {config['batch']}, "
        f"prompt {config['prompt']}, {config['new_tokens']} new tokens, greedy, static cache; "
        "the patterns in this order, on the same models",
        "",
        "| call pattern | method | decode tokens/s | ms per decode token | prefill ms "
        "| first request s | captures | tokens equal eager's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pattern in result["patterns"].values():
        for name, first in pattern["first_request_s"].items():
            captures = pattern["captures"].get(name)
            method = pattern["methods"].get(name)
            rate = (
                f"{method['decode_tokens_per_s']:.0f} | {method['decode_ms_per_token']:.3f} "
                f"| {method['prefill_ms']:.2f}"
                if method is not None
                else f"not timed: {pattern['not_timed'][name]} | - | -"
            )
            lines.append(
                f"| {pattern['label']} | {METHODS[name]} | {rate} | {first:.2f} "
                f"| {'-' if captures is None else captures} "
                f"| {pattern['tokens_equal_eager'][name]} |"
            )
    lines += [
        "",
        f"graphed over both patterns: {stats['captures']} captures, {stats['replays']} replays, "
        f"{stats['cache_adoptions']} caches adopted, {stats['cache_copies_out']} copied out, "
        f"{stats['eager_forwards']} eager forwards (prefills)",
    ]
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
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help=f"comma-separated, of {list(FAMILIES)}"
    )
    args = parser.parse_args()
    why = missing_reason()
    if why is not None:
        print(f"SKIPPED: {why}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for family in args.families.split(","):
        started = time.perf_counter()
        device = torch.device("cuda", torch.cuda.current_device())
        result = run_generate(device, quick=args.quick, family=family)
        result["seconds"] = time.perf_counter() - started
        name = "generate_results.json" if family == "llama" else f"generate_{family}_results.json"
        (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
        print("\n".join(generate_table(result)))
        print(f"({result['seconds']:.0f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
