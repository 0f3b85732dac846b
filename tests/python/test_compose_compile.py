"""Why this exists: compiled kernels inside the graph, the documented way to get both
(`GraphedForward(torch.compile(m, dynamic=False), ...)`, docs/api.md and docs/benchmarks.md).

graphed replays what the forward launched; over a compiled module that is inductor's fused
kernels, so a large forward keeps compile's per-kernel speed and loses its launch cost. What must
hold: the graphed forward gives what the compiled module gives (bitwise: the same kernels run, the
graph only replays them) and what eager gives (to the tolerance of fused arithmetic), calls bound
positionally as by name, one compile and one capture per shape. On the CPU, inductor's C++ kernels
run inside the emulated backend's capture; on the GPU (marked `gpu`) the DiT of the benchmarks in
bf16 replays bitwise equal to its compiled self over fresh inputs.
"""

from __future__ import annotations

import pytest
import torch
from graphed import GraphedForward


class Mixer(torch.nn.Module):
    """A norm, a gated MLP and a residual: kernels inductor fuses. Takes its input positionally."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        gate, value = self.up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * value) * scale


def _inductor_reason() -> str | None:
    """Why inductor cannot compile on this CPU (no C++ compiler it can use), else None."""
    try:
        torch.compile(lambda t: t * 2 + 1, dynamic=False)(torch.ones(2))
    except Exception as error:  # noqa: BLE001 (any failure means: skip, saying why)
        return f"torch.compile's inductor cannot compile here: {type(error).__name__}: {error}"
    return None


def test_graphed_over_inductor_equals_compiled_and_eager(emulated_backend: str) -> None:
    reason = _inductor_reason()
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(0)
    model = Mixer().eval()
    compiled = torch.compile(model, dynamic=False)
    runner = GraphedForward(compiled, device="cpu", backend=emulated_backend)
    x, scale = torch.randn(4, 16), torch.tensor(0.5)
    with torch.no_grad():
        expected_compiled, expected_eager = compiled(x, scale), model(x, scale)
    out = runner(x, scale)  # the capture: inductor's kernels run in it
    assert torch.equal(out, expected_compiled)
    torch.testing.assert_close(out, expected_eager)
    assert torch.equal(runner(x=x, scale=scale), out)  # keyed as the keywords they bind to
    stats = runner.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, 2, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_graphed_over_compile_replays_bitwise_equal_to_compiled() -> None:
    from dit_model import DiT, DiTConfig, make_inputs, rope_table

    config = DiTConfig(blocks=4, dim=256, heads=4, rows=300, dtype=torch.bfloat16, device="cuda")
    torch.manual_seed(0)
    model = DiT(config).eval()
    compiled = torch.compile(model, dynamic=False)
    runner = GraphedForward(compiled, device="cuda")
    eager_runner = GraphedForward(model, device="cuda")
    rope = rope_table(config)
    for seed in range(4):
        inputs = make_inputs(config, rope=rope, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            expected, eager = compiled(**inputs), model(**inputs)
        assert torch.equal(runner(**inputs), expected)
        assert torch.equal(eager_runner(**inputs), eager)
        torch.testing.assert_close(expected, eager, rtol=2e-2, atol=2e-2)
    for each in (runner, eager_runner):
        stats = each.stats()
        assert stats["enabled"], stats["disabled_reason"]
        # the first call: its last warm-up's outputs
        assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, 3, 0)
