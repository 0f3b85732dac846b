"""graph_generation(compile=True): generate()'s decode step compiled by torch.compile and replayed
from graphed's graphs (graphed._compiled, graphed._generation).

What must hold: the step compiles once per shape and regime, never once per step (a sliding
window's Python length stays outside what is compiled, as it stays outside the graphs); the first
decode step compiles inside graphed's probe and the runner stays enabled; a step the compiler
refuses runs graphed without compile, said once with the compiler's reason; and graphed over the
compiled step gives what the compiled step gives without graphed. On the CPU the compile uses a
counting backend (Dynamo's trace, run as traced: cheap on a 2-core machine) and, with the runner
turned off, compares every token with eager's, so the lengths the compiled step sees are shown
to give eager's values; the GPU tests (marked `gpu`) compile with inductor and compare every
token of graphed-with-compile with the same compiled step run without graphs.
"""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install transformers)"
)

import graphed  # noqa: E402
from _compiling import CompilingBackend  # noqa: E402
from graphed import _phases  # noqa: E402
from test_generate import (  # noqa: E402
    BATCH,
    FAMILIES,
    LONG,
    PAST_THE_WINDOW,
    SHORT,
    WINDOWED_AND_LINEAR,
    _build,
    _generate,
    _long_prompt,
)

ALL_FAMILIES = {**FAMILIES, **WINDOWED_AND_LINEAR}


# Each test compiles afresh (conftest.fresh_dynamo).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _requests(model) -> list[dict]:
    """Prompts shorter than the sliding windows (the decode steps fill them, then roll them) and
    longer (every step rolls)."""
    return [
        _long_prompt(model, "cpu", seed, length, batch=BATCH)
        for seed, length in ((1, SHORT), (2, LONG))
    ]


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3_next"])
def test_compiled_decode_steps_give_eagers_tokens_and_compile_once_per_regime(
    emulated_backend, family
):
    """The runner off, every decode step runs the compiled step itself: each token eager's, and
    one compile per regime of the windows (filling, full), not one per step."""
    model = _build(ALL_FAMILIES[family], "cpu")
    prompts = _requests(model)
    wants = [
        _generate(model, p, PAST_THE_WINDOW, cache_implementation="static", disable_compile=True)
        for p in prompts
    ]
    backend = CompilingBackend()
    generation = graphed.graph_generation(
        model, device="cpu", backend=emulated_backend, enabled=False, compile={"backend": backend}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no refusal, nothing said
        for prompt, want in zip(prompts, wants, strict=True):
            got = _generate(model, prompt, PAST_THE_WINDOW, cache_implementation="static")
            assert torch.equal(got, want)
    regimes = 2 if family == "gemma3" else 1
    assert 1 <= len(backend.phases) <= regimes, backend.phases
    assert generation.stats()["eager_calls"] == 2 * (PAST_THE_WINDOW - 1)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_first_compiled_decode_step_compiles_in_the_probe_and_the_runner_captures(
    emulated_backend, family
):
    model = _build(ALL_FAMILIES[family], "cpu")
    backend = CompilingBackend()
    generation = graphed.graph_generation(
        model, device="cpu", backend=emulated_backend, compile={"backend": backend}
    )
    for prompt in _requests(model):
        _generate(model, prompt, PAST_THE_WINDOW, cache_implementation="static")
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert backend.phases[0] == _phases.PHASE_PROBE, backend.phases
    # Each new key (the other prompt length's shape, the other regime) compiles in its probe or
    # its first warm-up: none under a capture, none per replay.
    assert set(backend.phases) <= {_phases.PHASE_PROBE, _phases.PHASE_WARMUP}, backend.phases
    assert len(backend.phases) <= stats["captures"], (backend.phases, stats)
    assert stats["replays"] >= 2 * (PAST_THE_WINDOW - 1) - stats["captures"], stats


def test_a_decode_step_the_compiler_refuses_runs_graphed_without_compile_said_once(
    emulated_backend,
):
    model = _build(ALL_FAMILIES["llama"], "cpu")
    # One request: its one decode step is the capture's, which computes the token on the CPU too.
    prompts = _requests(model)[:1]
    wants = [
        _generate(model, p, 2, cache_implementation="static", disable_compile=True) for p in prompts
    ]
    generation = graphed.graph_generation(
        model,
        device="cpu",
        backend=emulated_backend,
        compile={"backend": CompilingBackend(refuse=True)},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [_generate(model, p, 2, cache_implementation="static") for p in prompts]
    for mine, want in zip(got, wants, strict=True):
        assert torch.equal(mine, want)
    said = [str(w.message) for w in caught if "torch.compile refused" in str(w.message)]
    assert len(said) == 1, said
    assert "BackendCompilerFailed" in said[0] and "graphed without compile" in said[0], said
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]


def test_a_compile_mode_with_cuda_graphs_of_its_own_is_refused_before_the_model_changes():
    model = _build(ALL_FAMILIES["llama"], "cpu")
    for compile in ({"mode": "reduce-overhead"}, "yes"):
        with pytest.raises(ValueError, match="compile="):
            graphed.graph_generation(model, device="cpu", compile=compile)
        assert "forward" not in vars(model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(ALL_FAMILIES))
def test_gpu_graphed_over_the_compiled_step_gives_the_compiled_steps_tokens(family):
    """Inductor, nothing compiled by hand: every family graph_generation serves, every token of
    graphed with compile equal to the same compiled step run without graphs, in two rounds, the
    second capturing and compiling nothing."""
    model = _build(ALL_FAMILIES[family], "cuda").to(torch.bfloat16)
    prompts = [
        _long_prompt(model, "cuda", seed, length, batch=BATCH)
        for seed in (1, 2)
        for length in (SHORT, LONG)
    ]
    plain = graphed.graph_generation(model, device="cuda", enabled=False, compile=True)
    wants = [_generate(model, p, PAST_THE_WINDOW, cache_implementation="static") for p in prompts]
    plain.remove()
    generation = graphed.graph_generation(model, device="cuda", compile=True)
    captures = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for round_ in range(2):
            for index, (prompt, want) in enumerate(zip(prompts, wants, strict=True)):
                got = _generate(model, prompt, PAST_THE_WINDOW, cache_implementation="static")
                assert torch.equal(got, want), f"round {round_}, request {index}"
            captures.append(generation.stats()["captures"])
    refused = [str(w.message) for w in caught if "torch.compile refused" in str(w.message)]
    assert not refused, refused
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert 1 <= captures[0] == captures[1] <= 4, (captures, stats)
    assert stats["replays"] == 2 * len(prompts) * (PAST_THE_WINDOW - 1), stats
