"""The real audio DiT in the benchmark: the Stable Audio Open transformer (diffusers'
StableAudioDiTModel() default configuration: 24 blocks, 24 heads of 64; random weights, bf16) in a
faithful copy of StableAudioPipeline's denoising loop: nine steps, classifier-free guidance (batch
2), the latents and the timestep passed positionally, the rotary embedding made on the CPU by
get_1d_rotary_pos_embed each request, as the pipeline passes it (the model moves it itself).

Per request, at 108 latent frames (a five-second request) and 1024 (what the pipeline always
uses): wall ms for eager, GraphedForward (cpu_inputs="to_device"), torch.compile
mode="reduce-overhead", GraphedForward over torch.compile(dynamic=False) and GraphedForward over
regional compilation (each of the 24 blocks compiled in place, fullgraph, on a copy of the model:
the model declares no repeated blocks for diffusers' compile_repeated_blocks); the first request's
seconds (capture, compile); and bitwise checks: GraphedForward against eager, GraphedForward over
compile against the compiled module it wraps. Target: graphed over regional compile <= 0.95x
reduce-overhead's time a request (TARGET_VS_REDUCE_OVERHEAD). It needs CUDA and diffusers; run.py
runs it as a section, or alone:

    PYTHONPATH=python:bench python bench/audio_pipeline.py --out DIR [--quick] [--no-compile]

which writes DIR/audio_pipeline.json, DIR/audio_pipeline.md and DIR/audio_pipeline.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotting
import torch

__all__ = [
    "AUDIO_METHODS",
    "FRAMES",
    "ROUNDS",
    "audio_table",
    "run_audio_pipeline",
    "write_audio_plot",
]

AUDIO_METHODS = {
    "eager": "eager",
    "graphed": "GraphedForward",
    "compile": "torch.compile reduce-overhead",
    "graphed_compile": "GraphedForward over torch.compile (dynamic=False)",
    "graphed_regional": "GraphedForward over regional compile",
}
TARGET_VS_REDUCE_OVERHEAD = 0.95
FRAMES = {"full": [108, 1024], "quick": [108]}
ROUNDS = {"full": 20, "quick": 5}
STEPS = 9
TEXT_ROWS = 128  # the T5 prompt rows Stable Audio Open pads to; the two duration rows follow
GUIDANCE = 7.0
DEVICE = "cuda"


def _model() -> Any:
    from diffusers import StableAudioDiTModel

    torch.manual_seed(0)
    return StableAudioDiTModel().to(DEVICE, torch.bfloat16).eval()


def _request_inputs(model: Any, frames: int) -> dict:
    """One request's conditioning, as the pipeline builds it before its loop (CFG: unconditional
    rows first), and its initial noise."""
    config = model.config
    generator = torch.Generator("cpu").manual_seed(frames)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(DEVICE, torch.bfloat16)

    text = randn(1, TEXT_ROWS + 2, config.cross_attention_input_dim)
    duration = randn(1, 1, config.global_states_input_dim)
    return {
        "latents": randn(1, config.in_channels, frames),
        "encoder_hidden_states": torch.cat([torch.zeros_like(text), text]),
        "global_hidden_states": torch.cat([duration, duration]),
    }


def _request(transformer: Callable[..., Any], model: Any, inputs: dict) -> torch.Tensor:
    """StableAudioPipeline's loop around its transformer call, with a plain Euler update in place
    of its scheduler (the same host work for every method)."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    latents = inputs["latents"]
    global_states = inputs["global_hidden_states"]
    rotary_embedding = get_1d_rotary_pos_embed(
        model.config.attention_head_dim // 2,
        latents.shape[2] + global_states.shape[1],
        use_real=True,
        repeat_interleave_real=False,
    )
    timesteps = torch.linspace(1.0, 0.0, STEPS + 1, device=DEVICE)
    with torch.no_grad():
        for t, t_next in zip(timesteps[:-1], timesteps[1:], strict=True):
            noise_pred = transformer(
                torch.cat([latents] * 2),
                t.unsqueeze(0),
                encoder_hidden_states=inputs["encoder_hidden_states"],
                global_hidden_states=global_states,
                rotary_embedding=rotary_embedding,
                return_dict=False,
            )[0]
            uncond, text = noise_pred.chunk(2)
            latents = latents + (t_next - t) * (uncond + GUIDANCE * (text - uncond))
    return latents


def _methods(model: Any, with_compile: bool) -> dict[str, tuple[Callable[..., Any], Any]]:
    """Each method's transformer, with the module a bitwise check compares it to (None: none)."""
    import graphed

    methods: dict[str, tuple[Callable[..., Any], Any]] = {
        "eager": (model, None),
        "graphed": (graphed.GraphedForward(model, device=DEVICE, cpu_inputs="to_device"), model),
    }
    if with_compile:
        compiled = torch.compile(model, dynamic=False)
        methods["compile"] = (torch.compile(model, mode="reduce-overhead", dynamic=False), None)
        methods["graphed_compile"] = (
            graphed.GraphedForward(compiled, device=DEVICE, cpu_inputs="to_device"),
            compiled,
        )
        regional = _regionally_compiled(model)
        methods["graphed_regional"] = (
            graphed.GraphedForward(regional, device=DEVICE, cpu_inputs="to_device"),
            regional,
        )
    return methods


