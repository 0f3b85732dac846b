"""Regions on a CUDA device: what a forward that cannot be captured whole keeps of its graphs.

A 24-block pre-norm transformer (dim 512, 256 tokens, batch 2, bf16, attention through
F.scaled_dot_product_attention, MLP 4x) whose block 12 carries a host-side guard
(`if x.abs().amax().item() > 1e4: x = x.clamp(-1e4, 1e4)`), the kind of check real model code
has. Rows: eager; the whole forward through one GraphedForward (the same weights without the
guard); regional (GraphedForward over the guarded model: the probe finds the guard and the
forward runs in regions, automatically); hand-built (every block but 12 in its own
GraphedForward, the loop in Python). The ratio whole_ms / regional_ms is the share of the
whole-forward speedup kept (target 0.75, stretch 0.90); every row is compared bitwise with eager
on inputs other than the capture's. Also a tiny diffusers transformer with a forced `.item()` in
one block (skipped when diffusers is missing), and a tiny random LlamaForCausalLM (transformers,
nothing downloaded) whose decoder layer 2 carries a forced `.item()`, so that no decode step can
be captured whole: `model.generate(...)` greedy on a static cache, eagerly and through
graphed.graph_generation with regions=True and with its default (regions off), tokens compared
with eager's, decode tokens/s of each, and what regions() of the decode steps' GraphedForward
says (skipped when transformers or a CUDA device is missing).

Times: torch.cuda.synchronize around N forwards after warm-up, the median of the repeats.

    PYTHONPATH=<graphed>:bench python bench/regions_bench.py --out DIR
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import graphed
import torch
import torch.nn.functional as F
from torch import nn

TARGET, STRETCH = 0.75, 0.90
CALLS, REPEATS, WARMUP = 50, 5, 3
# The generate() row: layers, the one that synchronizes, prompt rows and length, new tokens.
GEN_LAYERS, GEN_SYNC_LAYER, GEN_BATCH, GEN_PROMPT, GEN_NEW_TOKENS = 6, 2, 1, 16, 32


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    """A pre-norm block; `guarded` gives it the host-side guard (a synchronization)."""

    def __init__(self, dim: int, heads: int, guarded: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim)
        )
        self.guarded = guarded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.guarded:
            if x.abs().amax().item() > 1e4:  # the guard
                x = x.clamp(-1e4, 1e4)
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line)


# Where the sync probe finds the guard (tests/python/test_regions.py checks regions() names it).
GUARD_LINE = _line_of("# the guard")


class Transformer(nn.Module):
    def __init__(
        self, blocks: int = 24, dim: int = 512, heads: int = 8, guarded: int | None = 12
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            Block(dim, heads, guarded=index == guarded) for index in range(blocks)
        )
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def _eager(model: nn.Module) -> Callable[..., Any]:
    def call(**kwargs: Any) -> Any:
        with torch.no_grad():
            return model(**kwargs)

    return call


def _hand_built(model: Transformer, skipped: int) -> Callable[..., Any]:
    """Every block but `skipped` in its own GraphedForward, the loop in Python."""
    pool = graphed.MemoryPool("cuda")
    runners = [
        None
        if index == skipped
        else graphed.GraphedForward(
            block, device="cuda", name=f"hand/{index}", memory_pool=pool, churn_limit=0
        )
        for index, block in enumerate(model.blocks)
    ]

    def call(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for block, runner in zip(model.blocks, runners, strict=True):
                x = block(x) if runner is None else runner(x)
            return model.out(model.norm(x))

    return call


def _milliseconds(call: Callable[..., Any], kwargs: dict) -> float:
    for _ in range(WARMUP):
        call(**kwargs)
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(CALLS):
            call(**kwargs)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3 / CALLS)
    return statistics.median(times)


def _first_tensor(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


def _rows(
    calls: dict[str, Callable[..., Any]], warm: dict, fresh: dict, expected: torch.Tensor
) -> list[dict[str, Any]]:
    rows = []
    for name, call in calls.items():
        ms = _milliseconds(call, warm)
        equal = torch.equal(_first_tensor(call(**fresh)), expected)
        rows.append({"row": name, "ms": ms, "bitwise": equal})
    return rows


def _transformer_rows() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    guarded = Transformer().to("cuda", torch.bfloat16).eval()
    whole_model = copy.deepcopy(guarded)
    whole_model.blocks[12].guarded = False
    hand_model = copy.deepcopy(guarded)
    generator = torch.Generator(device="cuda").manual_seed(1)
    warm, fresh = (
        {"x": torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16, generator=generator)}
        for _ in range(2)
    )
    regional = graphed.GraphedForward(guarded, device="cuda", name="regional", churn_limit=0)
    calls = {
        "eager": _eager(guarded),
        "whole": graphed.GraphedForward(whole_model, device="cuda", name="whole", churn_limit=0),
        "regional": regional,
        "hand-built": _hand_built(hand_model, 12),
    }
    rows = _rows(calls, warm, fresh, _eager(guarded)(**fresh))
    regions = regional.regions()
    summary = {
        "graphed": sum(entry["state"] == "graphed" for entry in regions),
        "split": [entry["path"] for entry in regions if entry["state"] == "split"],
        "reason": next((entry["reason"] for entry in regions if entry["state"] == "split"), None),
    }
    return rows, summary


def _forced_sync(block: nn.Module) -> None:
    original = block.forward

    @functools.wraps(original)
    def synchronizing(*args: Any, **kwargs: Any) -> Any:
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if hidden.abs().amax().item() > 1e4:  # the forced sync
            raise RuntimeError("hidden states out of range")
        return original(*args, **kwargs)

    block.forward = synchronizing


def _diffusers_rows() -> list[dict[str, Any]] | str:
    try:
        from lora_workflow import sd3_transformer
    except ImportError as error:
        return f"skipped: diffusers is missing ({error})"
    model, inputs = sd3_transformer()
    model = model.to("cuda").eval()
    whole_model = copy.deepcopy(model)
    _forced_sync(model.transformer_blocks[1])
    warm = inputs(torch.device("cuda"))
    fresh = {**warm, "hidden_states": torch.randn_like(warm["hidden_states"])}
    calls = {
        "sd3 eager": _eager(model),
        "sd3 whole": graphed.GraphedForward(whole_model, device="cuda", churn_limit=0),
        "sd3 regional": graphed.GraphedForward(model, device="cuda", churn_limit=0),
    }
    return _rows(calls, warm, fresh, _first_tensor(_eager(model)(**fresh)))


def synchronizing_llama(device: str) -> nn.Module:
    """A tiny random LlamaForCausalLM whose layer GEN_SYNC_LAYER synchronizes (_forced_sync);
    bf16 on CUDA, fp32 elsewhere. No eos token, so every request makes all its new tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=GEN_LAYERS,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    _forced_sync(model.model.layers[GEN_SYNC_LAYER])
    return model


