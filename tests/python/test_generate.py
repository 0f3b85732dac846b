"""graphed.graph_generation: transformers' own `model.generate(...)` with its decode steps replayed
from a graph, on tiny random decoders built here (Llama, and Qwen2 as a second family; nothing is
downloaded). Skipped with the reason when transformers is missing.

On the CPU the emulated backend captures nothing: a replay returns what the capture-time forward
wrote, so only the first decode step of a capture (the one the capture itself computes) can give
eager's token there. The CPU tests check the wiring: which forwards reach the graph and how often
it captures and replays, that the capturing step leaves the cache as eager leaves it, and the
eager routes (other caches, failed captures, remove). The GPU tests compare every greedy token
with eager's."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install transformers)"
)

import graphed  # noqa: E402
from transformers import StaticCache  # noqa: E402

PROMPT, NEW_TOKENS, BATCH, CACHE_LENGTH = 5, 6, 2, 16


# The sizes every tiny decoder here shares; no end-of-sequence token, so that every request makes
# all of its new tokens.
TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "eos_token_id": None,
    "pad_token_id": 0,
}


def _llama() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))


def _qwen2() -> torch.nn.Module:
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY))


def _mistral_with_a_sliding_window() -> torch.nn.Module:
    return transformers.MistralForCausalLM(transformers.MistralConfig(**TINY, sliding_window=4))


FAMILIES = {"llama": _llama, "qwen2": _qwen2}


def _build(make, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return make().to(device).eval()


def _prompt(model, device: str, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, model.config.vocab_size, (BATCH, PROMPT), generator=generator)
    input_ids = input_ids.to(device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _generate(model, prompt: dict, new_tokens: int = NEW_TOKENS, **options) -> torch.Tensor:
    return model.generate(**prompt, max_new_tokens=new_tokens, do_sample=False, **options)


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [
        t for layer in cache.layers for t in (layer.keys, layer.values, layer.cumulative_length)
    ]


def _decode_steps(requests: int, new_tokens: int = NEW_TOKENS) -> int:
    """Forwards after the prefill: the first new token comes from the prefill's logits."""
    return requests * (new_tokens - 1)


def test_decode_steps_replay_one_graph_per_cache_and_prefills_run_eager(emulated_backend):
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, cache_implementation="static")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    requests = 3
    for _ in range(requests):
        cache.reset()
        got = _generate(model, prompt, past_key_values=cache)
        # The prefill is eager and the first decode step is the capture's own forward: both are
        # eager's on any backend (later emulated replays repeat the capture's token).
        assert torch.equal(got[:, : PROMPT + 2], want[:, : PROMPT + 2])
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["graphs"]) == (1, 1), stats
    assert stats["replays"] == _decode_steps(requests), stats
    assert (stats["eager_forwards"], stats["eager_calls"]) == (requests, 0), stats


def test_the_capturing_step_leaves_the_cache_as_eager_leaves_it(emulated_backend):
    """graphed's probe and warm-up forwards each advance a static cache's length; the capturing
    decode step must still leave every layer's keys, values and length as eager leaves them."""
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    eager_cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    want = _generate(model, prompt, 2, past_key_values=eager_cache)
    graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    got = _generate(model, prompt, 2, past_key_values=cache)
    assert torch.equal(got, want)
    assert int(cache.layers[0].cumulative_length) == PROMPT + 1
    for index, (mine, eagers) in enumerate(
        zip(_cache_tensors(cache), _cache_tensors(eager_cache), strict=True)
    ):
        torch.testing.assert_close(mine, eagers, rtol=0, atol=0, msg=f"cache tensor {index}")


def test_a_new_static_cache_per_request_captures_per_request_within_max_entries(emulated_backend):
    """generate(cache_implementation="static") makes a new cache each call: a new graph each
    call, the oldest evicted (with the cache it held) beyond max_entries."""
    model = _build(_llama, "cpu")
    generation = graphed.graph_generation(
        model, device="cpu", max_entries=1, backend=emulated_backend
    )
    requests = 3
    for _ in range(requests):
        _generate(model, _prompt(model, "cpu"), cache_implementation="static")
    stats = generation.stats()
    assert (stats["captures"], stats["graphs"], stats["evictions"]) == (3, 1, 2), stats
    assert stats["replays"] == _decode_steps(requests), stats


