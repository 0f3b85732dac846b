"""Optional tests that run real third-party models through GraphedForward, called the way their
users call them: diffusers' StableAudioDiTModel (the audio DiT graphed is built for) and
DiTTransformer2DModel, and transformers' LlamaForCausalLM, each built from a tiny config with
random weights (nothing is downloaded) and returning its ModelOutput (the default
return_dict=True), which graphed keys, captures and rebuilds through torch.utils._pytree.
test_containers.py covers the same containers with stand-ins; these catch what only the real
classes and forwards do (their pytree registration, transformers' capture-aware mask builder,
diffusers' rotary embeddings as a tuple kwarg). Each model skips when its package is missing. The
CPU tests use the emulated backend, whose replays do no work and return what the capture wrote:
values are compared on the capturing call, type, keys, shapes and dtypes on every call. The GPU
tests compare every call's output bitwise with eager."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import torch
from _outputs import assert_same_output
from graphed import GraphedForward

CALLS = 3

# diffusers imports its own deprecated Transformer2DModelOutput alias: not graphed's concern.
pytestmark = pytest.mark.filterwarnings("ignore:.*Transformer2DModelOutput:FutureWarning")


def _stable_audio_dit() -> torch.nn.Module:
    from diffusers import StableAudioDiTModel

    return StableAudioDiTModel(
        sample_size=8,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        num_key_value_attention_heads=1,
        out_channels=4,
        cross_attention_dim=16,
        time_proj_dim=16,
        global_states_input_dim=16,
        cross_attention_input_dim=16,
    )


def _stable_audio_inputs(model, device, generator) -> dict:
    """What StableAudioPipeline passes its transformer on a step with classifier-free guidance: a
    batch of two latents, one timestep, prompt and duration embeddings, and the rotary embedding
    (a (cos, sin) tuple) over the latent length plus the prepended global token."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    config = model.config
    batch, length, prompt_length = 2, 8, 5

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=generator)

    rotary_embedding = get_1d_rotary_pos_embed(
        config.attention_head_dim // 2, length + 1, use_real=True, repeat_interleave_real=False
    )
    return {
        "hidden_states": randn(batch, config.in_channels, length),
        "timestep": torch.rand(1, device=device, generator=generator) * 1000,
        "encoder_hidden_states": randn(batch, prompt_length, config.cross_attention_input_dim),
        "global_hidden_states": randn(batch, 1, config.global_states_input_dim),
        "rotary_embedding": tuple(part.to(device) for part in rotary_embedding),
    }


def _dit() -> torch.nn.Module:
    from diffusers import DiTTransformer2DModel

    return DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
    )


def _dit_inputs(model, device, generator) -> dict:
    """What DiTPipeline passes: latents, one timestep per sample and class labels."""
    config, batch = model.config, 2
    return {
        "hidden_states": torch.randn(
            batch,
            config.in_channels,
            config.sample_size,
            config.sample_size,
            device=device,
            generator=generator,
        ),
        "timestep": torch.randint(0, 1000, (batch,), device=device, generator=generator),
        "class_labels": torch.randint(
            0, config.num_embeds_ada_norm, (batch,), device=device, generator=generator
        ),
    }


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )


def _llama_inputs(model, device, generator) -> dict:
    """One forward over a right-padded batch. The first row always has padding, so eager builds
    an explicit mask as a capture does (transformers skips the mask for an all-ones one, except
    while a stream captures, and another SDPA kernel would not match bitwise)."""
    batch, length = 2, 8
    attention_mask = torch.ones(batch, length, dtype=torch.long, device=device)
    padding = int(torch.randint(1, length - 1, (1,), device=device, generator=generator))
    attention_mask[0, length - padding :] = 0
    return {
        "input_ids": torch.randint(
            0, model.config.vocab_size, (batch, length), device=device, generator=generator
        ),
        "attention_mask": attention_mask,
        "use_cache": False,
    }


@dataclass(frozen=True)
class Case:
    package: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.nn.Module, str, torch.Generator], dict]


CASES = {
    "diffusers-StableAudioDiTModel": Case("diffusers", _stable_audio_dit, _stable_audio_inputs),
    "diffusers-DiTTransformer2DModel": Case("diffusers", _dit, _dit_inputs),
    "transformers-LlamaForCausalLM": Case("transformers", _llama, _llama_inputs),
}


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    """The model's case, skipped with the reason when its package is not installed."""
    chosen = CASES[request.param]
    pytest.importorskip(
        chosen.package,
        reason=f"{chosen.package} is not installed (optional: pip install {chosen.package})",
    )
    return chosen


def _build(case: Case, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return case.build().to(device).eval()


def _run_against_eager(case: Case, device: str, *, replays_compute: bool, backend=None):
    model = _build(case, device)
    gf = GraphedForward(model, device=device, backend=backend)
    generator = torch.Generator(device=device).manual_seed(1)
    for call in range(CALLS):
        kwargs = case.inputs(model, device, generator)
        with torch.no_grad():
            want = model(**kwargs)
        assert_same_output(gf(**kwargs), want, values=replays_compute or call == 0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    # On a CUDA device the first call is answered from its last warm-up, not by a replay; the
    # emulated backend's tests leave that off (tests/python/_backend_choice.py).
    replays = CALLS - 1 if device == "cuda" else CALLS
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, replays, 0), stats


def test_model_output_is_captured_once_and_replayed_on_the_emulated_backend(case, emulated_backend):
    _run_against_eager(case, "cpu", replays_compute=False, backend=emulated_backend)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_replay_matches_eager_bitwise_on_the_gpu(case):
    _run_against_eager(case, "cuda", replays_compute=True)


API_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SUPPORTED_HEADING = "## Supported diffusers, transformers and accelerate versions"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


@pytest.mark.parametrize("package", ["diffusers", "transformers", "accelerate"])
def test_the_installed_version_is_one_the_api_reference_supports(package):
    """The versions these tests run are the ones docs/api.md tells users are supported: a pin
    or a newer release CI installs that the page does not name fails here."""
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed")
    text = API_REFERENCE.read_text()
    assert SUPPORTED_HEADING in text, f"docs/api.md has no section {SUPPORTED_HEADING!r}"
    section = text.split(SUPPORTED_HEADING, 1)[1].split("\n## ", 1)[0]
    named = re.search(
        rf"\b{package} (\d+\.\d+\.\d+)(?: (through|and) (\d+\.\d+\.\d+))?",
        " ".join(section.split()),
    )
    assert named, f"docs/api.md names no supported {package} version"
    first, how, last = named.groups()
    if how == "through":
        supported = _release(first) <= _release(installed) <= _release(last)
    else:
        supported = _release(installed) in {_release(first), _release(last or first)}
    assert supported, f"{package} {installed} is not among the versions docs/api.md supports"
