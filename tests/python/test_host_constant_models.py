"""Real third-party models whose forwards copy small host-made constants to the device, run
through GraphedForward the way their pipelines call them: diffusers' ChromaTransformer2DModel,
HiDreamImageTransformer2DModel, CogView4Transformer2DModel and QwenImageTransformer2DModel, and
transformers' FalconForCausalLM through `generate()` and graph_generation, each built from a tiny
config with random weights (nothing is downloaded). Their forwards make a CPU tensor and copy it
to the device mid-forward (`torch.tensor([...])` then `.to(device)`, `torch.tensor(...,
device=)`, `torch.as_tensor(n, device=)`, a CPU rotary table `.to(device)`, indexing by a Python
list), which a capture refuses unless graphed stages the copy through pinned memory;
test_inventory.py pins that down with a stand-in (HostConstants), these catch what only the real
forwards do. Each model skips when its package or class is missing. The CPU tests use the
emulated backend, whose replays do no work and return what the capture wrote: values are compared
on the capturing call, type, structure, shapes and dtypes on every call. The GPU tests feed new
inputs at every call and compare every output bitwise with eager, and check that the forward was
captured once, whole, with its host constants staged and no external read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import graphed
import pytest
import torch
from _gpu import on_gpu
from _outputs import assert_same_output
from graphed import GraphedForward

CPU_CALLS = 3
GPU_CALLS = 4
BATCH, TEXT = 2, 6  # a classifier-free-guidance batch, text tokens

# diffusers imports its own deprecated names (Transformer2DModelOutput, FluxPosEmbed from
# diffusers.models.embeddings): not graphed's concern.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*Transformer2DModelOutput:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*FluxPosEmbed:FutureWarning"),
]


def _randn(generator: torch.Generator, device: str, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=device, generator=generator)


# -- diffusers ChromaTransformer2DModel -----------------------------------------------------------
# Host constant: ChromaCombinedTimestepTextProjEmbeddings.forward embeds
# `torch.tensor([0] * batch_size)` on the CPU and moves the result `.to(device=timestep.device)`
# (diffusers/models/transformers/transformer_chroma.py:171).


def _chroma() -> torch.nn.Module:
    from diffusers import ChromaTransformer2DModel

    return ChromaTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        axes_dims_rope=(4, 6, 6),
        approximator_num_channels=8,
        approximator_hidden_dim=16,
        approximator_layers=1,
    )


def _latent_image_ids(height: int, width: int, device: str) -> torch.Tensor:
    """ChromaPipeline._prepare_latent_image_ids: (row, column) ids of the packed latent."""
    ids = torch.zeros(height, width, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(height)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(width)[None, :]
    return ids.reshape(height * width, 3).to(device)


def _chroma_inputs(model, device, generator) -> dict:
    """What ChromaPipeline passes its transformer in the denoising loop: packed latents (a 4x4
    grid of 2x2 patches of 4 channels), the timestep / 1000, T5 embeddings, 2-D text and image
    ids, the text mask (the first row padded) extended over the image tokens, and the pipeline's
    joint_attention_kwargs (an empty dict)."""
    height = width = 4
    mask = torch.ones(BATCH, TEXT + height * width, device=device)
    mask[0, int(torch.randint(1, TEXT, (1,), generator=generator, device=device)) : TEXT] = 0
    return {
        "hidden_states": _randn(generator, device, BATCH, height * width, 16),
        "timestep": torch.rand(BATCH, device=device, generator=generator),
        "encoder_hidden_states": _randn(generator, device, BATCH, TEXT, 16),
        "txt_ids": torch.zeros(TEXT, 3, device=device),
        "img_ids": _latent_image_ids(height, width, device),
        "attention_mask": mask,
        "joint_attention_kwargs": {},
        "return_dict": False,
    }


# -- diffusers HiDreamImageTransformer2DModel -----------------------------------------------------
# Host constant: patchify() makes `torch.tensor([patch_height, patch_width], dtype=torch.int64,
# device=device)` (diffusers/models/transformers/transformer_hidream_image.py:714).


def _hidream() -> torch.nn.Module:
    from diffusers import HiDreamImageTransformer2DModel

    return HiDreamImageTransformer2DModel(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        caption_channels=[16, 8],  # T5, Llama 3
        text_emb_dim=16,
        num_routed_experts=2,
        num_activated_experts=1,
        axes_dims_rope=(4, 2, 2),
        max_resolution=(8, 8),
        llama_layers=[0, 1],  # one Llama layer per block
    )


def _hidream_inputs(model, device, generator) -> dict:
    """What HiDreamImagePipeline passes: square latents, the scheduler's timestep per sample, T5
    embeddings, the stacked Llama 3 layers (layers, batch, tokens, dim), pooled CLIP embeddings
    and the pipeline's attention_kwargs (None unless the caller gives some)."""
    return {
        "hidden_states": _randn(generator, device, BATCH, 4, 8, 8),
        "timesteps": torch.rand(BATCH, device=device, generator=generator) * 1000,
        "encoder_hidden_states_t5": _randn(generator, device, BATCH, TEXT, 16),
        "encoder_hidden_states_llama3": _randn(generator, device, 2, BATCH, TEXT, 8),
        "pooled_embeds": _randn(generator, device, BATCH, 16),
        "attention_kwargs": None,
        "return_dict": False,
    }


