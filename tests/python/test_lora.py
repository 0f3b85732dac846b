"""LoRA adapters switched between calls: never a stale replay.

Every workflow users run to switch adapters (bench/lora_workflow.py: diffusers' PeftAdapterMixin on
tiny random SD3 and Flux transformers, peft's get_peft_model on a plain module), each step's next
two graphed calls against the model's own, and a Flux pipeline's own LoRA API
(`save_lora_weights`, `load_lora_weights`, `set_adapters`, `fuse_lora`, `unload_lora_weights`)
through graph_pipeline against an identical eager pipeline: on the CPU with the emulated backend
(whose replay returns what the capture wrote, so a step graphed missed returns the previous
adapters' result, as a stale device graph would) and bitwise on the GPU. A step that changes what
the forward computes with recaptures once; a hot-swap (tensors updated in place) replays without
one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import graphed
import pytest
import torch

diffusers = pytest.importorskip("diffusers")
peft = pytest.importorskip("peft")
lora_workflow = pytest.importorskip("lora_workflow")


def _check(results, replays_compute: bool) -> None:
    """Each step recaptured as it must and gave eager's output; without `replays_compute` (the
    emulated backend) an in-place step's output is the GPU test's to check, as the emulated
    replay returns what the capture wrote."""
    for result in results:
        wanted = 1 if result.expected_recapture else 0
        assert result.captures == wanted, (result.step, result.captures)
        if replays_compute or result.expected_recapture:
            assert result.bitwise, f"{result.step}: largest difference {result.largest_difference}"


@pytest.mark.parametrize("family", ["sd3", "flux", "peft"])
def test_every_lora_step_gives_eagers_output(emulated_backend, family):
    results = lora_workflow.run_workflow(family, torch.device("cpu"), backend=emulated_backend)
    _check(results, replays_compute=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["sd3", "flux", "peft"])
def test_every_lora_step_gives_eagers_output_bitwise_on_the_device(family):
    _check(lora_workflow.run_workflow(family, torch.device("cuda")), replays_compute=True)


def _pipeline_lora_steps(device: str, backend: str | None) -> list[tuple[str, bool, int]]:
    """Adapters loaded and switched through a Flux pipeline's own LoRA API (save_lora_weights,
    load_lora_weights, set_adapters, fuse_lora, unfuse_lora, unload_lora_weights) on a pipeline
    graph_pipeline graphed and on an identical eager one: for each step, whether one pipeline step
    gave the eager pipeline's images and how many captures it caused."""
    import tempfile

    import graphed
    from diffusers import FluxPipeline
    from peft.utils import get_peft_model_state_dict
    from test_diffusers_pipelines import _build, _run

    graphed_pipe, call = _build("flux", device)
    eager_pipe, _ = _build("flux", device)
    steps = []
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(2)
        eager_pipe.transformer.add_adapter(lora_workflow._config(alpha=8), "style")
        layers = get_peft_model_state_dict(eager_pipe.transformer, adapter_name="style")
        FluxPipeline.save_lora_weights(folder, transformer_lora_layers=layers)
        eager_pipe.transformer.delete_adapters("style")
        runner = graphed.graph_pipeline(graphed_pipe, backend=backend)["transformer"]
        try:
            actions = [
                ("graph_pipeline", lambda pipe: None),
                ("load_lora_weights", lambda pipe: pipe.load_lora_weights(folder, "style")),
                ("set_adapters(style, 0.5)", lambda pipe: pipe.set_adapters("style", 0.5)),
                ("fuse_lora(lora_scale=0.7)", lambda pipe: pipe.fuse_lora(lora_scale=0.7)),
                ("unfuse_lora()", lambda pipe: pipe.unfuse_lora()),
                ("unload_lora_weights()", lambda pipe: pipe.unload_lora_weights()),
            ]
            for name, action in actions:
                action(graphed_pipe)
                action(eager_pipe)
                captures = runner.stats()["captures"]
                same = torch.equal(_run(graphed_pipe, call, steps=1), _run(eager_pipe, call, 1))
                steps.append((name, same, runner.stats()["captures"] - captures))
        finally:
            graphed.ungraph_pipeline(graphed_pipe)
    return steps


