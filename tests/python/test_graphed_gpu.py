"""GPU tests of GraphedForward: captured CUDA graphs replayed for a DiT-like denoiser.

graphed exists to replay the forward of a diffusion transformer as one graph launch per call,
with fresh per-request tensors copied into static buffers. These tests check the promises that
matter to such a serving loop on a real device: replays match eager within bf16 tolerance (also
at the target size, 24 blocks of width 1024 over 300 rows), per-request values never re-capture
while new shapes do, the LRU keeps pinned graphs, outputs stay valid (or share storage when
asked), random numbers advance across replays, a synchronizing forward falls back to eager, an
outer capture is respected, and the launches per replay do not grow with the number of inputs.

They skip on machines without CUDA. The model is the DiT the demo and the benchmarks run
(bench/dit_model.py, which conftest.py puts on sys.path), so the tests and the measurements
exercise the same forward, and they compare with eager by the benchmark's measure
(bench/workloads.py's rel_err and BF16_REL_TOL).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import types
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from dit_model import DiT, DiTConfig
from dit_model import make_inputs as dit_inputs
from graphed import GraphedForward
from torch import nn
from workloads import BF16_REL_TOL, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


# -- the DiT the demo and the benchmarks run (bench/dit_model.py), at two sizes, in bf16 --------


SMALL = DiTConfig(
    blocks=2,
    dim=128,
    heads=4,
    channels=16,
    prompt_rows=8,
    prompt_dim=64,
    max_positions=128,
    dtype=torch.bfloat16,
    device="cuda",
)
TARGET = DiTConfig(
    blocks=24,
    dim=1024,
    heads=16,
    channels=64,
    prompt_rows=32,
    prompt_dim=512,
    max_positions=1024,
    dtype=torch.bfloat16,
    device="cuda",
)


def make_model(config: DiTConfig, seed: int = 0) -> DiT:
    """The model on the config's device and dtype, in eval mode, with seeded weights."""
    torch.manual_seed(seed)
    return DiT(config)