def greedy_generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int, **options: Any) -> Any:
    """Greedy generate() on a static cache generate() makes (docs/api.md's Generation)."""
    with torch.no_grad():
        return model.generate(
            prompt,
            max_new_tokens=new_tokens,
            do_sample=False,
            cache_implementation="static",
            **options,
        )


def _seconds(call: Callable[[], Any], device: str) -> float:
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    call()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _decode_rate(request: Callable[[int], Any], device: str) -> float:
    """Decode tokens/s: rows x (GEN_NEW_TOKENS - 1) over a request's time less that of a request
    of one new token (its prefill), the median of REPEATS after one warm-up of each."""
    request(GEN_NEW_TOKENS)
    request(1)
    rates = []
    for _ in range(REPEATS):
        whole = _seconds(lambda: request(GEN_NEW_TOKENS), device)
        prefill = _seconds(lambda: request(1), device)
        rates.append(GEN_BATCH * (GEN_NEW_TOKENS - 1) / max(whole - prefill, 1e-9))
    return statistics.median(rates)


def _regions_summary(regions: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """What regions() of the decode steps' GraphedForward says, with a note in words."""
    counts = {
        state: sum(entry["state"] == state for entry in regions)
        for state in ("graphed", "eager", "split", "pending")
    }
    reasons = {entry["path"]: entry["reason"] for entry in regions if entry["reason"]}
    if stats["enabled"]:
        note = "the decode step ran whole (captured or not yet): regions were not needed"
    elif not regions:
        note = (
            "regions never engaged: the decode step's runner is disabled "
            f"({stats['disabled_reason']}) and did not split into regions; every decode step "
            "ran eagerly"
        )
    elif counts["graphed"] == 0:
        note = (
            f"regions engaged ({len(regions)} considered) but none was graphed: every decode "
            "step ran eagerly"
        )
        if counts["pending"] == len(regions):
            note += ": no region was ever called"
    else:
        note = f"{counts['graphed']} of {len(regions)} regions graphed"
    return {**counts, "reasons": reasons, "note": note}


def _through_graph_generation(
    model: nn.Module, prompt: torch.Tensor, device: str, regions: bool
) -> dict[str, Any]:
    """The same requests through graph_generation, as docs/api.md shows it: the tokens, the decode
    rate, the decode runner's stats() and regions(); an error the requests raise is reported
    (`error`), not raised, so that the other rows stand."""
    generation = graphed.graph_generation(model, device=device, regions=regions)
    request = functools.partial(greedy_generate, model, prompt)
    tokens = rate = error = None
    try:
        tokens = request(GEN_NEW_TOKENS)
        rate = _decode_rate(request, device)
    except Exception as raised:
        error = f"{type(raised).__name__}: {raised}"
    finally:
        stats = generation.stats()
        regions = generation.graphed.regions()
        generation.remove()
    return {"tokens": tokens, "rate": rate, "error": error, "stats": stats, "regions": regions}


def _generation_row(device: str = "cuda") -> dict[str, Any] | str:
    """The generate() row: eager, then through graph_generation on the same model, with
    regions=True and with its default (regions off)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return "skipped: no CUDA device"
    try:
        import transformers
    except ImportError as error:
        return f"skipped: transformers is missing ({error})"
    model = synchronizing_llama(device)
    generator = torch.Generator().manual_seed(2)
    prompt = torch.randint(1, 1000, (GEN_BATCH, GEN_PROMPT), generator=generator).to(device)
    # Eager: transformers would torch.compile the decode step on a GPU with a static cache.
    eager = functools.partial(greedy_generate, model, prompt, disable_compile=True)
    expected = eager(GEN_NEW_TOKENS)
    eager_rate = _decode_rate(eager, device)
    run = _through_graph_generation(model, prompt, device, regions=True)
    # graph_generation's default (regions off): the decode step runs eagerly.
    default = _through_graph_generation(model, prompt, device, regions=False)
    keys = ("enabled", "disabled_reason", "captures", "replays", "eager_calls", "eager_forwards")
    return {
        "row": "llama generate",
        "model": f"LlamaForCausalLM {GEN_LAYERS} layers, hidden 256, vocab 1000, "
        f"{next(model.parameters()).dtype}, layer {GEN_SYNC_LAYER} synchronizes",
        "transformers": transformers.__version__,
        "batch": GEN_BATCH,
        "prompt": GEN_PROMPT,
        "new_tokens": GEN_NEW_TOKENS,
        "equal": run["tokens"] is not None and bool(torch.equal(run["tokens"], expected)),
        "error": run["error"],
        "eager_tokens_per_s": eager_rate,
        "graphed_tokens_per_s": run["rate"],
        "speedup": None if run["rate"] is None else run["rate"] / eager_rate,
        "default_equal": default["tokens"] is not None
        and bool(torch.equal(default["tokens"], expected)),
        "default_tokens_per_s": default["rate"],
        "default_speedup": None if default["rate"] is None else default["rate"] / eager_rate,
        "decode_runner": {key: run["stats"].get(key) for key in keys},
        "regions": _regions_summary(run["regions"], run["stats"]),
    }


def _print_generation(generation: dict[str, Any] | str) -> None:
    if isinstance(generation, str):
        print(f"generate: {generation}")
        return
    rate, error = generation["graphed_tokens_per_s"], generation["error"]
    graphed_rate = f"{rate:8.1f} tok/s (x{generation['speedup']:.2f})" if error is None else error
    print(
        f"{generation['row']:<14} eager {generation['eager_tokens_per_s']:8.1f} tok/s, "
        f"graphed regions=True {graphed_rate}  equal={generation['equal']}"
    )
    default_rate = generation["default_tokens_per_s"]
    if default_rate is not None:
        print(
            f"{generation['row']:<14} graph_generation's default (regions=False) "
            f"{default_rate:8.1f} tok/s (x{generation['default_speedup']:.2f})  "
            f"equal={generation['default_equal']}"
        )
    regions = generation["regions"]
    print(
        f"generate regions: {regions['graphed']} graphed, {regions['eager']} eager, "
        f"{regions['split']} split, {regions['pending']} pending: {regions['note']}"
    )


def _print(
    rows: list[dict[str, Any]], ratio: float, summary: dict, diffusers: Any, generation: Any
) -> None:
    for row in rows:
        print(f"{row['row']:<14} {row['ms']:8.3f} ms  bitwise={row['bitwise']}")
    verdict = "PASS" if ratio >= TARGET else "MISS"
    stretch = "PASS" if ratio >= STRETCH else "MISS"
    print(f"whole/regional {ratio:.3f}: target {TARGET} {verdict}, stretch {STRETCH} {stretch}")
    print(f"regions: {summary['graphed']} graphed, split {summary['split']}: {summary['reason']}")
    if isinstance(diffusers, str):
        print(f"diffusers: {diffusers}")
    else:
        for row in diffusers:
            print(f"{row['row']:<14} {row['ms']:8.3f} ms  bitwise={row['bitwise']}")
    _print_generation(generation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="DIR for regions_results.json")
    arguments = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("regions_bench needs a CUDA device")
    rows, summary = _transformer_rows()
    by_name = {row["row"]: row for row in rows}
    ratio = by_name["whole"]["ms"] / by_name["regional"]["ms"]
    diffusers = _diffusers_rows()
    generation = _generation_row()
    _print(rows, ratio, summary, diffusers, generation)
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": rows,
        "ratio": ratio,
        "target": TARGET,
        "target_met": ratio >= TARGET,
        "stretch": STRETCH,
        "stretch_met": ratio >= STRETCH,
        "regions": summary,
        "diffusers": diffusers,
        "generation": generation,
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "regions_results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
