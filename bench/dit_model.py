"""A small DiT-like transformer: the shared workload of the graphed demo, benchmark and GPU tests.

It exists so that every measurement and GPU test of graphed runs the kind of forward graphed is
for: a diffusion transformer step at small batch, where each forward is dozens of short kernels
(adaLN timestep modulation, RoPE self-attention, prompt cross-attention, MLP) and the launch cost
dominates. Its forward is keyword-only and takes what real pipelines pass: a tensor timestep, a
prompt embedding, a RoPE table as a dict {"cos", "sin"}, token positions and an optional
reference tail (extra tokens appended to the sequence), so graphed's keying of nested and
optional kwargs is exercised too. Sizes, dtype and device are configurable (`DiTConfig`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DiT", "DiTConfig", "make_inputs", "rope_table"]


@dataclass
class DiTConfig:
    """Sizes of the model and of one call's inputs."""

    blocks: int = 4
    dim: int = 256
    heads: int = 4
    rows: int = 64  # latent tokens per sample
    channels: int = 16  # latent channels per token (input and output width)
    prompt_rows: int = 16  # prompt tokens per sample
    prompt_dim: int = 128
    mlp_ratio: float = 4.0
    max_positions: int = 4096  # rows of the RoPE table
    batch: int = 1
    dtype: torch.dtype = torch.float32
    device: torch.device | str = field(default="cpu")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def __post_init__(self) -> None:
        if self.dim % self.heads or self.head_dim % 2:
            raise ValueError(f"dim {self.dim} must split into {self.heads} heads of even size")


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates pairs of channels of x (batch, heads, tokens, head_dim) by per-token angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2)


class TimestepEmbedding(nn.Module):
    """Sinusoidal features of a (batch,) timestep tensor, then a two-layer MLP."""

    def __init__(self, dim: int, features: int = 256) -> None:
        super().__init__()
        half = features // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(features, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, timestep: torch.Tensor) -> torch.Tensor:
        angles = timestep.float().unsqueeze(-1) * self.freqs.float()
        features = torch.cat((angles.cos(), angles.sin()), dim=-1)
        return self.mlp(features.to(self.mlp[0].weight.dtype))


class DiTBlock(nn.Module):
    """adaLN-Zero block: modulated RoPE self-attention, prompt cross-attention, modulated MLP."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        dim = cfg.dim
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_out = nn.Linear(dim, dim)
        self.norm_cross = nn.LayerNorm(dim, eps=1e-6)
        self.cross_q = nn.Linear(dim, dim)
        self.cross_kv = nn.Linear(dim, 2 * dim)
        self.cross_out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * cfg.mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim)
        )
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        return x.view(batch, tokens, self.heads, dim // self.heads).transpose(1, 2)

    @staticmethod
    def _merge_heads(x: torch.Tensor) -> torch.Tensor:
        batch, heads, tokens, head_dim = x.shape
        return x.transpose(1, 2).reshape(batch, tokens, heads * head_dim)

    def forward(
        self,
        h: torch.Tensor,
        cond: torch.Tensor,
        prompt: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(cond).chunk(6, dim=-1)

        q, k, v = self.qkv(_modulate(self.norm1(h), shift1, scale1)).chunk(3, dim=-1)
        q = _apply_rope(self._split_heads(q), cos, sin)
        k = _apply_rope(self._split_heads(k), cos, sin)
        attn = F.scaled_dot_product_attention(q, k, self._split_heads(v))
        h = h + gate1.unsqueeze(1) * self.attn_out(self._merge_heads(attn))

        q = self._split_heads(self.cross_q(self.norm_cross(h)))
        k, v = self.cross_kv(prompt).chunk(2, dim=-1)
        cross = F.scaled_dot_product_attention(q, self._split_heads(k), self._split_heads(v))
        h = h + self.cross_out(self._merge_heads(cross))

        mlp = self.mlp(_modulate(self.norm2(h), shift2, scale2))
        return h + gate2.unsqueeze(1) * mlp


class DiT(nn.Module):
    """Patch tokens in, denoising prediction out, conditioned on timestep and prompt."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(cfg.channels, cfg.dim)
        self.time = TimestepEmbedding(cfg.dim)
        self.prompt_proj = nn.Sequential(
            nn.Linear(cfg.prompt_dim, cfg.dim),
            nn.GELU(approximate="tanh"),
            nn.Linear(cfg.dim, cfg.dim),
        )
        self.prompt_pool = nn.Linear(cfg.dim, cfg.dim)
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.blocks))
        self.final_norm = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(cfg.dim, 2 * cfg.dim))
        self.final = nn.Linear(cfg.dim, cfg.channels)
        self.to(device=cfg.device, dtype=cfg.dtype)
        self.eval()

    def forward(
        self,
        *,
        x: torch.Tensor,
        timestep: torch.Tensor,
        prompt_emb: torch.Tensor,
        rope: dict[str, torch.Tensor],
        positions: torch.Tensor,
        ref_tail: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (batch, rows, channels); timestep (batch,); prompt_emb (batch, prompt_rows,
        prompt_dim); rope {"cos", "sin"} (max_positions, head_dim // 2); positions (tokens,)
        indices into the RoPE table for the rows of x followed by those of ref_tail; ref_tail
        (batch, tail_rows, channels) or None. Returns (batch, rows, channels)."""
        rows = x.shape[1]
        tokens = x if ref_tail is None else torch.cat((x, ref_tail), dim=1)
        if positions.shape[0] != tokens.shape[1]:
            raise ValueError(f"{positions.shape[0]} positions for {tokens.shape[1]} tokens")
        cos = rope["cos"].index_select(0, positions)
        sin = rope["sin"].index_select(0, positions)

        h = self.embed(tokens)
        prompt = self.prompt_proj(prompt_emb)
        cond = self.time(timestep) + self.prompt_pool(prompt.mean(dim=1))
        for block in self.blocks:
            h = block(h, cond, prompt, cos, sin)

        shift, scale = self.final_modulation(cond).chunk(2, dim=-1)
        out = self.final(_modulate(self.final_norm(h), shift, scale))
        return out[:, :rows]


def rope_table(cfg: DiTConfig, base: float = 10000.0) -> dict[str, torch.Tensor]:
    """The RoPE table as the model takes it: {"cos", "sin"}, each (max_positions, head_dim // 2)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / base ** (torch.arange(half, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(cfg.max_positions, dtype=torch.float32), inv_freq)
    return {
        "cos": angles.cos().to(device=cfg.device, dtype=cfg.dtype),
        "sin": angles.sin().to(device=cfg.device, dtype=cfg.dtype),
    }


def make_inputs(
    cfg: DiTConfig,
    *,
    ref_tail_rows: int = 0,
    rope: dict[str, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> dict:
    """Random kwargs for one forward of `DiT(cfg)`; pass `rope` to share one table across calls."""

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=cfg.device, dtype=cfg.dtype)

    tokens = cfg.rows + ref_tail_rows
    return {
        "x": randn(cfg.batch, cfg.rows, cfg.channels),
        "timestep": (torch.rand(cfg.batch, generator=generator) * 1000).to(cfg.device),
        "prompt_emb": randn(cfg.batch, cfg.prompt_rows, cfg.prompt_dim),
        "rope": rope if rope is not None else rope_table(cfg),
        "positions": torch.arange(tokens, device=cfg.device),
        "ref_tail": randn(cfg.batch, ref_tail_rows, cfg.channels) if ref_tail_rows else None,
    }