def _regionally_compiled(model: Any) -> Any:
    """A copy of the model with each transformer block compiled in place, as regional compilation
    does (one compile serves the 24 blocks of one code)."""
    import copy

    regional = copy.deepcopy(model)
    for block in regional.transformer_blocks:
        block.compile(fullgraph=True, dynamic=False)
    return regional


def run_audio_pipeline(
    frames_list: list[int], *, rounds: int, with_compile: bool = True, log: Callable = print
) -> dict:
    """The figures of every method at every size: request_ms (median wall, p10, p90),
    first_request_s, and bitwise (True/False against the module it wraps) or rel_err vs eager."""
    from timing import choose_host_clock, wall_ms_interleaved

    model = _model()
    results: dict[str, Any] = {"labels": AUDIO_METHODS, "steps": STEPS, "frames": {}}
    for frames in frames_list:
        inputs = _request_inputs(model, frames)
        eager_out = _request(model, model, inputs)
        entry: dict[str, Any] = {"methods": {}}
        timed: dict[str, Callable[[], object]] = {}
        for name, (transformer, reference) in _methods(model, with_compile).items():
            torch.cuda.synchronize()
            started = time.perf_counter()
            out = _request(transformer, model, inputs)
            torch.cuda.synchronize()
            figures: dict[str, Any] = {"first_request_s": time.perf_counter() - started}
            error = (out.float() - eager_out.float()).norm() / eager_out.float().norm()
            figures["rel_err_vs_eager"] = float(error)
            if reference is not None:
                figures["bitwise"] = bool(torch.equal(out, _request(reference, model, inputs)))
            entry["methods"][name] = figures
            timed[name] = lambda fn=transformer, given=inputs: _request(fn, model, given)
            log(f"  {frames} frames, {AUDIO_METHODS[name]}: first request {figures}")
        walls = wall_ms_interleaved(
            timed, torch.cuda.synchronize, choose_host_clock(), rounds=rounds, warmup_rounds=1
        )
        for name, wall in walls.items():
            entry["methods"][name]["request_ms"] = wall["wall_ms"]
        results["frames"][str(frames)] = entry
    return results


def audio_table(results: dict) -> list[str]:
    """The markdown table: one row a size, per-request ms (and the first request's s) a method."""
    labels = results["labels"]
    header = "| latent frames | " + " | ".join(labels.values()) + " |"
    lines = [header, "|---" * (len(labels) + 1) + "|"]
    for frames, entry in results["frames"].items():
        cells = []
        for name in labels:
            figures = entry["methods"].get(name)
            if figures is None or "request_ms" not in figures:
                cells.append("-")
                continue
            check = {True: ", bitwise", False: ", NOT BITWISE"}.get(figures.get("bitwise"), "")
            cells.append(
                f"{figures['request_ms']['median']:.1f} ms "
                f"(first {figures['first_request_s']:.2f} s{check})"
            )
        lines.append(f"| {frames} | " + " | ".join(cells) + " |")
    for frames, entry in results["frames"].items():
        ms = {
            name: figures.get("request_ms", {}).get("median")
            for name, figures in entry["methods"].items()
        }
        if ms.get("compile") and ms.get("graphed_regional"):
            ratio = ms["graphed_regional"] / ms["compile"]
            verdict = "PASS" if ratio <= TARGET_VS_REDUCE_OVERHEAD else "MISS"
            lines.append("")  # the table ends here
            lines.append(
                f"{frames} frames: graphed over regional compile / reduce-overhead {ratio:.3f}x "
                f"{verdict} (target {TARGET_VS_REDUCE_OVERHEAD}x)"
            )
    return lines


def write_audio_plot(results: dict, out_dir: Path) -> tuple[Path | None, str]:
    """Bars of per-request ms, a group per size; returns (path, '') or (None, why not drawn)."""
    if not results.get("frames"):
        return None, "no audio-pipeline figures in this run"
    plt, why = plotting.pyplot()
    if plt is None:
        return None, why
    labels = results["labels"]
    sizes = list(results["frames"])
    width = 0.8 / len(labels)
    figure, axes = plt.subplots(figsize=(9, 5))
    for index, (name, label) in enumerate(labels.items()):
        values = [
            results["frames"][size]["methods"].get(name, {}).get("request_ms", {}).get("median", 0)
            for size in sizes
        ]
        positions = [slot + index * width for slot in range(len(sizes))]
        axes.bar(positions, values, width, label=label)
    axes.set_xticks([slot + width * (len(labels) - 1) / 2 for slot in range(len(sizes))])
    axes.set_xticklabels([f"{size} latent frames" for size in sizes])
    axes.set_ylabel(f"ms per request ({results['steps']} steps, CFG batch 2)")
    axes.set_title("Stable Audio Open DiT in StableAudioPipeline's loop, bf16")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    return plotting.save(plt, figure, out_dir / "audio_pipeline.png")


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Stable Audio Open DiT benchmark (see its doc)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--quick", action="store_true", help="108 latent frames only, 5 rounds")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if not torch.cuda.is_available():
        print("audio_pipeline: needs a CUDA device; nothing measured", flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    size = "quick" if args.quick else "full"
    results = run_audio_pipeline(
        FRAMES[size],
        rounds=ROUNDS[size],
        with_compile=not args.no_compile,
    )
    (args.out / "audio_pipeline.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "audio_pipeline.md").write_text("\n".join(audio_table(results)) + "\n")
    plot, why = write_audio_plot(results, args.out)
    print("\n".join(audio_table(results)), flush=True)
    print(f"plot: {plot}" if plot is not None else f"no plot: {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
