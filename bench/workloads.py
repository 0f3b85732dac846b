"""The workloads every benchmark runs, in one leaf module that imports no other part of bench/ but
the model (dit_model.py), so that the in-process measurements, the torch.compile child process
(compiled.py) and the GPU tests build exactly the same modules and inputs without importing one
another.

Two workloads:

- host cost: `FirstPlusOne` launches one tiny kernel whatever the number K of input tensors, so
  any growth with K is the caller's own work; `Alternating` calls it with two sets of inputs in
  turn, so every call's addresses differ from the last call's;
- the DiT request: nine forwards of the DiT-like denoiser (dit_model.py) at a named size
  (`SIZES`), with a fresh latent and timestep each forward (`request_inputs`), on a model with
  fixed random weights (`build_model`); `rel_err` compares a result with eager's, within
  `BF16_REL_TOL`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from dit_model import DiT, DiTConfig, make_inputs
from torch import nn

__all__ = [
    "BF16_REL_TOL",
    "FORWARDS_PER_REQUEST",
    "SIZES",
    "Alternating",
    "FirstPlusOne",
    "FirstPlusOneReadingExternals",
    "build_model",
    "config_dict",
    "dit_config",
    "rel_err",
    "request_inputs",
]

FORWARDS_PER_REQUEST = 9
SIZES = {
    "big": dict(blocks=24, dim=1024, heads=16, rows=300),
    "small": dict(blocks=4, dim=256, heads=4, rows=64),
}
BF16_REL_TOL = 2e-2


# -- host cost --------------------------------------------------------------------------------


class FirstPlusOne(nn.Module):
    """One tiny kernel whatever the number of inputs: xs[1:] are only carried along."""

    def forward(self, *, xs: list[torch.Tensor]) -> torch.Tensor:
        return xs[0] + 1


class FirstPlusOneReadingExternals(nn.Module):
    """FirstPlusOne that also adds four tensors a plain object holds (zeros: the same result), so
    that each capture has four externals (graphed._inventory) its replays check first."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.holder = type("Holder", (), {})()
        self.holder.tables = tuple(torch.zeros(8, device=device) for _ in range(4))

    def forward(self, *, xs: list[torch.Tensor]) -> torch.Tensor:
        a, b, c, d = self.holder.tables
        return xs[0] + 1 + a + b + c + d


class WeightedFirstPlusOne(nn.Module):
    """FirstPlusOne inside the module tree of a 24-block DiT: 24 blocks of attention (q, k, v and
    out projections), two norms (adaLN's, without weights) and a two-layer MLP, 12 parameters
    each, plus 12 of embedding and head: 300 parameters in 274 submodules, which GraphedForward
    watches before every call
    (graphed._baked). Each is one element, so the forward still launches one tiny kernel; its
    `xs` may be passed positionally."""

    def __init__(self, blocks: int = 24) -> None:
        super().__init__()

        def linear() -> nn.Module:
            return nn.Linear(1, 1)

        self.embed = nn.ModuleList([linear() for _ in range(3)])
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "attn": nn.ModuleList([linear() for _ in range(4)]),
                    "norm1": nn.LayerNorm(1, elementwise_affine=False),
                    "norm2": nn.LayerNorm(1, elementwise_affine=False),
                    "mlp": nn.ModuleList([linear() for _ in range(2)]),
                }
            )
            for _ in range(blocks)
        )
        self.head = nn.ModuleList([linear() for _ in range(3)])

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return xs[0] + 1


def with_lora_adapters(module: nn.Module, rank: int = 16) -> nn.Module:
    """`module` (a WeightedFirstPlusOne) with peft LoRA adapters of `rank` on every attention
    projection (its blocks' `attn` linears, 96 of them), as a served diffusion model with a style
    adapter loaded has: each adds a LoRA layer's modules, tensors and Python state (its scaling
    dict, adapter lists and flags) to what the watch checks. Needs peft."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=r".*\.attn\.\d+")
    return inject_adapter_in_model(config, module)


class Alternating:
    """Calls `forward` with two sets of inputs in turn and holds each output until the call after
    next, so that every call's input and output addresses differ from the last call's (as in a
    loop that keeps its results): the graph's copy tables must be rewritten on every replay. Its
    bound `__call__` adds one Python frame to what it measures."""

    def __init__(self, forward: Callable[..., Any], first: list, second: list) -> None:
        self.forward = forward
        self.inputs = (first, second)
        self.held: list[Any] = [None, None]
        self.turn = 0

    def __call__(self) -> Any:
        turn = self.turn = 1 - self.turn
        self.held[turn] = self.forward(xs=self.inputs[turn])
        return self.held[turn]


# -- the DiT request --------------------------------------------------------------------------


def dit_config(size: str, device: torch.device, dtype: torch.dtype, **overrides: Any) -> DiTConfig:
    return DiTConfig(**{**SIZES[size], **overrides}, dtype=dtype, device=device)


def build_model(cfg: DiTConfig, seed: int = 0) -> DiT:
    """The model with fixed random weights, built directly on its device, for inference."""
    torch.manual_seed(seed)
    device = torch.device(cfg.device)
    with torch.device(device):
        model = DiT(cfg)
    return model.requires_grad_(False).eval()


def request_inputs(
    cfg: DiTConfig, forwards: int = FORWARDS_PER_REQUEST, seed: int = 1
) -> list[dict]:
    """The kwargs of the forwards of one request: a fresh x and timestep per forward (a
    decreasing timestep schedule), one prompt, RoPE table and positions for all of them."""
    generator = torch.Generator().manual_seed(seed)
    shared = make_inputs(cfg, generator=generator)
    calls = []
    for index in range(forwards):
        x = torch.randn(cfg.batch, cfg.rows, cfg.channels, generator=generator)
        timestep = torch.full((cfg.batch,), 1000.0 * (1 - index / forwards))
        calls.append(
            {
                **shared,
                "x": x.to(device=cfg.device, dtype=cfg.dtype),
                "timestep": timestep.to(cfg.device),
            }
        )
    return calls


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The norm of the difference relative to the norm of `expected`, computed in float32."""
    expected = expected.float()
    difference = (actual.float() - expected).norm()
    return (difference / expected.norm().clamp_min(1e-12)).item()


def config_dict(cfg: DiTConfig) -> dict:
    """The sizes of `cfg` as the results record them."""
    return {
        "blocks": cfg.blocks,
        "dim": cfg.dim,
        "heads": cfg.heads,
        "rows": cfg.rows,
        "batch": cfg.batch,
        "channels": cfg.channels,
        "prompt_rows": cfg.prompt_rows,
        "dtype": str(cfg.dtype).removeprefix("torch."),
    }