def test_a_pipelines_lora_api_gives_eagers_images(emulated_backend):
    steps = _pipeline_lora_steps("cpu", emulated_backend)
    assert steps == [(name, True, 1) for name, _, _ in steps], steps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_pipelines_lora_api_gives_eagers_images_bitwise_on_the_device():
    steps = _pipeline_lora_steps("cuda", None)
    assert steps == [(name, True, 1) for name, _, _ in steps], steps


_ROTATION = [
    ("set_adapter(a)", lambda m: m.set_adapter("a")),
    ("set_adapter(b)", lambda m: m.set_adapter("b")),
    ("a and b active", lambda m: m.base_model.set_adapter(["a", "b"])),
]


def test_an_adapter_rotation_captures_each_state_once_then_replays(emulated_backend):
    """A multi-tenant rotation (one adapter state per request, three states in turn): each state
    is captured on its first request and replayed on every later one (graphed._watch.States)."""
    import graphed

    model, inputs = lora_workflow._peft_model()
    model.eval()
    gf = graphed.GraphedForward(model, device="cpu", backend=emulated_backend)
    x = inputs(torch.device("cpu"))
    for request in range(4):
        for name, switch in _ROTATION:
            switch(model)
            for _ in range(3):  # the emulated replay returns what the capture wrote: same input
                with torch.no_grad():
                    want = model(**x)
                torch.testing.assert_close(gf(**x), want, rtol=0, atol=0, msg=name)
        stats = gf.stats()
        assert stats["captures"] == 3, (request, stats)
        assert stats["graphs"] == 3 and stats["enabled"]


def test_a_diffusers_rotation_captures_three_states_in_its_first_rotation_only(emulated_backend):
    """The issue's rotation (bench/lora_workflow.run_rotation: SD3, set_adapters("a"), a and b
    weighted, disable_lora, one state per request): the first rotation captures each state once,
    the 21 requests after it capture nothing. The emulated replay returns what the capture wrote,
    so values are the GPU test's."""
    result = lora_workflow.run_rotation(torch.device("cpu"), backend=emulated_backend)
    assert result.captures_in_first_rotation == 3, result
    assert result.captures_after_first_rotation == 0, result
    assert result.graphs == 3, result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_diffusers_rotation_replays_every_state_bitwise_on_the_device():
    result = lora_workflow.run_rotation(torch.device("cuda"))
    assert result.bitwise, result
    assert (result.captures_in_first_rotation, result.captures_after_first_rotation) == (3, 0)


def test_a_switch_records_again_only_the_layers_it_changed(emulated_backend):
    """An adapter switch on the SD3 transformer records again only the modules that read what
    the native watch saw change (graphed._baked.BakedState from a previous one): fewer than a
    tenth of the modules, and the same record and watch as recording the whole module."""
    from graphed import _baked

    model, make_inputs = lora_workflow.sd3_transformer()
    model.eval()
    with tempfile.TemporaryDirectory() as folder:
        lora_workflow._save_both(model, Path(folder))
    gf = graphed.GraphedForward(model, device="cpu", backend=emulated_backend)
    inputs = make_inputs(torch.device("cpu"))
    with torch.no_grad():
        for request in range(3 * len(lora_workflow.ROTATION)):
            lora_workflow.ROTATION[request % len(lora_workflow.ROTATION)][1](model)
            gf(**inputs)
            baked, whole = gf._watch.baked, _baked.BakedState(model)
            assert baked.records == whole.records, request
            for kind in ("dicts", "tensors", "sequences"):
                got, want = getattr(baked, kind), getattr(whole, kind)
                assert {id(item) for item in got} == {id(item) for item in want}, (request, kind)
            if request >= len(lora_workflow.ROTATION):
                assert baked.recorded_paths is not None, request
                assert 0 < len(baked.recorded_paths) < len(baked.modules) / 10, request
    assert gf.stats()["captures"] == len(lora_workflow.ROTATION)
