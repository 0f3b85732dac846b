"""Why this exists: graphed dropped into real diffusers pipelines, run through `pipe(...)` itself.

Three pipelines are built from tiny random components in code (no downloads; the CLIP and T5
tokenizers are word-level vocabularies wrapped in PreTrainedTokenizerFast): DiTPipeline (latents
passed positionally), StableAudioPipeline (positional latents and timestep, rotary embeddings
passed as CPU tensors) and FluxPipeline (flow matching, every input a keyword). Each runs once
eager and once with graphed in, both ways a user puts it there: `pipe.transformer =
GraphedForward(pipe.transformer, ...)`, and `graphed.graph_pipeline(pipe)`, which keeps the
component an nn.Module so that the pipeline's registry, config, dtype, device and `to` see it.

What the CPU can show honestly: the emulated backend captures nothing (a replay returns what the
capture-time forward wrote), so here a graphed pipeline equals eager bitwise where the runner is
disabled (every step eager through graphed's call path) or where one step runs (the capture's
forward is the step), and its counters show that one graph serves every later step. On the GPU
(marked `gpu`) the graphed pipeline equals eager bitwise over several steps.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")

import graphed  # noqa: E402
from _compiling import CompilingBackend  # noqa: E402
from graphed import GraphedForward  # noqa: E402

_WORDS = ["<pad>", "</s>", "<unk>", "a", "hammer", "hitting", "wooden", "surface", "photo", "of"]
_PROMPT = "a hammer hitting a wooden surface"


def _tokenizer(max_length: int) -> Any:
    """A word-level tokenizer over a small vocabulary, built in code; it serves for both CLIP's
    and T5's place (the pipelines only call it, pad it and read model_max_length)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(_WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
    )


def _t5_encoder() -> Any:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=32, d_model=32, d_kv=8, d_ff=37, num_layers=2))


