"""Why this exists: compiled kernels inside the graph, the documented way to get both
(`GraphedForward(torch.compile(m, dynamic=False), ...)`, docs/api.md and docs/benchmarks.md).

graphed replays what the forward launched; over a compiled module that is inductor's fused
kernels, so a large forward keeps compile's per-kernel speed and loses its launch cost. What must
hold: the graphed forward gives what the compiled module gives (bitwise: the same kernels run, the
graph only replays them) and what eager gives (to the tolerance of fused arithmetic), calls bound
positionally as by name, one compile and one capture per shape. On the CPU, inductor's C++ kernels
run inside the emulated backend's capture; on the GPU (marked `gpu`) the DiT of the benchmarks in
bf16 replays bitwise equal to its compiled self over fresh inputs.

Nothing need be compiled by hand: the first call of a key compiles inside graphed's sync probe
(a later key in its first warm-up), and the probe leaves out the compiler's own synchronizations
while it still names the model's (graphed._compiled).
"""

from __future__ import annotations

import types
import warnings
from pathlib import Path

import graphed
import pytest
import torch
from _compiling import CompilingBackend
from graphed import GraphedForward, _phases

_PHASE_NAMES = {
    _phases.PHASE_EAGER: "eager",
    _phases.PHASE_PROBE: "probe",
    _phases.PHASE_WARMUP: "warm-up",
    _phases.PHASE_CAPTURE: "capture",
}


# Each test compiles afresh (conftest.fresh_dynamo).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


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


# -- the compiler's own work is not the forward's: graphed over compiled code, nothing by hand ---


@torch.compiler.disable
def _host_read(x: torch.Tensor) -> None:
    """The model's own host synchronization, run eagerly between compiled graphs (a graph
    break), as a `.item()` in a model's forward runs."""
    warnings.warn(f"{_phases._SYNC_WARNING} (the model reads a value on the host)", stacklevel=1)


class _ReadsOnTheHost(Mixer):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        _host_read(x)
        return super().forward(x, scale)


def test_a_compiled_module_compiles_in_the_probe_and_the_compilers_syncs_are_not_the_forwards(
    emulated_backend,
):
    """Nothing compiled by hand: the first call compiles inside graphed's probe, whose count of
    synchronizations leaves the compiler's out; a new shape recompiles in its first warm-up
    (under the capture's torch function mode, so the capture compiles nothing); the replays give
    the compiled module's values for inputs other than the capture's."""
    torch.manual_seed(0)
    model = Mixer().eval()
    backend = CompilingBackend(syncs=True)
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    runner = GraphedForward(compiled, device="cpu", backend=emulated_backend, regions=False)
    scale = torch.tensor(0.5)
    with torch.no_grad():
        first = torch.randn(4, 16)
        torch.testing.assert_close(runner(x=first, scale=scale), model(first, scale))
        assert backend.phases == [_phases.PHASE_PROBE]
        stats = runner.stats()
        assert stats["enabled"], stats["disabled_reason"]
        runner(x=torch.randn(2, 16), scale=scale)  # a new shape: a recompile (dynamic=False)
    assert backend.phases == [_phases.PHASE_PROBE, _phases.PHASE_WARMUP]
    stats = runner.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["eager_calls"]) == (2, 0), stats