# -- diffusers CogView4Transformer2DModel ---------------------------------------------------------
# Host constant: CogView4RotaryPosEmbed builds its rotary table on the CPU
# (transformer_cogview4.py:548-580) and apply_rotary_emb moves it per call,
# `cos.to(x.device), sin.to(x.device)` (diffusers/models/embeddings.py:984).


def _cogview4() -> torch.nn.Module:
    from diffusers import CogView4Transformer2DModel

    return CogView4Transformer2DModel(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        text_embed_dim=16,
        time_embed_dim=16,
        condition_dim=8,
        pos_embed_max_size=8,
        sample_size=8,
        rope_axes_dim=(8, 8),
    )


def _cogview4_inputs(model, device, generator) -> dict:
    """What CogView4Pipeline passes: latents, the timestep per sample, GLM embeddings, and the
    SDXL-style size conditions, one row per sample."""
    size = torch.tensor([[64.0, 64.0]], device=device).repeat(BATCH, 1)
    return {
        "hidden_states": _randn(generator, device, BATCH, 4, 8, 8),
        "encoder_hidden_states": _randn(generator, device, BATCH, TEXT, 16),
        "timestep": torch.rand(BATCH, device=device, generator=generator) * 1000,
        "original_size": size,
        "target_size": size.clone(),
        "crop_coords": torch.zeros(BATCH, 2, device=device),
        "attention_kwargs": None,
        "return_dict": False,
    }


# -- diffusers QwenImageTransformer2DModel --------------------------------------------------------
# Host constant: compute_text_seq_len_from_mask, given a text mask, makes
# `torch.as_tensor(text_seq_len, device=...)` (diffusers/models/transformers/
# transformer_qwenimage.py:169).


def _qwen_image() -> torch.nn.Module:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        axes_dims_rope=(4, 6, 6),
    )


def _qwen_image_inputs(model, device, generator) -> dict:
    """What QwenImagePipeline passes: packed latents (a 4x4 grid of 2x2 patches of 4 channels),
    the timestep / 1000, no guidance (not a guidance-distilled model), the text mask (the pipeline
    passes one when a prompt is padded: the first row here), Qwen2.5-VL embeddings, the image
    shapes per sample and the pipeline's attention_kwargs (an empty dict)."""
    mask = torch.ones(BATCH, TEXT, dtype=torch.long, device=device)
    mask[0, int(torch.randint(1, TEXT, (1,), generator=generator, device=device)) :] = 0
    return {
        "hidden_states": _randn(generator, device, BATCH, 16, 16),
        "timestep": torch.rand(BATCH, device=device, generator=generator),
        "guidance": None,
        "encoder_hidden_states_mask": mask,
        "encoder_hidden_states": _randn(generator, device, BATCH, TEXT, 16),
        "img_shapes": [[(1, 4, 4)]] * BATCH,
        "attention_kwargs": {},
        "return_dict": False,
    }