@pytest.mark.parametrize(
    ("make", "options"),
    [
        pytest.param(_llama, {}, id="dynamic-cache"),
        pytest.param(
            _mistral_with_a_sliding_window,
            {"cache_implementation": "static"},
            id="sliding-window-static-cache",
        ),
    ],
)
def test_caches_a_graph_cannot_hold_run_every_forward_eager(make, options, emulated_backend):
    """A dynamic cache grows; a sliding-window layer keeps its length as a Python int, which a
    graph would bake in: every forward runs the model's own, with eager's tokens."""
    model = _build(make, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, **options)
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    assert torch.equal(_generate(model, prompt, **options), want)
    stats = generation.stats()
    assert (stats["captures"], stats["replays"]) == (0, 0), stats
    assert stats["eager_forwards"] == NEW_TOKENS, stats


def test_a_disabled_runner_gives_eager_tokens_at_every_step(emulated_backend):
    """A disabled runner (as after a failed capture) runs each decode step eagerly, on the
    cache. (The emulated backend's failing capture is no stand-in here: it fails after running
    the capture's forward, which a device capture does not execute, so the cache would advance
    twice.)"""
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, cache_implementation="static")
    generation = graphed.graph_generation(
        model, device="cpu", enabled=False, backend=emulated_backend
    )
    assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
    stats = generation.stats()
    assert not stats["enabled"] and stats["disabled_reason"], stats
    assert (stats["captures"], stats["replays"]) == (0, 0), stats
    assert stats["eager_calls"] == _decode_steps(1), stats


def test_generate_does_not_compile_the_graphed_decode_step(emulated_backend):
    """Where generate() would torch.compile the decode step (a GPU with a static cache; here
    forced by the compile config), the step still reaches the graph."""
    model = _build(_llama, "cpu")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    compile_config = transformers.CompileConfig()
    compile_config._compile_all_devices = True
    _generate(
        model, _prompt(model, "cpu"), cache_implementation="static", compile_config=compile_config
    )
    stats = generation.stats()
    assert (stats["captures"], stats["replays"]) == (1, _decode_steps(1)), stats


def test_remove_gives_the_model_back_and_a_second_wrap_is_refused(emulated_backend):
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, cache_implementation="static")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    with pytest.raises(ValueError, match="already replaced"):
        graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    generation.remove()
    assert "forward" not in vars(model) and "get_compiled_call" not in vars(model)
    assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
    assert generation.stats()["captures"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_greedy_tokens_equal_eager_at_every_decode_step_on_the_gpu(family, dtype):
    model = _build(FAMILIES[family], "cuda").to(dtype)
    prompts = [_prompt(model, "cuda", seed) for seed in (1, 2, 3)]
    # On a GPU with a static cache generate() would torch.compile its decode step: eager is
    # asked for.
    eager_cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    wants = []
    for prompt in prompts:
        eager_cache.reset()
        wants.append(_generate(model, prompt, past_key_values=eager_cache, disable_compile=True))
    fresh_wants = [
        _generate(model, prompt, cache_implementation="static", disable_compile=True)
        for prompt in prompts
    ]
    generation = graphed.graph_generation(model, device="cuda")
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    for prompt, want in zip(prompts, wants, strict=True):
        cache.reset()
        assert torch.equal(_generate(model, prompt, past_key_values=cache), want)
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, _decode_steps(len(prompts))), stats
    for prompt, want in zip(prompts, fresh_wants, strict=True):
        assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
    stats = generation.stats()
    assert stats["captures"] == 1 + len(prompts), stats
    assert stats["replays"] == _decode_steps(2 * len(prompts)), stats