def _vae(latent_channels: int, **extra: Any) -> Any:
    """A one-block AutoencoderKL (an image at the latents' size) for the image pipelines."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(4,), latent_channels=latent_channels, norm_num_groups=1, **extra
    )


def _dit() -> tuple[Any, dict]:
    from diffusers import DiTPipeline, DiTTransformer2DModel, DPMSolverMultistepScheduler

    # out_channels twice the latents': the model predicts noise and variance, as DiT-XL does.
    sizes = {"sample_size": 8, "num_layers": 2, "out_channels": 8}
    transformer = DiTTransformer2DModel(attention_head_dim=8, num_attention_heads=2, **sizes)
    scheduler = DPMSolverMultistepScheduler()
    pipe = DiTPipeline(transformer=transformer, vae=_vae(latent_channels=4), scheduler=scheduler)
    return pipe, {"class_labels": [1], "output_type": "pt"}


def _stable_audio() -> tuple[Any, dict]:
    from diffusers import (
        AutoencoderOobleck,
        EDMDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
        StableAudioProjectionModel,
    )

    latent = 3  # the VAE's latent channels: the transformer's input and output
    # What the projection model hands the transformer: text rows, and the global state (seconds
    # start and end, side by side).
    conditioning = 4
    text_encoder = _t5_encoder()
    projection = StableAudioProjectionModel(
        text_encoder_dim=text_encoder.config.d_model,
        conditioning_dim=conditioning,
        min_value=0,
        max_value=32,
    )
    transformer = StableAudioDiTModel(
        sample_size=4,
        num_layers=2,
        attention_head_dim=4,
        time_proj_dim=8,
        in_channels=latent,
        out_channels=latent,
        **dict.fromkeys(("cross_attention_dim", "cross_attention_input_dim"), conditioning),
        global_states_input_dim=2 * conditioning,
    )
    vae = AutoencoderOobleck(
        encoder_hidden_size=6,
        downsampling_ratios=[1, 2],
        channel_multiples=[2, 4],
        decoder_channels=3,
        decoder_input_channels=latent,
        sampling_rate=4,
    )
    scheduler = EDMDPMSolverMultistepScheduler(
        prediction_type="v_prediction", sigma_data=1.0, sigma_schedule="exponential"
    )
    pipe = StableAudioPipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=_tokenizer(16),
        projection_model=projection,
    )
    return pipe, {"prompt": _PROMPT, "guidance_scale": 6.0, "output_type": "pt"}


def _flux() -> tuple[Any, dict]:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    # One head's dimensions, split over the rotary axes; the text widths are CLIP's and T5's.
    heads = {"attention_head_dim": 16, "num_attention_heads": 2, "axes_dims_rope": [4, 4, 8]}
    text = {"joint_attention_dim": 32, "pooled_projection_dim": 32}
    transformer = FluxTransformer2DModel(
        in_channels=4, num_layers=1, num_single_layers=1, **heads, **text
    )
    clip = CLIPTextModel(
        CLIPTextConfig(vocab_size=32, hidden_size=32, num_attention_heads=4, num_hidden_layers=2)
    )
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_vae(latent_channels=1, shift_factor=0.0609, scaling_factor=1.5035),
        text_encoder=clip,
        tokenizer=_tokenizer(77),
        text_encoder_2=_t5_encoder(),
        tokenizer_2=_tokenizer(16),
        transformer=transformer,
    )
    size = {"height": 8, "width": 8, "max_sequence_length": 16}
    return pipe, {"prompt": _PROMPT, "guidance_scale": 5.0, "output_type": "pt", **size}


PIPELINES: dict[str, Callable[[], tuple[Any, dict]]] = {
    "dit": _dit,
    "stable_audio": _stable_audio,
    "flux": _flux,
}


def _build(kind: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, dict]:
    torch.manual_seed(0)
    pipe, call = PIPELINES[kind]()
    pipe.to(device, dtype)
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe, call


def _output(result: Any) -> torch.Tensor:
    """The images or audio a pipeline returned."""
    return result.images if hasattr(result, "images") else result.audios


def _run(pipe: Any, call: dict, steps: int, **extra: Any) -> torch.Tensor:
    generator = torch.Generator("cpu").manual_seed(0)
    return _output(pipe(**call, num_inference_steps=steps, generator=generator, **extra))


def _counts(runner: GraphedForward) -> tuple[int, int, int]:
    stats = runner.stats()
    return stats["captures"], stats["replays"], stats["eager_calls"]


@contextlib.contextmanager
def _assigned(pipe: Any, **options: Any) -> Iterator[GraphedForward]:
    """`pipe.transformer = GraphedForward(pipe.transformer, ...)`, undone afterwards."""
    original = pipe.transformer
    runner = GraphedForward(original, **options)
    pipe.transformer = runner
    try:
        yield runner
    finally:
        pipe.transformer = original


# -- CPU, emulated backend ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_assigned_disabled_runner_equals_eager(kind: str, emulated_backend: str) -> None:
    """Every step through graphed's call path (positional arguments bound, None and bool options
    keyed, the ModelOutput or tuple rebuilt), run eager by a disabled runner: eager's output."""
    pipe, call = _build(kind)
    eager = _run(pipe, call, steps=3)
    with _assigned(pipe, device="cpu", backend=emulated_backend, enabled=False) as runner:
        graphed_output = _run(pipe, call, steps=3)
    assert torch.equal(graphed_output, eager)
    assert _counts(runner) == (0, 0, 3)


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_assigned_runner_captures_once_and_replays_every_later_step(
    kind: str, emulated_backend: str
) -> None:
    """One step is the capture's own forward: eager's output. Over four steps the first captures
    and every step replays that graph (a capture is followed by its first replay, as on a device
    where capturing runs nothing): every step has the key of the first."""
    pipe, call = _build(kind)
    eager = _run(pipe, call, steps=1)
    with _assigned(pipe, device="cpu", backend=emulated_backend) as runner:
        assert torch.equal(_run(pipe, call, steps=1), eager)
        assert _counts(runner) == (1, 1, 0)
    with _assigned(pipe, device="cpu", backend=emulated_backend) as runner:
        _run(pipe, call, steps=4)
        assert _counts(runner) == (1, 4, 0)


def test_assigned_runner_answers_for_the_model(emulated_backend: str) -> None:
    """What the pipeline reads off its transformer (config, dtype, device, methods such as
    cache_context) comes from the model through the GraphedForward; the registry lists it."""
    pipe, call = _build("flux")
    model = pipe.transformer
    with _assigned(pipe, device="cpu", backend=emulated_backend) as runner:
        assert pipe.components["transformer"] is runner
        assert runner.config is model.config
        assert runner.dtype == model.dtype and runner.device == model.device
        assert _run(pipe, call, steps=2).shape[0] == 1


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_graph_pipeline_equals_eager(kind: str, emulated_backend: str) -> None:
    pipe, call = _build(kind)
    eager_one, eager_three = _run(pipe, call, steps=1), _run(pipe, call, steps=3)
    runners = graphed.graph_pipeline(pipe, backend=emulated_backend)
    try:
        assert torch.equal(_run(pipe, call, steps=1), eager_one)
        assert _counts(runners["transformer"]) == (1, 1, 0)
        runners["transformer"].disable("the test compares eager steps")
        assert torch.equal(_run(pipe, call, steps=3), eager_three)
        assert _counts(runners["transformer"]) == (1, 1, 3)
    finally:
        graphed.ungraph_pipeline(pipe)