@dataclass(frozen=True)
class Case:
    package: str
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.nn.Module, str, torch.Generator], dict]
    # The tensors the capture reads that are neither kwargs nor module state, as inventory()
    # describes them before " read at ", and the file that reads them.
    externals: tuple[str, ...] = ()
    read_in: str = ""


CASES = {
    "Chroma": Case("diffusers", "ChromaTransformer2DModel", _chroma, _chroma_inputs),
    "HiDream": Case("diffusers", "HiDreamImageTransformer2DModel", _hidream, _hidream_inputs),
    "CogView4": Case("diffusers", "CogView4Transformer2DModel", _cogview4, _cogview4_inputs),
    # QwenEmbedRope keeps its device copies of the rotary tables in a functools.lru_cache
    # (_get_device_freqs and _compute_video_freqs, transformer_qwenimage.py:237 and :299), not on
    # the module: the capture reads them as externals. The cache holds them for good, so they
    # are never freed and the graph stays right.
    "QwenImage": Case(
        "diffusers",
        "QwenImageTransformer2DModel",
        _qwen_image,
        _qwen_image_inputs,
        externals=("a complex64[16, 8] tensor", "a complex64[4096, 8] tensor"),
        read_in="transformer_qwenimage.py",
    ),
}
# HiDream's forward cannot be captured whole on a GPU at any size
# (test_hidream_runs_in_regions_bitwise_equal_to_eager_on_the_gpu says why).
CAPTURED_WHOLE = [name for name in CASES if name != "HiDream"]


def _case(name: str) -> Case:
    """The model's case, skipped with the reason when its package or class is missing."""
    chosen = CASES[name]
    package = pytest.importorskip(
        chosen.package,
        reason=f"{chosen.package} is not installed (optional: pip install {chosen.package})",
    )
    if not hasattr(package, chosen.name):
        pytest.skip(f"{chosen.package} {package.__version__} has no {chosen.name}")
    return chosen


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return _case(request.param)


@pytest.fixture(params=CAPTURED_WHOLE, ids=CAPTURED_WHOLE)
def whole_case(request: pytest.FixtureRequest) -> Case:
    return _case(request.param)