def test_a_true_sync_in_a_compiled_models_own_code_is_still_found_and_named(emulated_backend):
    backend = CompilingBackend(syncs=True)
    compiled = torch.compile(_ReadsOnTheHost().eval(), backend=backend, dynamic=False)
    runner = GraphedForward(compiled, device="cpu", backend=emulated_backend, regions=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runner's own warning that it turned eager
        runner(x=torch.randn(4, 16), scale=torch.tensor(0.5))
    stats = runner.stats()
    assert not stats["enabled"]
    assert "sync probe" in stats["disabled_reason"], stats["disabled_reason"]
    # Named where the model synchronized, not where the compiler did.
    assert f"{Path(__file__).name}:" in stats["disabled_reason"], stats["disabled_reason"]
    assert _PHASE_NAMES[backend.phases[0]] == "probe"


def test_holds_compiled_code_sees_each_way_users_compile():
    from graphed._compiled import holds_compiled_code

    torch.compile(lambda t: t + 1, backend="eager")  # torch._dynamo is loaded from here on
    assert not holds_compiled_code(Mixer())
    assert holds_compiled_code(torch.compile(Mixer(), backend="eager"))
    in_place = Mixer()
    in_place.compile(backend="eager")  # nn.Module.compile()
    assert holds_compiled_code(in_place)
    regional = torch.nn.Sequential(Mixer(), Mixer())
    regional[1].compile(backend="eager")  # as diffusers' compile_repeated_blocks does per block
    assert holds_compiled_code(regional)
    holder = Mixer()
    holder.step = torch.compile(holder.forward, backend="eager")  # a compiled function it holds
    assert holds_compiled_code(holder)
    forward_compiled = torch.nn.Sequential(Mixer(), Mixer())
    child = forward_compiled[0]
    child.forward = torch.compile(child.forward, backend="eager")  # a child's compiled forward
    assert holds_compiled_code(forward_compiled)
    assert not holds_compiled_code(lambda t: t)
    # What torch.compiler.disable makes is kept out of compiled code, not compiled.
    kept_out = torch.nn.Sequential(Mixer(), Mixer())
    kept_out[0].forward = torch.compiler.disable(kept_out[0].forward)
    assert not holds_compiled_code(kept_out)
    assert not holds_compiled_code(torch.nn.Sequential(torch.compiler.disable(Mixer())))


def test_graph_pipelines_router_is_not_compiled_code_but_what_it_routes_to_is(emulated_backend):
    """graph_pipeline takes the slot nn.Module.compile() fills, whether or not the component was
    compiled: the look sees through it to the call it routes to."""
    from graphed._compiled import holds_compiled_code

    torch.compile(lambda t: t + 1, backend="eager")  # torch._dynamo is loaded from here on
    plain, compiled = Mixer(), Mixer()
    compiled.compile(backend="eager")
    pipe = types.SimpleNamespace(plain=plain, compiled=compiled)
    graphed.graph_pipeline(pipe, ("plain", "compiled"), device="cpu", backend=emulated_backend)
    assert not holds_compiled_code(plain)
    assert holds_compiled_code(compiled)
    graphed.ungraph_pipeline(pipe, ("plain", "compiled"))
    assert vars(plain).get("_compiled_call_impl") is None and holds_compiled_code(compiled)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("how", ["torch.compile", "regional"])
def test_gpu_graphed_over_code_compiled_nothing_by_hand_replays_what_compile_computes(how):
    """Inductor compiles inside graphed's probe on the GPU (its own synchronizations not
    counted): the runner stays enabled and every replay equals the compiled module run without
    graphed, bitwise, over fresh inputs; a new shape recompiles before its capture."""
    from dit_model import DiT, DiTConfig, make_inputs, rope_table

    config = DiTConfig(blocks=4, dim=256, heads=4, rows=300, dtype=torch.bfloat16, device="cuda")
    torch.manual_seed(0)
    model = DiT(config).eval()
    if how == "torch.compile":
        compiled = torch.compile(model, dynamic=False)
    else:  # regional compilation of the repeated blocks, diffusers' compile_repeated_blocks way
        compiled = model
        for block in model.blocks:
            block.compile(dynamic=False)
    runner = GraphedForward(compiled, device="cuda")
    rope = rope_table(config)
    inputs = [
        make_inputs(config, rope=rope, generator=torch.Generator().manual_seed(seed))
        for seed in range(3)
    ]
    got = [runner(**each) for each in inputs]  # the first call compiles: nothing by hand
    stats = runner.stats()
    assert stats["enabled"], stats["disabled_reason"]
    with torch.no_grad():
        expected = [compiled(**each) for each in inputs]  # the same compiled code, no graph
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(mine, theirs), f"call {index}"
    assert (stats["captures"], stats["eager_calls"]) == (1, 0), stats


class _AsksAboutCapture(Mixer):
    """Records what torch.cuda.is_current_stream_capturing answers the model's own code, as
    capture-aware code asks it (outside what is compiled: a graph break)."""

    answers: list[bool]

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        _ask_about_capture(self.answers)
        return super().forward(x, scale)


@torch.compiler.disable
def _ask_about_capture(answers: list[bool]) -> None:
    answers.append(torch.cuda.is_current_stream_capturing())


def test_the_compiler_is_told_no_capture_is_under_way_while_the_model_is_told_one_is(
    emulated_backend, monkeypatch
):
    """During the probe and the warm-ups graphed answers True to the model's capture-aware code;
    to torch.compile, which refuses to compile under a capture and asks the same function, it
    gives torch's own answer, so that the compile can happen there."""
    _phases.install_capture_awareness()  # as a process's first CUDA runner does
    # torch's own answer without asking a CUDA driver (a CPU machine may have none): no capture.
    monkeypatch.setattr(torch.cuda.graphs, "_cuda_isCurrentStreamCapturing", lambda: False)
    model = _AsksAboutCapture().eval()
    model.answers = []
    compiler_answers: list[bool] = []

    def backend(graph_module, example_inputs):
        compiler_answers.append(torch.cuda.is_current_stream_capturing())
        return graph_module.forward

    compiled = torch.compile(model, backend=backend, dynamic=False)
    runner = GraphedForward(compiled, device="cpu", backend=emulated_backend, regions=False)
    with torch.no_grad():
        runner(x=torch.randn(4, 16), scale=torch.tensor(0.5))
    assert runner.stats()["enabled"], runner.stats()["disabled_reason"]
    assert compiler_answers and not any(compiler_answers), compiler_answers
    # The probe and the warm-up, then the capture (which the emulated backend does not make on
    # a CUDA stream: torch's own answer there).
    assert len(model.answers) == 3 and model.answers[:2] == [True, True], model.answers


class _TwoBlocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Mixer(), Mixer()

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x, scale), scale)


