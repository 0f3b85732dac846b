"""Regions: a forward that cannot be captured whole runs its Python eagerly and graphs its parts.

On the CPU (the emulated backend, whose replay returns what its capture wrote, so values are
compared only for calls with the capture's inputs): a block that fails its capture (a planted
RuntimeError in the probe and the capture, as a synchronizing operator makes) disables the whole
runner, the other blocks are graphed, the failing block splits into its children; the parent's
Python runs at every call; regions=False keeps today's all-eager runner; arguments graphed cannot
key keep a region eager; the churn guard and verify apply per region; an error of the forward
itself propagates; graph_regions graphs named blocks and remove() puts them back.

On a CUDA device: a real `.item()` guard in one block of a small transformer (bitwise equal to
eager with inputs other than the capture's, the guard's file and line named), and a tiny diffusers
transformer with a forced sync in one block.
"""

from __future__ import annotations

import functools
import logging
import types

import graphed
import pytest
import torch
from _backend_choice import capturing_run
from graphed import GraphedForward, _regions
from graphed._options import RunnerOptions
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1) @ x


class Block(nn.Module):
    """A pre-norm block; `fails` plants a capture failure (a RuntimeError in the probe and the
    capture, the runs a synchronizing operator fails) in its own forward."""

    def __init__(self, dim: int, fails: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.fails = fails

    def forward(self, x):
        if self.fails and capturing_run():
            raise RuntimeError("planted: this block cannot be captured")
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


class Model(nn.Module):
    """Six blocks in a ModuleList and a head; `seen.calls` counts the runs of its own Python."""

    def __init__(self, dim: int = 8, blocks: int = 6, failing: int | None = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(dim, fails=index == failing) for index in range(blocks))
        self.head = nn.Linear(dim, dim)
        self.seen = types.SimpleNamespace(calls=0)

    def forward(self, x):
        self.seen.calls += 1
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _eager(module: nn.Module, *args, **kwargs):
    with torch.no_grad():
        return module(*args, **kwargs)


def _states(runner) -> dict[str, str]:
    return {entry["path"]: entry["state"] for entry in runner.regions()}


def _call(runner, x, times: int) -> list[torch.Tensor]:
    return [runner(x) for _ in range(times)]


def test_a_block_that_fails_its_capture_leaves_the_others_graphed(emulated_backend, caplog):
    model = Model()
    gf = GraphedForward(model, device="cpu", backend=emulated_backend, name="six")
    x = torch.randn(2, 4, 8)
    expected = _eager(model, x)
    model.seen.calls = 0
    with caplog.at_level(logging.INFO, logger="graphed"):
        outputs = _call(gf, x, 8)
    for output in outputs:
        torch.testing.assert_close(output, expected, rtol=0, atol=0)
    assert not gf.stats()["enabled"]
    assert gf.stats()["disabled_reason"].startswith("capture failed")
    states = _states(gf)
    assert states == {
        **{f"blocks.{index}": "graphed" for index in (0, 1, 2, 4, 5)},
        "blocks.3": "split",
        "blocks.3.attn": "graphed",
        "blocks.3.mlp": "graphed",
    }
    failing = next(entry for entry in gf.regions() if entry["path"] == "blocks.3")
    assert "planted: this block cannot be captured" in failing["reason"]
    graphed_stats = [entry["stats"] for entry in gf.regions() if entry["state"] == "graphed"]
    assert all(stats["captures"] == 1 and stats["replays"] >= 3 for stats in graphed_stats)
    # The first call probes the whole forward (and the forward then runs eagerly inside the
    # core), so the parent's own Python runs once more than the calls.
    assert model.seen.calls == len(outputs) + 1
    said = [record.getMessage() for record in caplog.records]
    assert sum("cannot be captured whole" in message for message in said) == 2  # six, blocks.3
    assert any("runs in regions: 7 graphed" in message for message in said), said
    # One warning a split runner, saying why: not the disable's own warning beside it, and the
    # core's nested "graphed: " prefixes left out (the logger's name says it).
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for name in ("runner 'six'", "runner 'six/blocks.3'"):
        about = [
            message
            for message in warned
            if message.startswith(name + ":") or message.startswith(name + " ")
        ]
        assert len(about) == 1 and "planted" in about[0], warned
        assert "graphed: " not in about[0], about[0]


def test_regions_false_keeps_the_whole_runner_eager(emulated_backend):
    model = Model()
    gf = GraphedForward(model, device="cpu", backend=emulated_backend, regions=False)
    x = torch.randn(2, 4, 8)
    for output in _call(gf, x, 4):
        torch.testing.assert_close(output, _eager(model, x), rtol=0, atol=0)
    assert gf.regions() == []
    assert not gf.stats()["enabled"] and gf.stats()["eager_calls"] == 4
    assert all("forward" not in vars(block) for block in model.blocks)


def test_a_module_without_a_failure_captures_whole(emulated_backend):
    model = Model(failing=None)
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4, 8)
    _call(gf, x, 3)
    assert gf.regions() == [] and gf.stats()["captures"] == 1 and gf.stats()["replays"] == 3