def _build(case: Case, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return case.build().to(device).eval()


def _eager(model: torch.nn.Module, kwargs: dict):
    with torch.no_grad():
        return model(**kwargs)


def test_the_forward_is_captured_once_and_replayed_on_the_emulated_backend(case, emulated_backend):
    model = _build(case, "cpu")
    kwargs = case.inputs(model, "cpu", torch.Generator().manual_seed(1))
    want = _eager(model, kwargs)
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    for call in range(CPU_CALLS):
        assert_same_output(gf(**kwargs), want, values=call == 0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1, stats


def _calls_with_new_inputs_on_the_gpu(case: Case) -> GraphedForward:
    """GPU_CALLS calls, each with new inputs, each output bitwise eager's; the runner."""
    model = _build(case, "cuda")
    gf = GraphedForward(model, device="cuda")
    for seed in range(GPU_CALLS):
        kwargs = case.inputs(model, "cuda", torch.Generator(device="cuda").manual_seed(seed))
        want = _eager(model, kwargs)
        assert_same_output(gf(**kwargs), want, values=True)
    return gf


@on_gpu
def test_the_forward_is_captured_whole_and_every_call_matches_eager_bitwise_on_the_gpu(
    whole_case,
):
    gf = _calls_with_new_inputs_on_the_gpu(whole_case)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1, stats
    assert stats["staged_constants"] >= 1, stats
    externals = graphed.inventory(gf)[-1]["externals"]
    assert sorted(e.split(" read at ")[0] for e in externals) == list(whole_case.externals)
    assert all(whole_case.read_in in e for e in externals), externals


@on_gpu
def test_hidream_runs_in_regions_bitwise_equal_to_eager_on_the_gpu():
    """HiDream's forward synchronizes wherever its pipeline calls it: its mixture-of-experts
    layers read the routing counts on the host (`flat_expert_indices.bincount().cpu()`,
    transformer_hidream_image.py:389), and unpatchify() slices and reshapes the output by the
    device tensor img_sizes that patchify() made from its host constant (line 696). The whole
    forward is refused, naming the synchronization, and runs in regions: every output stays
    eager's."""
    gf = _calls_with_new_inputs_on_the_gpu(_case("HiDream"))
    stats = gf.stats()
    assert not stats["enabled"] and stats["disabled_cause"] == "capture_failed", stats
    assert "synchronizing CUDA operation" in stats["disabled_reason"], stats
    states = {entry["path"]: entry["state"] for entry in gf.regions()}
    # The blocks holding a mixture of experts are split into their children; the embedders,
    # caption projections and final layer are graphed.
    assert (states["double_stream_blocks.0"], states["single_stream_blocks.0"]) == ("split",) * 2
    assert states["x_embedder"] == states["final_layer"] == "graphed", states


# -- transformers FalconForCausalLM through generate() ---------------------------------------------
# Host constant: FalconAttention._split_heads indexes the fused projection by a Python list,
# `fused_qkv[..., [-2], :]` and `fused_qkv[..., [-1], :]` (multi-query attention, the default;
# transformers/models/falcon/modeling_falcon.py:283), which copies the index to the device.

PROMPT, NEW_TOKENS, REQUESTS = 5, 8, 2


def _falcon() -> torch.nn.Module:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (optional: pip install transformers)"
    )
    if not hasattr(transformers, "FalconForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no FalconForCausalLM")
    config = transformers.FalconConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        eos_token_id=None,  # every request makes all of its new tokens
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.FalconForCausalLM(config).eval()


def _prompt(device: str, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, 128, (BATCH, PROMPT), generator=generator).to(device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _generate(model, prompt: dict, **options) -> torch.Tensor:
    return model.generate(
        **prompt,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        cache_implementation="static",
        **options,
    )


def _decode_steps(requests: int) -> int:
    """Forwards after the prefill: the first new token comes from the prefill's logits."""
    return requests * (NEW_TOKENS - 1)


def test_falcon_decode_steps_replay_one_graph_on_the_emulated_backend(emulated_backend):
    """One prompt, asked for twice: the prefill is eager and the first decode step is the
    capture's own forward, both eager's tokens on any backend (later emulated replays repeat the
    capture's token, so a second prompt would get the first one's)."""
    model = _falcon()
    prompt = _prompt("cpu", 1)
    want = _generate(model, prompt)
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    for _ in range(REQUESTS):
        got = _generate(model, prompt)
        assert got.shape == want.shape
        assert torch.equal(got[:, : PROMPT + 2], want[:, : PROMPT + 2])
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, _decode_steps(REQUESTS)), stats
    assert (stats["eager_forwards"], stats["eager_calls"]) == (REQUESTS, 0), stats
    assert stats["api_mismatches"] == 0, stats


@on_gpu
def test_falcon_greedy_tokens_equal_eager_at_every_decode_step_on_the_gpu():
    model = _falcon().cuda()
    prompts = [_prompt("cuda", seed) for seed in range(1, REQUESTS + 1)]
    # On a GPU with a static cache generate() would torch.compile its decode step: eager is
    # asked for.
    wants = [_generate(model, prompt, disable_compile=True) for prompt in prompts]
    generation = graphed.graph_generation(model, device="cuda")
    for index, (prompt, want) in enumerate(zip(prompts, wants, strict=True)):
        assert torch.equal(_generate(model, prompt), want), f"request {index}"
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, _decode_steps(REQUESTS)), stats
    assert (stats["eager_calls"], stats["api_mismatches"]) == (0, 0), stats
    assert stats["staged_constants"] >= 1, stats
    assert graphed.inventory(generation.graphed)[-1]["externals"] == []