def test_regions_of_blocks_compiled_in_place_graph_the_compiled_call(emulated_backend):
    """A forward that cannot be captured whole (a planted failure, as a `.item()` in its own
    code) over blocks compiled in place: each block's region takes the compiled call, so the
    compiler compiles each block (never under a capture) and the regions' graphs hold the
    compiled code, one capture each."""
    from _backend_choice import fail_captures_of

    torch.manual_seed(0)
    model = _TwoBlocks().eval()
    backend = CompilingBackend()
    for block in (model.first, model.second):
        block.compile(backend=backend, dynamic=False)
    compiled_calls = [vars(block)["_compiled_call_impl"] for block in (model.first, model.second)]
    fail_captures_of(model)
    runner = GraphedForward(model, device="cpu", backend=emulated_backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runner's own word that it runs in regions
        for _ in range(4):
            runner(x=torch.randn(4, 16), scale=torch.tensor(0.5))
    regions = {region.path: region for region in runner._regions.regions}
    assert set(regions) == {"first", "second"}, regions
    for region, compiled_call in zip(regions.values(), compiled_calls, strict=True):
        assert region.original is compiled_call  # the compiled call, not the plain forward
        stats = region.runner.stats()
        assert stats["enabled"], stats["disabled_reason"]
        assert stats["captures"] == 1 and stats["replays"] >= 2, stats
    assert backend.phases and _phases.PHASE_CAPTURE not in backend.phases, backend.phases
    runner.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_regions_over_blocks_compiled_in_place_replay_what_compile_computes() -> None:
    """On the GPU: the regions of a forward that cannot be captured whole, over blocks compiled
    in place by inductor, give the compiled blocks' values bitwise over fresh inputs."""
    from _backend_choice import fail_captures_of

    torch.manual_seed(0)
    model = _TwoBlocks().to("cuda").eval()
    for block in (model.first, model.second):
        block.compile(dynamic=False)
    fail_captures_of(model)
    runner = GraphedForward(model, device="cuda")
    inputs = [torch.randn(64, 16, device="cuda") for _ in range(4)]
    scale = torch.tensor(0.5, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [runner(x=x, scale=scale).clone() for x in inputs]
    with torch.no_grad():
        expected = [model(x, scale) for x in inputs]  # outside the runner: the compiled blocks
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(mine, theirs), f"call {index}"
    for region in runner._regions.regions:
        stats = region.runner.stats()
        assert stats["enabled"] and stats["captures"] == 1 and stats["replays"] >= 1, stats


_GLOBAL_SHIFT = torch.ones(16)


class _ShiftsByAGlobal(torch.nn.Module):
    """A block whose compiled code reads a module-level tensor (a graph input Dynamo fetches
    from the global at every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + _GLOBAL_SHIFT


class _AroundACompiledBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _ShiftsByAGlobal()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) * 2


# The recording backend runs the graph's torch functions, which graphed's mode sees; inductor's
# code runs kernels with no torch function between, and graphed sees the graph's inputs where it
# is called (graphed._compiled.see_compiled_graph_calls).
@pytest.mark.parametrize("compiler", ["recording", "inductor"])
def test_a_global_read_inside_compiled_code_is_found_and_its_rebinding_captures_again(
    compiler, emulated_backend
):
    """The capture's inventory sees what the compiled code reads: a module-level tensor the
    compiled block reads, re-bound (the old one freed), is captured again and the call gives the
    model's result, not the capture's stale one. (A design that ran compiled code outside
    graphed's torch function mode lost exactly this.)"""
    global _GLOBAL_SHIFT
    torch.manual_seed(0)
    model = _AroundACompiledBlock().eval()
    backend = CompilingBackend() if compiler == "recording" else compiler
    model.block.compile(backend=backend, dynamic=False)
    runner = GraphedForward(model, device="cpu", backend=emulated_backend, regions=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(runner(x=x), model(x))
        externals = graphed.inventory(runner)[-1]["externals"]
        assert [name.split(" (")[0] for name in externals] == ["global _GLOBAL_SHIFT"], externals
        _GLOBAL_SHIFT = torch.full((16,), 5.0)
        torch.testing.assert_close(runner(x=x), model(x))
    stats = runner.stats()
    assert stats["enabled"] and stats["captures"] == 2, stats


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_a_global_read_inside_inductor_code_rebound_replays_the_new_value() -> None:
    """On the device, where a replay runs the graph: the rebound global's new value, never the
    freed one the capture read."""
    global _GLOBAL_SHIFT
    torch.manual_seed(0)
    model = _AroundACompiledBlock().cuda().eval()
    model.block.compile(dynamic=False)
    runner = GraphedForward(model, device="cuda", regions=False)
    x = torch.randn(4, 16, device="cuda")
    try:
        _GLOBAL_SHIFT = torch.ones(16, device="cuda")
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(runner(x=x), model(x), rtol=0, atol=0)
            _GLOBAL_SHIFT = torch.full((16,), 5.0, device="cuda")
            for _ in range(2):
                torch.testing.assert_close(runner(x=x), model(x), rtol=0, atol=0)
    finally:
        _GLOBAL_SHIFT = torch.ones(16)
    stats = runner.stats()
    assert stats["enabled"] and stats["captures"] == 2 and stats["replays"] >= 3, stats