def test_graph_pipeline_keeps_the_pipeline_view(emulated_backend: str) -> None:
    """The component stays the model: registry, config (model_index), dtype, device and
    pipe.to(dtype) see it as before, unlike an assigned GraphedForward, which pipe.to skips."""
    pipe, call = _build("dit")
    model = pipe.transformer
    config_before = pipe.config["transformer"]
    runners = graphed.graph_pipeline(pipe, backend=emulated_backend)
    try:
        assert pipe.transformer is model and pipe.components["transformer"] is model
        assert pipe.config["transformer"] == config_before == ("diffusers", "DiTTransformer2DModel")
        assert runners["transformer"].module is model
        assert runners["transformer"].device == torch.device("cpu")
        assert pipe.dtype == torch.float32 and pipe.device == torch.device("cpu")
        pipe.to(torch.float64)
        assert model.dtype == torch.float64 and pipe.dtype == torch.float64
        assert _run(pipe, call, steps=2).dtype == torch.float64
        assert _counts(runners["transformer"]) == (1, 2, 0)
        with pytest.raises(ValueError, match="graphed already"):
            graphed.graph_pipeline(pipe, backend=emulated_backend)
    finally:
        graphed.ungraph_pipeline(pipe)
    assert model._compiled_call_impl is None
    _run(pipe, call, steps=1)
    assert _counts(runners["transformer"]) == (1, 2, 0)


def test_graph_pipeline_refuses_what_is_not_a_module(emulated_backend: str) -> None:
    pipe, _ = _build("dit")
    with pytest.raises(TypeError, match="'scheduler' is .*not an nn.Module"):
        graphed.graph_pipeline(pipe, components=("scheduler",), backend=emulated_backend)


@pytest.mark.parametrize(
    ("kind", "missing", "what", "listed"),
    [
        ("dit", "unet", "DiTPipeline has no attribute 'unet'", "'transformer', 'vae'"),
        (
            "flux",
            "image_encoder",
            "FluxPipeline.image_encoder is None",
            "'vae', 'text_encoder', 'text_encoder_2', 'transformer'",
        ),
    ],
    ids=["absent", "none"],
)
def test_graph_pipeline_names_a_missing_component_and_what_could_be_graphed(
    emulated_backend: str, kind: str, missing: str, what: str, listed: str
) -> None:
    """A component the pipeline lacks (DiT has no unet) or registered as None (Flux's optional
    image encoder) is refused as missing, not as "'unet' is NoneType", with the components
    graph_pipeline could take."""
    pipe, _ = _build(kind)
    with pytest.raises(TypeError) as refused:
        graphed.graph_pipeline(pipe, components=(missing,), backend=emulated_backend)
    message = str(refused.value)
    assert message.startswith(f"graphed: the pipeline has no {missing!r} component ({what})")
    assert f"(diffusers {diffusers.__version__})" in message, message
    assert "NoneType" not in message, message
    assert f"nn.Module components, which graph_pipeline can graph, are {listed} " in message
    assert "graph_pipeline(pipe, components=('transformer',))" in message, message
    assert "_compiled_call_impl" not in pipe.transformer.__dict__  # nothing was graphed