def make_inputs(config: DiTConfig, rows: int, tail_rows: int = 0) -> dict:
    """Fresh random per-request tensors: every call of a test gets new values, including the RoPE
    table and the positions into it, so a replay that kept any stale input would show."""
    angles = torch.rand(config.max_positions, config.head_dim // 2, device=config.device)
    angles = angles * (2 * math.pi)
    rope = {"cos": torch.cos(angles).to(config.dtype), "sin": torch.sin(angles).to(config.dtype)}
    kwargs = dit_inputs(replace(config, rows=rows), ref_tail_rows=tail_rows, rope=rope)
    kwargs["positions"] = torch.randperm(config.max_positions, device=config.device)[
        : rows + tail_rows
    ]
    if kwargs["ref_tail"] is None:
        del kwargs["ref_tail"]  # a request without a reference image does not pass one
    return kwargs


def eager(model: nn.Module, kwargs: dict):
    with torch.no_grad():
        return model(**kwargs)


def assert_matches_eager(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    assert torch.isfinite(expected).all()
    error = rel_err(actual, expected)
    assert error < BF16_REL_TOL, f"relative norm error {error:.3e} vs eager"


@pytest.fixture(scope="module")
def small_model() -> DiT:
    return make_model(SMALL)


# -- correctness and keying ------------------------------------------------------------------


def test_target_size_replays_match_eager():
    """The correctness target: 24 blocks, width 1024, 300 rows, bf16, fresh inputs per call."""
    model = make_model(TARGET)
    gf = GraphedForward(model, device="cuda", name="dit_target")
    previous_reference = None
    for call in range(1, 5):
        kwargs = make_inputs(TARGET, rows=300)
        out = gf(**kwargs)
        reference = eager(model, kwargs)
        assert out.shape == (1, 300, TARGET.channels)
        assert_matches_eager(out, reference)
        if previous_reference is not None:
            # Different requests give clearly different outputs, so a stale replay would fail.
            assert rel_err(reference, previous_reference) > 10 * BF16_REL_TOL
        previous_reference = reference
        stats = gf.stats()
        assert stats["enabled"], stats["disabled_reason"]
        assert stats["backend"] == "cuda"
        assert stats["captures"] == 1
        assert stats["replays"] == call - 1  # the first call: its last warm-up's outputs
        assert stats["eager_calls"] == 0
    assert gf.stats()["pool_bytes"] > 0


def test_new_values_never_recapture(small_model):
    gf = GraphedForward(small_model, device="cuda")
    for call in range(1, 7):
        kwargs = make_inputs(SMALL, rows=24, tail_rows=8)
        assert_matches_eager(gf(**kwargs), eager(small_model, kwargs))
        stats = gf.stats()
        assert stats["captures"] == 1
        assert stats["replays"] == call - 1  # the first call: its last warm-up's outputs
        assert stats["graphs"] == 1
        assert stats["eager_calls"] == 0


def test_the_same_tensors_written_in_place_between_calls_replay_their_new_values(small_model):
    """A replay rewrites its graph's copy tables only when the addresses changed. With the same
    input tensors the input table is the one already in the graph, and the copies must still run
    on every replay and see the values written since; a call with one new tensor, and the call
    after it with the old one again, rewrite it."""
    gf = GraphedForward(small_model, device="cuda")
    kwargs = make_inputs(SMALL, rows=24, tail_rows=8)
    for call in range(1, 6):
        with torch.no_grad():
            kwargs["x"].normal_()
            kwargs["timestep"].fill_(100.0 * call)
        assert_matches_eager(gf(**kwargs), eager(small_model, kwargs))
        if call == 3:
            fresh = make_inputs(SMALL, rows=24, tail_rows=8)
            assert_matches_eager(
                gf(**{**kwargs, "x": fresh["x"]}), eager(small_model, {**kwargs, "x": fresh["x"]})
            )
    stats = gf.stats()
    # the first call: its last warm-up's outputs
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, 5, 0)


def test_new_row_count_or_tail_presence_captures_a_new_graph(small_model):
    # churn_limit=0: three new keys come in a row, and each must capture at first sight.
    gf = GraphedForward(small_model, device="cuda", max_entries=8, churn_limit=0)
    plan = [
        ((24, 0), 1),
        ((24, 0), 1),
        ((16, 0), 2),  # new row count
        ((24, 8), 3),  # tail present
        ((24, 4), 4),  # tail of another length
        ((24, 0), 4),
        ((16, 0), 4),
        ((24, 8), 4),
        ((24, 4), 4),
    ]
    for call, ((rows, tail_rows), captures) in enumerate(plan, start=1):
        kwargs = make_inputs(SMALL, rows=rows, tail_rows=tail_rows)
        out = gf(**kwargs)
        assert out.shape == (1, rows, SMALL.channels)
        assert_matches_eager(out, eager(small_model, kwargs))
        stats = gf.stats()
        assert stats["captures"] == captures, (call, rows, tail_rows, stats)
        assert stats["replays"] == call - captures  # a capturing call replays nothing
    assert gf.stats()["graphs"] == 4
    assert gf.stats()["evictions"] == 0


def test_eviction_keeps_the_pinned_entry(small_model):
    # Three new shapes in a row would start the churn guard; this test is about eviction.
    gf = GraphedForward(small_model, device="cuda", max_entries=2, churn_limit=0)

    def call(rows: int, **options):
        kwargs = make_inputs(SMALL, rows=rows)
        assert_matches_eager(gf(**kwargs, **options), eager(small_model, kwargs))
        return gf.stats()

    stats = call(8, pin=True)
    assert (stats["captures"], stats["graphs"], stats["pinned"]) == (1, 1, 1)
    stats = call(16)
    assert (stats["captures"], stats["graphs"], stats["evictions"]) == (2, 2, 0)
    stats = call(24)  # full: the unpinned 16-row graph goes
    assert (stats["captures"], stats["graphs"], stats["evictions"]) == (3, 2, 1)
    assert stats["pinned"] == 1
    stats = call(8)  # the pinned graph is still there
    assert (stats["captures"], stats["evictions"]) == (3, 1)
    stats = call(16)  # evicted before, so captured again; the 24-row graph goes
    assert (stats["captures"], stats["graphs"], stats["evictions"]) == (4, 2, 2)
    stats = call(24)
    assert (stats["captures"], stats["evictions"]) == (5, 3)
    stats = call(8)
    assert (stats["captures"], stats["evictions"], stats["pinned"]) == (5, 3, 1)
    assert stats["replays"] == 2  # 7 calls, 5 of them capturing
    assert stats["eager_calls"] == 0


# -- outputs -----------------------------------------------------------------------------------


def test_outputs_held_across_calls_stay_valid(small_model):
    gf = GraphedForward(small_model, device="cuda")
    first_inputs = make_inputs(SMALL, rows=24)
    first = gf(**first_inputs)
    first_reference = eager(small_model, first_inputs)
    assert_matches_eager(first, first_reference)
    first_copy = first.clone()
    for _ in range(3):
        kwargs = make_inputs(SMALL, rows=24)
        assert_matches_eager(gf(**kwargs), eager(small_model, kwargs))
    torch.cuda.synchronize()
    assert torch.equal(first, first_copy)
    assert_matches_eager(first, first_reference)
    assert gf.stats()["captures"] == 1


def test_static_outputs_share_storage_and_default_outputs_are_fresh(small_model):
    gf = GraphedForward(small_model, device="cuda")
    inputs = [make_inputs(SMALL, rows=24) for _ in range(4)]
    references = [eager(small_model, kwargs) for kwargs in inputs]

    static_a = gf(**inputs[0], static_outputs=True)
    assert_matches_eager(static_a, references[0])
    static_b = gf(**inputs[1], static_outputs=True)
    assert static_b.data_ptr() == static_a.data_ptr()
    assert_matches_eager(static_b, references[1])
    # The same storage: the first result now holds the second call's values.
    assert torch.equal(static_a, static_b)

    fresh_c = gf(**inputs[2])
    fresh_d = gf(**inputs[3])
    pointers = {static_b.data_ptr(), fresh_c.data_ptr(), fresh_d.data_ptr()}
    assert len(pointers) == 3
    assert_matches_eager(fresh_c, references[2])
    assert_matches_eager(fresh_d, references[3])
    # The static buffer was refreshed by the last replay and cloned into fresh_d.
    assert torch.equal(static_b, fresh_d)
    assert gf.stats()["captures"] == 1


# -- inputs ------------------------------------------------------------------------------------


def _non_contiguous(kwargs: dict) -> dict:
    """The same values, through transposed and strided views."""
    x = kwargs["x"]
    transposed = x.transpose(1, 2).contiguous().transpose(1, 2)
    prompt = kwargs["prompt_emb"]
    widened = torch.zeros(
        *prompt.shape[:-1], 2 * prompt.shape[-1], dtype=prompt.dtype, device=prompt.device
    )
    widened[..., ::2] = prompt
    cos = kwargs["rope"]["cos"].t().contiguous().t()
    positions = kwargs["positions"]
    spread = torch.zeros(2 * positions.numel(), dtype=positions.dtype, device=positions.device)
    spread[::2] = positions
    views = {
        **kwargs,
        "x": transposed,
        "prompt_emb": widened[..., ::2],
        "rope": {"cos": cos, "sin": kwargs["rope"]["sin"]},
        "positions": spread[::2],
    }
    for name in ("x", "prompt_emb", "positions"):
        assert not views[name].is_contiguous(), name
    assert not views["rope"]["cos"].is_contiguous()
    return views


@pytest.mark.parametrize("first_call_contiguous", [True, False])
def test_non_contiguous_live_inputs(small_model, first_call_contiguous):
    gf = GraphedForward(small_model, device="cuda")
    for call in range(4):
        kwargs = make_inputs(SMALL, rows=24)
        reference = eager(small_model, kwargs)
        use_views = call % 2 == (1 if first_call_contiguous else 0)
        if use_views:
            kwargs = _non_contiguous(kwargs)
            assert_matches_eager(eager(small_model, kwargs), reference)
        assert_matches_eager(gf(**kwargs), reference)
    stats = gf.stats()
    assert stats["captures"] == 1
    assert stats["replays"] == 3  # the first call: its last warm-up's outputs


class Noisy(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, *, x):
        if self.kind == "rand_like":
            return x + torch.rand_like(x)
        return F.dropout(x, p=0.5, training=self.training)


@pytest.mark.parametrize("kind", ["rand_like", "dropout"])
def test_random_numbers_differ_between_replays(kind):
    module = Noisy(kind).train()
    gf = GraphedForward(module, device="cuda")
    base = torch.rand(8192, device="cuda") + 1.0
    outputs = [gf(x=base.clone()) for _ in range(4)]
    for out in outputs:
        if kind == "rand_like":
            noise = out - base
            assert noise.min() >= 0 and noise.max() <= 1
            assert abs(noise.mean().item() - 0.5) < 0.05
        else:
            dropped = out == 0
            assert torch.allclose(out[~dropped], 2 * base[~dropped])
            assert abs(dropped.float().mean().item() - 0.5) < 0.05
    for first, second in itertools.pairwise(outputs):
        assert not torch.equal(first, second)
    stats = gf.stats()
    assert stats["captures"] == 1
    assert stats["replays"] == 3  # the first call: its last warm-up's outputs


class Syncing(nn.Module):
    def forward(self, *, x):
        peak = x.abs().max().item()  # a device-to-host sync: not capturable
        return torch.tanh(x) / (1.0 + peak)


def test_synchronizing_forward_disables_the_runner_and_runs_eager():
    module = Syncing()
    gf = GraphedForward(module, device="cuda", name="syncing")
    mode_before = torch.cuda.get_sync_debug_mode()
    x = torch.randn(64, 32, device="cuda")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = gf(x=x)
    torch.testing.assert_close(out, module(x=x), rtol=0, atol=0)
    assert torch.cuda.get_sync_debug_mode() == mode_before
    stats = gf.stats()
    assert stats["enabled"] is False
    reason = stats["disabled_reason"]
    assert "capture" in reason
    assert "synchroniz" in reason
    assert stats["captures"] == 0
    assert stats["graphs"] == 0
    assert stats["eager_calls"] == 1
    for call in range(2, 4):
        x = torch.randn(64, 32, device="cuda")
        torch.testing.assert_close(gf(x=x), module(x=x), rtol=0, atol=0)
        stats = gf.stats()
        assert stats["eager_calls"] == call
        assert stats["captures"] == 0
        assert stats["replays"] == 0
        assert stats["disabled_reason"] == reason


# -- hooks: capture_context, keep_alive, outer captures -------------------------------------


def test_capture_context_is_entered_around_probe_warmup_and_capture(small_model):
    entered: list[bool] = []

    @contextlib.contextmanager
    def capture_context():
        entered.append(torch.cuda.is_current_stream_capturing())
        yield

    warmup_iters = 2
    gf = GraphedForward(
        small_model, device="cuda", warmup_iters=warmup_iters, capture_context=capture_context
    )
    kwargs = make_inputs(SMALL, rows=24)
    assert_matches_eager(gf(**kwargs), eager(small_model, kwargs))
    first_call_entries = len(entered)
    # The warm-ups (the first of which is the sync probe) and the capture.
    assert first_call_entries == warmup_iters + 1
    assert entered[-1] is True  # the last entry surrounds the capture itself
    assert entered.count(True) == 1
    for _ in range(3):
        kwargs = make_inputs(SMALL, rows=24)
        assert_matches_eager(gf(**kwargs), eager(small_model, kwargs))
    assert len(entered) == first_call_entries
    assert gf.stats()["captures"] == 1


class AddTable(nn.Module):
    """Reads a tensor that is not an input, through an object graphed does not watch (a module
    attribute would be: re-assigning it captures again): its address is baked into the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.holder = types.SimpleNamespace(table=None)

    def forward(self, *, x):
        return x * 3 + self.holder.table


def test_keep_alive_holds_a_tensor_the_graph_reads():
    numel = 1 << 20
    module = AddTable()
    table = torch.randn(numel, device="cuda")
    expected_table = table.clone()
    module.holder.table = table
    gf = GraphedForward(module, device="cuda")
    x = torch.randn(numel, device="cuda")
    torch.testing.assert_close(gf(x=x, keep_alive=table), x * 3 + expected_table)
    module.holder.table = None
    del table
    torch.cuda.synchronize()
    # Without the hold, the allocator would hand the table's block to these.
    fillers = [torch.full((numel,), 1.0e6, device="cuda") for _ in range(8)]
    for _ in range(3):
        x = torch.randn(numel, device="cuda")
        torch.testing.assert_close(gf(x=x), x * 3 + expected_table)
    assert all(bool((filler == 1.0e6).all()) for filler in fillers)
    stats = gf.stats()
    assert stats["captures"] == 1
    assert stats["replays"] == 3  # the first call: its last warm-up's outputs


class Elementwise(nn.Module):
    def forward(self, *, x, y):
        return torch.tanh(x) * 2 + y


def test_outer_capture_runs_eager_inside_and_keeps_the_runner_enabled():
    module = Elementwise()
    gf = GraphedForward(module, device="cuda")
    x = torch.randn(4096, device="cuda")
    y = torch.randn(4096, device="cuda")
    module(x=x, y=y)
    torch.cuda.synchronize()
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        captured_out = gf(x=x, y=y)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 0
    assert stats["graphs"] == 0
    assert stats["eager_calls"] == 1

    # The work landed in the outer graph: replaying it recomputes from the current x and y.
    x.copy_(torch.randn(4096, device="cuda"))
    y.copy_(torch.randn(4096, device="cuda"))
    outer.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured_out, module(x=x, y=y))

    # Outside the outer capture, the runner captures and replays as usual.
    for call in range(1, 3):
        a, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
        torch.testing.assert_close(gf(x=a, y=b), module(x=a, y=b))
        stats = gf.stats()
        assert stats["enabled"]
        assert stats["captures"] == 1
        assert stats["replays"] == call - 1  # the first call: its last warm-up's outputs
    del outer


# -- launches per replay -----------------------------------------------------------------------


class FirstTimesTwo(nn.Module):
    """Constant device work whatever the number of inputs: the others are only copied in."""

    def forward(self, *, xs):
        return xs[0] * 2


def _is_launch(name: str) -> bool:
    return "Launch" in name or name.startswith(("cudaMemcpy", "cudaMemset", "cuMemcpy"))


def _profile_replays(input_count: int, replays: int = 8):
    gf = GraphedForward(FirstTimesTwo(), device="cuda", name=f"inputs{input_count}")
    batches = [
        [torch.randn(256, device="cuda") for _ in range(input_count)] for _ in range(replays + 2)
    ]
    for batch in batches[:2]:
        gf(xs=batch)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        outputs = [gf(xs=batch) for batch in batches[2:]]
        torch.cuda.synchronize()
    for batch, out in zip(batches[2:], outputs, strict=True):
        assert torch.equal(out, batch[0] * 2)
    stats = gf.stats()
    assert stats["captures"] == 1
    assert stats["replays"] == replays + 1  # the first call: its last warm-up's outputs
    events = profiler.events()
    launches = collections.Counter(event.name for event in events if _is_launch(event.name))
    kernels = collections.Counter(
        event.name for event in events if event.device_type == torch.autograd.DeviceType.CUDA
    )
    return launches, kernels


def test_launches_per_replay_do_not_grow_with_the_number_of_inputs():
    replays = 8
    # A first profiled session pays for the profiler's own set-up.
    _profile_replays(2, replays=2)
    launches_4, kernels_4 = _profile_replays(4, replays)
    launches_64, kernels_64 = _profile_replays(64, replays)
    print(f"K=4:  launches {dict(launches_4)} kernels {dict(kernels_4)}")
    print(f"K=64: launches {dict(launches_64)} kernels {dict(kernels_64)}")
    # One runtime graph launch per replay (driver-level records, if any, are not counted here).
    graph_launches = sum(
        count for name, count in launches_4.items() if name.startswith("cudaGraphLaunch")
    )
    assert graph_launches == replays
    assert launches_4 == launches_64
    # The same number of kernels runs per replay (the copy tables differ in size, not count).
    assert sum(kernels_4.values()) == sum(kernels_64.values())
    # The input and output copies are nodes of the graph: a replay launches nothing else.
    assert sum(launches_4.values()) == graph_launches
    assert sum(kernels_4.values()) == 3 * replays  # input copy, the forward's kernel, output copy
