"""A sequence-parallel DiT: the workload of graphed's process-group tests and benchmark.

It exists because graphed's `group=` is for exactly this kind of forward: each rank of a
sequence-parallel group holds a slice of the tokens, and every block trades slices for heads
around attention (Ulysses-style all-to-alls) before an all-gather returns the whole sequence. A
capture records those collectives and a replay runs them, so the ranks must stay in step through
every probe, warm-up and capture. Without a group (or with a group of one) the same model runs on
one device, which gives the single-GPU DiT of the same size to compare with.

The forward is `forward(*, x, t)`: x is this rank's slice of the latent tokens (batch, rows /
world, channels), t the timestep (batch,); it returns every rank's tokens (batch, rows, channels).
`enter`, `blocks` and `leave` are its three steps, so that a test can put a fault between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["SPConfig", "SequenceParallelDiT", "make_sp_inputs"]


@dataclass
class SPConfig:
    """Sizes of the model and of one call's inputs (rows: the whole sequence)."""

    blocks: int = 4
    dim: int = 256
    heads: int = 4
    rows: int = 256
    channels: int = 16
    batch: int = 1
    mlp_ratio: float = 4.0
    dtype: torch.dtype = torch.float32
    device: torch.device | str = field(default="cpu")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class _Ulysses:
    """The two all-to-alls around attention over `group` (identity for a group of one)."""

    def __init__(self, group, world: int) -> None:
        self.group = group
        self.world = world

    def seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, rows/world, heads, hd) -> (batch, rows, heads/world, hd)."""
        if self.world == 1:
            return x
        batch, rows, heads, head_dim = x.shape
        parts = x.reshape(batch, rows, self.world, heads // self.world, head_dim)
        send = parts.permute(2, 0, 1, 3, 4).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=self.group)
        # received[j] holds rank j's rows of this rank's heads: rows in rank order.
        return received.permute(1, 0, 2, 3, 4).reshape(
            batch, self.world * rows, heads // self.world, head_dim
        )

    def heads_to_seq(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, rows, heads/world, hd) -> (batch, rows/world, heads, hd)."""
        if self.world == 1:
            return x
        batch, rows, heads, head_dim = x.shape
        local = rows // self.world
        send = x.reshape(batch, self.world, local, heads, head_dim).permute(1, 0, 2, 3, 4)
        send = send.contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=self.group)
        # received[j] holds this rank's rows of rank j's heads: heads in rank order.
        return received.permute(1, 2, 0, 3, 4).reshape(batch, local, self.world * heads, head_dim)


class _Block(nn.Module):
    def __init__(self, config: SPConfig, ulysses: _Ulysses) -> None:
        super().__init__()
        dim = config.dim
        self.heads = config.heads
        self.ulysses = ulysses
        self.modulation = nn.Linear(dim, 6 * dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        hidden = int(dim * config.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"))
        self.mlp_out = nn.Linear(hidden, dim)

    def forward(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(cond).chunk(6, dim=-1)
        x = F.layer_norm(h, h.shape[-1:]) * (1 + scale1.unsqueeze(1)) + shift1.unsqueeze(1)
        batch, rows, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, rows, 3, self.heads, dim // self.heads).unbind(2)
        q, k, v = (self.ulysses.seq_to_heads(t).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        attended = self.ulysses.heads_to_seq(attended).reshape(batch, rows, dim)
        h = h + gate1.unsqueeze(1) * self.proj(attended)
        x = F.layer_norm(h, h.shape[-1:]) * (1 + scale2.unsqueeze(1)) + shift2.unsqueeze(1)
        return h + gate2.unsqueeze(1) * self.mlp_out(self.mlp(x))


class SequenceParallelDiT(nn.Module):
    """The DiT over `group` (None: one device, the whole sequence)."""

    def __init__(self, config: SPConfig, group=None) -> None:
        super().__init__()
        self.config = config
        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        if config.heads % self.world or config.rows % self.world:
            raise ValueError(f"heads and rows must split over {self.world} ranks")
        ulysses = _Ulysses(group, self.world)
        dim = config.dim
        self.embed = nn.Linear(config.channels, dim)
        self.time = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(_Block(config, ulysses) for _ in range(config.blocks))
        self.out = nn.Linear(dim, config.channels)
        frequencies = torch.exp(-math.log(10000.0) * torch.arange(dim // 2) / (dim // 2))
        self.register_buffer("frequencies", frequencies, persistent=False)

    def enter(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = t.float().unsqueeze(-1) * self.frequencies
        cond = self.time(torch.cat((angles.cos(), angles.sin()), dim=-1).to(x.dtype))
        return self.embed(x), cond

    def leave(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        local = self.out(F.layer_norm(h, h.shape[-1:]))
        if self.world == 1:
            return local
        batch, rows, channels = local.shape
        gathered = local.new_empty((self.world * batch, rows, channels))
        dist.all_gather_into_tensor(gathered, local.contiguous(), group=self.group)
        gathered = gathered.reshape(self.world, batch, rows, channels)
        return gathered.permute(1, 0, 2, 3).reshape(batch, self.world * rows, channels)

    def forward(self, *, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h, cond = self.enter(x, t)
        for block in self.blocks:
            h = block(h, cond)
        return self.leave(h, cond)


def make_sp_inputs(
    config: SPConfig, world: int, rank: int, call: int, rows: int | None = None
) -> dict:
    """Call number `call`'s kwargs for `rank` of a group of `world`: its own slice of tokens, the
    timestep every rank shares."""
    generator = torch.Generator().manual_seed(1000 * call + rank)
    local = (rows or config.rows) // world
    x = torch.randn(config.batch, local, config.channels, generator=generator)
    t = torch.full((config.batch,), 100.0 * (call % 9 + 1))
    return {
        "x": x.to(device=config.device, dtype=config.dtype),
        "t": t.to(device=config.device),
    }