def test_graph_pipeline_refuses_a_torch_that_would_not_route_calls_to_it(
    emulated_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """graph_pipeline reaches a component's calls through nn.Module's _compiled_call_impl slot: a
    torch without it would run every call eager unseen, so graph_pipeline refuses, naming torch's
    version, before it changes anything."""
    pipe, _ = _build("dit")
    monkeypatch.delattr(torch.nn.Module, "_compiled_call_impl")
    with pytest.raises(RuntimeError, match=f"torch {re.escape(torch.__version__)} does not have"):
        graphed.graph_pipeline(pipe, backend=emulated_backend)
    assert "_compiled_call_impl" not in pipe.transformer.__dict__


@pytest.mark.parametrize("install", ["assigned", "graph_pipeline"])
def test_progress_bar_and_step_callbacks(
    install: str, emulated_backend: str, capsys: pytest.CaptureFixture
) -> None:
    """The pipeline's progress bar counts every step and callback_on_step_end sees each step's
    latents, with graphed in either way."""
    pipe, call = _build("flux")
    pipe.set_progress_bar_config(disable=False)
    seen: list[tuple[int, tuple[int, ...]]] = []

    def on_step_end(pipeline: Any, step: int, timestep: Any, tensors: dict) -> dict:
        assert pipeline is pipe
        seen.append((step, tuple(tensors["latents"].shape)))
        return tensors

    if install == "assigned":
        context: Any = _assigned(pipe, device="cpu", backend=emulated_backend)
    else:
        runners = graphed.graph_pipeline(pipe, backend=emulated_backend)
        context = contextlib.nullcontext(runners["transformer"])
    try:
        with context as runner:
            _run(pipe, call, steps=3, callback_on_step_end=on_step_end)
    finally:
        graphed.ungraph_pipeline(pipe)
    assert [step for step, _ in seen] == [0, 1, 2]
    assert "3/3" in capsys.readouterr().err
    assert _counts(runner) == (1, 3, 0)


def test_graph_pipeline_with_compile_compiles_the_repeated_blocks_inside_the_first_step(
    emulated_backend: str,
) -> None:
    """graph_pipeline(compile=...): Flux's repeated blocks compiled by regional compilation (one
    compile per kind of block), in the first step's probe, under one whole-forward graph; its
    disabled runner gives eager's images through the compiled blocks."""
    from graphed import _phases

    pipe, call = _build("flux")
    eager_one, eager_three = _run(pipe, call, steps=1), _run(pipe, call, steps=3)
    backend = CompilingBackend()
    runners = graphed.graph_pipeline(pipe, backend=emulated_backend, compile={"backend": backend})
    try:
        assert torch.equal(_run(pipe, call, steps=1), eager_one)
        runner = runners["transformer"]
        assert runner.stats()["enabled"], runner.disabled_reason
        assert _counts(runner) == (1, 1, 0)
        kinds = len(pipe.transformer._repeated_blocks)
        assert set(backend.phases) == {_phases.PHASE_PROBE}, backend.phases
        assert 1 <= len(backend.phases) <= kinds, backend.phases
        model = pipe.transformer  # its own call slot holds graphed's router
        blocks = [m for m in model.modules() if m is not model and "_compiled_call_impl" in vars(m)]
        assert blocks and all(type(m).__name__ in model._repeated_blocks for m in blocks)
        runner.disable("the test compares eager steps")
        assert torch.equal(_run(pipe, call, steps=3), eager_three)
    finally:
        graphed.ungraph_pipeline(pipe)


def test_graph_pipeline_refuses_a_compile_mode_with_graphs_of_its_own(emulated_backend) -> None:
    pipe, _ = _build("dit")
    with pytest.raises(ValueError, match="CUDA graphs of its own"):
        graphed.graph_pipeline(pipe, compile={"mode": "reduce-overhead"})
    assert "_compiled_call_impl" not in vars(pipe.transformer)


# -- GPU: bitwise equal to eager over several steps ----------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("install", ["assigned", "graph_pipeline"])
@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_gpu_pipeline_bitwise_equal_to_eager(kind: str, install: str, dtype: torch.dtype) -> None:
    pipe, call = _build(kind, device="cuda", dtype=dtype)
    steps = 4
    eager = _run(pipe, call, steps=steps)
    # StableAudioPipeline passes its rotary embeddings as CPU tensors, which the model moves.
    options = {"cpu_inputs": "to_device"}
    if install == "assigned":
        with _assigned(pipe, device="cuda", **options) as runner:
            first, second = _run(pipe, call, steps=steps), _run(pipe, call, steps=steps)
    else:
        runner = graphed.graph_pipeline(pipe, **options)["transformer"]
        try:
            first, second = _run(pipe, call, steps=steps), _run(pipe, call, steps=steps)
        finally:
            graphed.ungraph_pipeline(pipe)
    assert runner.stats()["enabled"], runner.disabled_reason
    assert _counts(runner) == (1, 2 * steps - 1, 0)  # the first call: its last warm-up's outputs
    assert torch.equal(first, eager) and torch.equal(second, eager)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_flux_pipeline_with_regional_compile_equals_the_compiled_pipeline() -> None:
    """graph_pipeline(compile=True) on a Flux pipeline: inductor compiles the repeated blocks
    inside the first step (nothing by hand), and the images equal the same compiled blocks run
    without graphs, bitwise, over two requests."""
    pipe, call = _build("flux", device="cuda", dtype=torch.bfloat16)
    steps = 4
    runner = graphed.graph_pipeline(pipe, compile=True)["transformer"]
    try:
        first, second = _run(pipe, call, steps=steps), _run(pipe, call, steps=steps)
        stats = runner.stats()
        assert stats["enabled"], stats["disabled_reason"]
        assert _counts(runner) == (1, 2 * steps - 1, 0)
        runner.disable("the test's reference: the compiled blocks without graphs")
        compiled_alone = _run(pipe, call, steps=steps)
    finally:
        graphed.ungraph_pipeline(pipe)
    assert torch.equal(first, compiled_alone) and torch.equal(second, compiled_alone)
