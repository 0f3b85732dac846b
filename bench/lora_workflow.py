"""LoRA adapters switched between calls, through diffusers' and peft's own APIs, on a graphed
diffusers transformer: each step's next calls against calling the model itself, and what the step
cost (captures, the next call's time).

The workflows users run to serve styles: adapters added, weighted, switched, disabled, fused,
deleted, unloaded, loaded back from disk and hot-swapped, on tiny random SD3 and Flux transformers
(no downloads), and peft's own get_peft_model on a plain module. tests/python/test_lora.py asserts
every step on the CPU (emulated backend) and the GPU; run as a script it prints the table of one
device:

    PYTHONPATH=<graphed>:bench python bench/lora_workflow.py [--device cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import graphed
import torch

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def sd3_transformer() -> tuple[torch.nn.Module, Callable[[torch.device], dict]]:
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(
        sample_size=8, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=16,
        pooled_projection_dim=16, out_channels=4,
    )  # fmt: skip

    def inputs(device: torch.device) -> dict:
        generator = torch.Generator().manual_seed(1)
        return {
            "hidden_states": torch.randn(1, 4, 8, 8, generator=generator).to(device),
            "encoder_hidden_states": torch.randn(1, 6, 16, generator=generator).to(device),
            "pooled_projections": torch.randn(1, 16, generator=generator).to(device),
            "timestep": torch.tensor([500.0], device=device),
            "return_dict": False,
        }

    return model, inputs


def flux_transformer() -> tuple[torch.nn.Module, Callable[[torch.device], dict]]:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16,
        axes_dims_rope=(4, 4, 8),
    )  # fmt: skip

    def inputs(device: torch.device) -> dict:
        generator = torch.Generator().manual_seed(1)
        rows, cols = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
        image_ids = torch.stack([torch.zeros(4, 4), rows, cols], dim=-1).reshape(16, 3)
        return {
            "hidden_states": torch.randn(1, 16, 4, generator=generator).to(device),
            "encoder_hidden_states": torch.randn(1, 6, 16, generator=generator).to(device),
            "pooled_projections": torch.randn(1, 16, generator=generator).to(device),
            "timestep": torch.tensor([0.5], device=device),
            "img_ids": image_ids.to(device),
            "txt_ids": torch.zeros(6, 3, device=device),
            "return_dict": False,
        }

    return model, inputs


MODELS = {"sd3": sd3_transformer, "flux": flux_transformer}


def _config(alpha: int, rank: int = 4) -> Any:
    from peft import LoraConfig

    # init_lora_weights=False: B is random too, so that an adapter changes the output.
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=TARGETS, init_lora_weights=False)


@dataclass
class Step:
    """One step of a workflow: `apply(model, saved)` (saved: a folder for adapters on disk) and
    whether it must recapture (False: an in-place update, as hot-swap is, or a return to a state
    the module's graphs were captured in, which replay: graphed._watch.States)."""

    name: str
    apply: Callable[[Any, Path], None]
    recaptures: bool = True


def _save_both(model: Any, saved: Path) -> None:
    model.add_adapter(_config(alpha=8), "a")
    model.add_adapter(_config(alpha=4), "b")
    model.save_lora_adapter(saved / "a", adapter_name="a")
    model.save_lora_adapter(saved / "b", adapter_name="b")


def _load(name: str, adapter: str, hotswap: bool = False) -> Callable[[Any, Path], None]:
    def load(model: Any, saved: Path) -> None:
        model.load_lora_adapter(
            str(saved / name),
            adapter_name=adapter,
            hotswap=hotswap,
            prefix=None,
            use_safetensors=True,
        )

    return load


def _start_hotswap(model: Any, saved: Path) -> None:
    model.enable_lora_hotswap(target_rank=8)
    _load("a", "hot")(model, saved)


DIFFUSERS_STEPS = [
    Step("add_adapter a, b (b active)", _save_both),
    Step("set_adapters([a, b], [0.5, 1.0])", lambda m, _: m.set_adapters(["a", "b"], [0.5, 1.0])),
    Step("set_adapters([a, b], [1.0, 0.25])", lambda m, _: m.set_adapters(["a", "b"], [1.0, 0.25])),
    Step("set_adapters(a, 0.8)", lambda m, _: m.set_adapters("a", 0.8)),
    Step("set_adapter(b)", lambda m, _: m.set_adapter("b")),
    Step("disable_lora()", lambda m, _: m.disable_lora()),
    Step("enable_lora()", lambda m, _: m.enable_lora(), False),  # back to set_adapter(b)
    Step("fuse_lora(lora_scale=0.7)", lambda m, _: m.fuse_lora(lora_scale=0.7)),
    Step("unfuse_lora()", lambda m, _: m.unfuse_lora()),
    Step("set_adapters([a, b], [0.3, 0.6])", lambda m, _: m.set_adapters(["a", "b"], [0.3, 0.6])),
    Step("delete_adapters(b)", lambda m, _: m.delete_adapters("b")),
    Step("unload_lora()", lambda m, _: m.unload_lora()),
    Step("load_lora_adapter(saved a)", _load("a", "a")),
    Step(
        "unload_lora(), enable_lora_hotswap, load a as 'hot'",
        lambda m, saved: (m.unload_lora(), _start_hotswap(m, saved)),
    ),  # fmt: skip
    Step("load_lora_adapter(saved b, hotswap=True)", _load("b", "hot", hotswap=True), False),
]


class TwoLinears(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.to_q = torch.nn.Linear(16, 16)
        self.to_k = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.to_k(torch.relu(self.to_q(x)))


def _peft_model() -> tuple[torch.nn.Module, Callable[[torch.device], dict]]:
    from peft import LoraConfig, get_peft_model

    def config(alpha: int) -> Any:
        return LoraConfig(r=4, lora_alpha=alpha, target_modules=["to_q", "to_k"],
                          init_lora_weights=False)  # fmt: skip

    torch.manual_seed(0)
    model = get_peft_model(TwoLinears(), config(8), adapter_name="a")
    model.add_adapter("b", config(2))

    def inputs(device: torch.device) -> dict:
        return {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(device)}

    return model, inputs


PEFT_STEPS = [
    Step("set_adapter(b)", lambda m, _: m.set_adapter("b")),
    Step("merge_adapter()", lambda m, _: m.merge_adapter()),
    Step("unmerge_adapter()", lambda m, _: m.unmerge_adapter(), False),  # back to set_adapter(b)
    Step("set_adapter(a)", lambda m, _: m.set_adapter("a")),
    Step("disable_adapter() context", lambda m, _: None),  # the context is entered by the run
]


@dataclass
class StepResult:
    step: str
    bitwise: bool
    largest_difference: float
    captures: int  # captures the step caused (its next two calls)
    expected_recapture: bool
    next_call_ms: float  # the first call after the step (its capture, if any)


def _largest_difference(got: Any, want: Any) -> float:
    got, want = (
        got[0] if isinstance(got, tuple) else got,
        want[0] if isinstance(want, tuple) else want,
    )
    return float((got.double() - want.double()).abs().max())


def _equal(got: Any, want: Any) -> bool:
    got, want = (
        got[0] if isinstance(got, tuple) else got,
        want[0] if isinstance(want, tuple) else want,
    )
    return torch.equal(got, want)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_workflow(family: str, device: torch.device, backend: str | None = None) -> list[StepResult]:
    """Each step of `family`'s workflow ("sd3", "flux" or "peft") on a fresh model graphed for
    `device`: two graphed calls after the step against the model's own."""
    model, make_inputs = _peft_model() if family == "peft" else MODELS[family]()
    steps = PEFT_STEPS if family == "peft" else DIFFUSERS_STEPS
    model = model.to(device).eval()
    inputs = make_inputs(device)
    runner = graphed.GraphedForward(model, device=device, backend=backend, name=f"lora-{family}")
    results = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        for _ in range(3):
            runner(**inputs)
        for step in steps:
            step.apply(model, Path(folder))
            context = model.disable_adapter() if step.name.startswith("disable_adapter") else None
            with context if context is not None else contextlib.nullcontext():
                captures = runner.stats()["captures"]
                want = model(**inputs)
                _synchronize(device)
                start = time.perf_counter()
                got = runner(**inputs)
                _synchronize(device)
                next_call_ms = (time.perf_counter() - start) * 1e3
                again = runner(**inputs)
            results.append(
                StepResult(
                    step.name,
                    _equal(got, want) and _equal(again, want),
                    max(_largest_difference(got, want), _largest_difference(again, want)),
                    runner.stats()["captures"] - captures,
                    step.recaptures,
                    next_call_ms,
                )
            )
    if not runner.stats()["enabled"]:
        raise RuntimeError(f"{runner.name}: disabled: {runner.stats()['disabled_reason']}")
    return results


ROTATION = [
    ("a", lambda m: (m.enable_lora(), m.set_adapters("a"))),
    ("a 0.5, b 1.0", lambda m: (m.enable_lora(), m.set_adapters(["a", "b"], [0.5, 1.0]))),
    ("disabled", lambda m: m.disable_lora()),
]


@dataclass
class RotationResult:
    """A multi-tenant rotation: one adapter state per request, ROTATION's three states in turn."""

    requests: int
    bitwise: bool  # every call equal to the model's own output
    captures_in_first_rotation: int
    captures_after_first_rotation: int
    graphs: int
    first_call_us: float  # median host time of a request's first call, after the first rotation
    replay_us: float  # median host time of the other calls
    reserved_ratio: float  # reserved device memory at the end / after the first rotation


def run_rotation(
    device: torch.device, requests: int = 24, calls: int = 3, backend: str | None = None
) -> RotationResult:
    """`requests` requests of `calls` calls on the SD3 transformer with two adapters, each request
    switching to the next of ROTATION's states first; every call has new latents and is compared
    with the model's own output. Host times are the graphed call's wall time with the device idle
    before it (a tiny model: the call returns before its work ends)."""
    model, make_inputs = sd3_transformer()
    model = model.to(device).eval()
    with tempfile.TemporaryDirectory() as folder:
        _save_both(model, Path(folder))
    inputs = make_inputs(device)
    runner = graphed.GraphedForward(model, device=device, backend=backend, name="lora-rotation")
    generator = torch.Generator(device=device).manual_seed(2)
    bitwise, first_calls, replays = True, [], []
    captures_after_first = reserved_after_first = 0
    with torch.no_grad():
        for request in range(requests):
            if request == len(ROTATION):
                captures_after_first = runner.stats()["captures"]
                reserved_after_first = _reserved(device)
            ROTATION[request % len(ROTATION)][1](model)
            for call in range(calls):
                latents = torch.randn(inputs["hidden_states"].shape, generator=generator,
                                      device=device)  # fmt: skip
                kwargs = {**inputs, "hidden_states": latents}
                want = model(**kwargs)
                _synchronize(device)
                start = time.perf_counter()
                got = runner(**kwargs)
                elapsed_us = (time.perf_counter() - start) * 1e6
                bitwise = bitwise and _equal(got, want)
                if request >= len(ROTATION):
                    (first_calls if call == 0 else replays).append(elapsed_us)
    stats = runner.stats()
    if not stats["enabled"]:
        raise RuntimeError(f"{runner.name}: disabled: {stats['disabled_reason']}")
    return RotationResult(
        requests,
        bitwise,
        captures_after_first,
        stats["captures"] - captures_after_first,
        stats["graphs"],
        statistics.median(first_calls),
        statistics.median(replays),
        _reserved(device) / reserved_after_first if reserved_after_first else 1.0,
    )


def _reserved(device: torch.device) -> int:
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}")
    for family in ("sd3", "flux", "peft"):
        print(f"\n{family}: | step | bitwise | largest diff | captures | next call ms |")
        for r in run_workflow(family, device):
            print(f"| {r.step} | {r.bitwise} | {r.largest_difference:.3g} | {r.captures} | "
                  f"{r.next_call_ms:.2f} |")  # fmt: skip
    r = run_rotation(device)
    first_over_replay = r.first_call_us / r.replay_us
    first_verdict = "PASS" if first_over_replay <= 2 else "FAIL"
    print(f"\nrotation of {len(ROTATION)} adapter states over {r.requests} requests: bitwise "
          f"{r.bitwise}, captures {r.captures_in_first_rotation} in the first rotation and "
          f"{r.captures_after_first_rotation} after it (target 0), graphs {r.graphs}; a request's "
          f"first call {r.first_call_us:.1f} us against a replay's {r.replay_us:.1f} us: "
          f"{first_over_replay:.2f}x (target <= 2x: {first_verdict}); "
          f"reserved at the end {r.reserved_ratio:.2f}x that after the first rotation "
          f"(target <= 1.5x: {'PASS' if r.reserved_ratio <= 1.5 else 'FAIL'})")  # fmt: skip


if __name__ == "__main__":
    main()