class Holder:
    """An object holding a tensor: graphed cannot key it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class TakesHolder(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.inner = Block(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, holder):
        return self.out(self.inner(x) + holder.tensor)


class HolderModel(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = Block(dim, fails=True)
        self.odd = TakesHolder(dim)

    def forward(self, x, bias):
        return self.odd(self.first(x), Holder(bias))


def test_a_region_whose_arguments_cannot_be_keyed_stays_eager(emulated_backend):
    model = HolderModel()
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    x, bias = torch.randn(2, 4, 8), torch.randn(8)
    expected = _eager(model, x, bias)
    for _ in range(6):
        torch.testing.assert_close(gf(x, bias=bias), expected, rtol=0, atol=0)
    odd = next(entry for entry in gf.regions() if entry["path"] == "odd")
    assert odd["state"] == "split" and "cannot be keyed" in odd["reason"]
    assert "holder" in odd["reason"]
    # Its children are regions of their own: the Block inside it is graphed.
    assert _states(gf)["odd.inner"] == "graphed"


class Scaled(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.block = Block(dim)
        self.planted = Block(dim, fails=True)

    def forward(self, x, extra: bool = False):
        if extra:  # an argument graphed cannot key, made inside the forward
            return self.block(x, Holder(torch.ones(x.shape[-1])))
        return self.planted(self.block(x))


class BlockWithExtra(Block):
    def forward(self, x, extra=None):
        return super().forward(x) if extra is None else super().forward(x + extra.tensor)


def test_a_call_refused_after_vetting_runs_eagerly_and_the_region_stays_eager(emulated_backend):
    model = Scaled()
    model.block = BlockWithExtra(8)
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4, 8)
    _call(gf, x, 4)
    assert _states(gf)["block"] == "graphed"
    got = gf(x, extra=True)
    torch.testing.assert_close(got, _eager(model, x, extra=True), rtol=0, atol=0)
    block = next(entry for entry in gf.regions() if entry["path"] == "block")
    assert block["state"] == "split" and "refused its arguments" in block["reason"]


class Scaling(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU())

    def forward(self, x, scale):
        return self.mlp(x) * scale


class ChurnModel(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.steady = Block(dim)
        self.scaling = Scaling(dim)
        self.planted = Block(dim, fails=True)

    def forward(self, x, scale):
        return self.planted(self.scaling(self.steady(x), scale))


def test_the_churn_guard_applies_per_region(emulated_backend):
    model = ChurnModel()
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4, 8)
    for call in range(30):
        gf(x, scale=0.5 + call / 10)  # a float that changes every call
    stats = {entry["path"]: entry["stats"] for entry in gf.regions()}
    assert stats["scaling"]["churn_eager_calls"] > 20 and stats["scaling"]["captures"] == 1
    assert stats["steady"]["captures"] == 1 and stats["steady"]["churn_eager_calls"] == 0


def test_verify_applies_per_region(emulated_backend):
    model = Model()
    gf = GraphedForward(model, device="cpu", backend=emulated_backend, verify=100)
    x = torch.randn(2, 4, 8)
    _call(gf, x, 6)
    assert set(_states(gf).values()) == {"graphed", "split"}
    # The emulated replay returns what its capture wrote: other inputs differ from eager, and
    # verify (made per region with the parent's options) catches it in the first region.
    other = torch.randn(2, 4, 8)
    torch.testing.assert_close(gf(other), _eager(model, other), rtol=0, atol=0)
    first = gf.regions()[0]
    assert first["state"] == "eager" and first["reason"].startswith("verify:")


class OwnTypeError(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.block = Block(dim)
        self.planted = Block(dim, fails=True)
        self.raises = types.SimpleNamespace(now=False)

    def forward(self, x):
        return self.planted(self.block(x))


class RaisingBlock(Block):
    def __init__(self, dim: int, switch: types.SimpleNamespace) -> None:
        super().__init__(dim)
        self.switch = switch

    def forward(self, x):
        if self.switch.now:
            raise TypeError("the forward's own TypeError")
        return super().forward(x)


def test_the_forwards_own_type_error_propagates(emulated_backend):
    model = OwnTypeError()
    model.block = RaisingBlock(8, model.raises)
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    _call(gf, torch.randn(2, 4, 8), 4)
    assert _states(gf)["block"] == "graphed"
    model.raises.now = True
    with pytest.raises(TypeError, match="the forward's own TypeError"):
        gf(torch.randn(3, 4, 8))  # a new shape: the region warms up, and its forward raises
    assert _states(gf)["block"] == "graphed"
    pending = GraphedForward(OwnTypeError(), device="cpu", backend=emulated_backend)
    pending.module.block = RaisingBlock(8, types.SimpleNamespace(now=True))
    with pytest.raises(TypeError, match="the forward's own TypeError"):
        _call(pending, torch.randn(2, 4, 8), 2)  # raised while the region is vetted


def test_a_child_called_outside_the_parents_call_runs_its_own_forward(emulated_backend):
    model = Model()
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4, 8)
    _call(gf, x, 3)
    block = model.blocks[0]
    before = gf.regions()[0]["stats"]["replays"]
    other = torch.randn(2, 4, 8)
    torch.testing.assert_close(_eager(block, other), block.__class__.forward(block, other))
    assert gf.regions()[0]["stats"]["replays"] == before


def test_a_vetting_outcome_is_agreed_across_the_group(emulated_backend, monkeypatch):
    """Each region's vetting is one all_reduce MIN over the group; a rank that could not graph a
    region (here: the reduction comes back 0, as from a peer that refused) makes every rank keep
    it eager."""
    reductions = []

    def all_reduce(flag, op, group):
        reductions.append((int(flag.item()), op, group))
        flag.zero_()  # a peer refused

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    model, group = Model(failing=None), object()
    regions = _regions.Regions(
        model,
        lambda module, path, forward: GraphedForward.from_options(
            module, RunnerOptions(device=torch.device("cpu"), backend=emulated_backend), forward
        ),
        name="agreed",
        group=group,
        device=torch.device("cpu"),
        permanent=True,
    )
    x = torch.randn(2, 4, 8)
    expected = _eager(model.blocks[0], x)
    torch.testing.assert_close(_eager(model.blocks[0], x), expected, rtol=0, atol=0)
    # The block at its first call; its attention and MLP (regions of their own once the block
    # stays eager) at the second; each refused by the peer.
    assert reductions == [(1, torch.distributed.ReduceOp.MIN, group)] * 3
    described = {entry["path"]: entry for entry in regions.describe()}
    assert described["blocks.0"]["state"] == "split"
    assert described["blocks.0.attn"]["state"] == "eager"
    assert all("another rank" in described[path]["reason"] for path in ("blocks.0", "blocks.0.mlp"))
    regions.remove()


# -- graph_regions: the explicit form ------------------------------------------------------------


def test_a_module_that_calls_a_child_as_bound_looks_through_it():
    """graph_generation's decode step calls the model's forward as bound before it replaced it: a
    region installed as that model's `forward` would never be reached, so the model's own
    submodules are the candidates."""

    class Step(nn.Module):
        REGIONS_LOOK_THROUGH = ("model",)

        def __init__(self) -> None:
            super().__init__()
            self.model = Model(blocks=2, failing=None)

    plain = nn.Module()
    plain.model = Model(blocks=2, failing=None)
    assert [path for path, _ in _regions.candidates(plain)] == ["model"]
    assert [path for path, _ in _regions.candidates(Step())] == ["model.blocks.0", "model.blocks.1"]
    assert graphed._generation._DecodeStep.REGIONS_LOOK_THROUGH == ("model",)


def test_graph_regions_by_class_graphs_each_block_and_remove_restores(emulated_backend):
    model = Model(failing=None)
    x = torch.randn(2, 4, 8)
    expected = _eager(model, x)
    regions = graphed.graph_regions(model, [Block], device="cpu", backend=emulated_backend)
    for _ in range(4):
        torch.testing.assert_close(_eager(model, x), expected, rtol=0, atol=0)
    assert [entry["state"] for entry in regions.regions()] == ["graphed"] * 6
    stats = regions.stats()
    assert (stats["regions"], stats["regions_graphed"], stats["captures"]) == (6, 6, 6)
    assert stats["replays"] == 18  # the first call vets, the second captures and replays
    regions.reset()
    assert regions.stats()["graphs"] == 0
    regions.remove()
    regions.remove()
    assert all("forward" not in vars(block) for block in model.blocks)
    assert regions.regions() == []
    torch.testing.assert_close(_eager(model, x), expected, rtol=0, atol=0)


def test_graph_regions_by_name_and_by_the_models_declaration(emulated_backend):
    by_name = graphed.graph_regions(Model(), "Block", device="cpu", backend=emulated_backend)
    assert [entry["path"] for entry in by_name.regions()] == [f"blocks.{i}" for i in range(6)]
    repeated = Model()
    repeated._repeated_blocks = ["Attention"]
    declared = graphed.graph_regions(repeated, device="cpu", backend=emulated_backend)
    assert [entry["path"] for entry in declared.regions()][:2] == ["blocks.0.attn", "blocks.1.attn"]
    no_split = Model()
    no_split._no_split_modules = ["Block"]
    outermost = graphed.graph_regions(no_split, device="cpu", backend=emulated_backend)
    assert len(outermost.regions()) == 6
    with pytest.raises(ValueError, match="pass blocks="):
        graphed.graph_regions(Model(), device="cpu", backend=emulated_backend)
    with pytest.raises(ValueError, match="no submodule"):
        graphed.graph_regions(Model(), ["Missing"], device="cpu", backend=emulated_backend)
    with pytest.raises(TypeError):
        graphed.graph_regions(Model(), [Block], device="cpu", not_an_option=1)


def test_graph_regions_keeps_an_instance_forward_already_there(emulated_backend):
    model = Model(failing=None)
    block = model.blocks[0]
    calls = []
    original = block.forward

    @functools.wraps(original)  # as accelerate's hooks do: the signature stays the forward's
    def hooked(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    block.forward = hooked
    regions = graphed.graph_regions(model, [Block], device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4, 8)
    for _ in range(3):
        _eager(model, x)
    warmed_up = len(calls)  # vetting, and the runs of its capture
    for _ in range(3):
        _eager(model, x)
    assert warmed_up >= 2 and len(calls) == warmed_up  # replays run no Python
    regions.remove()
    assert vars(block)["forward"] is hooked


# -- on a CUDA device ---------------------------------------------------------------------------

_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@_cuda
def test_a_host_guard_in_one_block_is_bitwise_equal_to_eager_on_the_device():
    from regions_bench import GUARD_LINE, Transformer

    model = Transformer(blocks=6, dim=128, guarded=3).to("cuda", torch.bfloat16).eval()
    gf = GraphedForward(model, device="cuda", churn_limit=0)
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [
        torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16, generator=generator)
        for _ in range(6)
    ]
    for x in inputs:
        assert torch.equal(gf(x), _eager(model, x))
    states = _states(gf)
    assert states["blocks.3"] == "split"
    assert all(states[f"blocks.{index}"] == "graphed" for index in (0, 1, 2, 4, 5))
    reason = next(entry["reason"] for entry in gf.regions() if entry["path"] == "blocks.3")
    assert f"regions_bench.py:{GUARD_LINE}" in reason


@pytest.mark.gpu
@_cuda
def test_a_diffusers_transformer_with_a_sync_in_one_block_runs_in_regions():
    pytest.importorskip("diffusers")
    from lora_workflow import sd3_transformer

    model, inputs = sd3_transformer()
    model = model.to("cuda").eval()
    block = model.transformer_blocks[1]
    original = block.forward

    def synchronizing(*args, **kwargs):
        if kwargs.get("hidden_states", args[0] if args else None).sum().item() > 1e30:
            raise AssertionError("never")
        return original(*args, **kwargs)

    block.forward = synchronizing
    kwargs = inputs(torch.device("cuda"))
    expected = _eager(model, **kwargs)
    gf = GraphedForward(model, device="cuda", churn_limit=0)
    for _ in range(5):
        assert torch.equal(gf(**kwargs)[0], expected[0])
    states = _states(gf)
    assert states["transformer_blocks.0"] == "graphed"
    assert states["transformer_blocks.1"] in ("split", "eager")


@pytest.mark.gpu
@_cuda
def test_generate_whose_decode_step_synchronizes_graphs_the_models_parts():
    """graph_generation over a tiny Llama whose layer 2 synchronizes: the decode step cannot be
    captured whole, so it runs in regions below the model (REGIONS_LOOK_THROUGH), tokens equal
    to eager's."""
    pytest.importorskip("transformers")
    from regions_bench import greedy_generate, synchronizing_llama

    model = synchronizing_llama("cuda")
    prompt = torch.randint(1, 1000, (1, 16), generator=torch.Generator().manual_seed(2))
    prompt = prompt.to("cuda")
    expected = greedy_generate(model, prompt, 12, disable_compile=True)
    generation = graphed.graph_generation(model, device="cuda", regions=True)
    try:
        for _ in range(3):
            assert torch.equal(greedy_generate(model, prompt, 12), expected)
        states = _states(generation.graphed)
    finally:
        generation.remove()
    assert states, "the decode step did not run in regions"
    assert "graphed" in states.values(), states
    assert not any(path == "model" for path in states), states
