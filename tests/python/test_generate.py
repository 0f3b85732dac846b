"""graphed.graph_generation: transformers' own `model.generate(...)` with its decode steps replayed
from a graph, on tiny random decoders built here (Llama, with Qwen2 and Mixtral as other
families; Gemma 3, GPT-OSS and Mistral for sliding-window caches, Qwen3-Next and LFM2 for
linear-attention ones; nothing is downloaded). Skipped with the reason when transformers is
missing. They pass with transformers 5.17 (the pinned version) through 5.25; 5.24 renamed the
forward's cache kwarg to `cache`.

On the CPU the emulated backend captures nothing: a replay returns what the capture-time forward
wrote, so only the first decode step of a capture (the one the capture itself computes) can give
eager's token there. The CPU tests check the wiring: which forwards reach the graph and how often
it captures and replays, that one graph serves the caches generate() makes per request (their
prefill values copied into the graph's cache tensors), that a cache kept alive keeps its own
values when another request takes those tensors over, that the capturing step leaves the cache as
eager leaves it, the eager routes (other caches, failed captures, remove), and the warnings for
what graph_generation cannot find in transformers. The GPU tests compare every greedy token with
eager's."""

from __future__ import annotations

import gc
import inspect
import threading
import warnings

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install transformers)"
)

import graphed  # noqa: E402
from _backend_choice import fail_captures_of  # noqa: E402
from transformers import StaticCache  # noqa: E402

PROMPT, NEW_TOKENS, BATCH, CACHE_LENGTH = 5, 6, 2, 16
# The forward's (and generate()'s) cache kwarg and the output field holding the cache:
# transformers 5.24 renamed `past_key_values` to `cache` (the old name warns).
CACHE = (
    "cache"
    if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    else "past_key_values"
)


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


def _mixtral() -> torch.nn.Module:
    """A mixture of experts (the router picks two of four experts a token)."""
    config = transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


FAMILIES = {"llama": _llama, "qwen2": _qwen2, "mixtral": _mixtral}

# The window of the sliding-window families below: prompts of SHORT tokens fill it during decode,
# prompts of LONG tokens start past it.
WINDOW, SHORT, LONG, PAST_THE_WINDOW = 4, 2, 8, 10


def _gemma3() -> torch.nn.Module:
    """Gemma 3 (text): a sliding-window layer and a full one."""
    config = transformers.Gemma3TextConfig(
        **TINY, head_dim=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    return transformers.Gemma3ForCausalLM(config)


def _gpt_oss() -> torch.nn.Module:
    """GPT-OSS: sliding and full layers, attention sinks, a mixture of experts."""
    config = transformers.GptOssConfig(
        **TINY, head_dim=16, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    return transformers.GptOssForCausalLM(config)


def _mistral_default() -> torch.nn.Module:
    """Mistral with its config's default window (4096): every layer a StaticSlidingWindowLayer,
    never full in a short generation."""
    return transformers.MistralForCausalLM(transformers.MistralConfig(**TINY))


def _qwen3_next() -> torch.nn.Module:
    """Qwen3-Next: gated delta-rule linear-attention layers (convolution and recurrent states)
    between full-attention ones, a mixture of experts."""
    config = transformers.Qwen3NextConfig(
        **{**TINY, "num_hidden_layers": 4}, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"] * 2,
    )  # fmt: skip
    return transformers.Qwen3NextForCausalLM(config)


def _lfm2() -> torch.nn.Module:
    """LFM2: short-convolution layers (a convolution state) between full-attention ones."""
    config = transformers.Lfm2Config(
        **{**TINY, "num_hidden_layers": 4}, layer_types=["conv", "full_attention"] * 2
    )
    return transformers.Lfm2ForCausalLM(config)


# Families whose static caches hold more than StaticLayers: sliding windows, linear attention.
WINDOWED_AND_LINEAR = {
    "gemma3": _gemma3,
    "gpt_oss": _gpt_oss,
    "mistral_default": _mistral_default,
    "mistral_window": _mistral_with_a_sliding_window,
    "qwen3_next": _qwen3_next,
    "lfm2": _lfm2,
}


def _build(make, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return make().to(device).eval()


def _prompt(model, device: str, seed: int = 1, batch: int = BATCH) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, model.config.vocab_size, (batch, PROMPT), generator=generator)
    input_ids = input_ids.to(device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _long_prompt(model, device: str, seed: int, length: int, batch: int = 1) -> dict:
    """A prompt of `length` tokens."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, model.config.vocab_size, (batch, length), generator=generator)
    input_ids = input_ids.to(device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _generate(
    model, prompt: dict, new_tokens: int = NEW_TOKENS, cache=None, **options
) -> torch.Tensor:
    if cache is not None:
        options[CACHE] = cache
    return model.generate(**prompt, max_new_tokens=new_tokens, do_sample=False, **options)


def _generate_keeping_the_cache(model, prompt: dict, **options):
    """generate() returning (tokens, the cache it decoded on), the cache kept by the caller."""
    output = _generate(model, prompt, return_dict_in_generate=True, **options)
    return output.sequences, output[CACHE]


def _mixed_requests(model, prompts: list[dict], **options) -> tuple[list, list]:
    """Requests of one shape in the patterns a server mixes: on a cache generate() makes and
    returns (kept here), on one it makes and drops, and on a StaticCache passed (kept here), in
    turn. Returns (each request's tokens, the kept caches)."""
    tokens, kept = [], []
    for index, prompt in enumerate(prompts):
        if index % 3 == 0:
            got, cache = _generate_keeping_the_cache(
                model, prompt, cache_implementation="static", **options
            )
            kept.append(cache)
        elif index % 3 == 1:
            got = _generate(model, prompt, cache_implementation="static", **options)
        else:
            # The length generate() sized its own cache to: one shape for every request.
            length = prompt["input_ids"].shape[1] + NEW_TOKENS - 1
            cache = StaticCache(config=model.config, max_cache_len=length)
            got = _generate(model, prompt, cache=cache, **options)
            kept.append(cache)
        tokens.append(got)
    return tokens, kept


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [
        t for layer in cache.layers for t in (layer.keys, layer.values, layer.cumulative_length)
    ]


def _cache_state(cache) -> tuple[list[torch.Tensor], list]:
    """Every tensor a cache's layers hold (keys, values, lengths, linear-attention states) and
    their Python lengths (a sliding window's)."""
    tensors, lengths = [], []
    for layer in cache.layers:
        for name in ("keys", "values", "cumulative_length", "cumulative_length_linear"):
            if isinstance(getattr(layer, name, None), torch.Tensor):
                tensors.append(getattr(layer, name))
        for name in ("conv_states", "recurrent_states"):
            tensors += [t for t in getattr(layer, name, {}).values() if t is not None]
        lengths.append(getattr(layer, "cumulative_length_int", None))
    return tensors, lengths


def _graph_keys(cache, prompt_length: int, new_tokens: int) -> set:
    """The graphs a request's decode steps need, from the cache eager's request leaves: one per
    shape of its tensors and, on a cache with sliding windows, per regime (a window filling or
    full at the step's length)."""
    tensors, _ = _cache_state(cache)
    shape = tuple(tuple(t.shape) for t in tensors)
    windows = [
        layer.max_cache_len for layer in cache.layers if hasattr(layer, "cumulative_length_int")
    ]
    lengths = range(prompt_length, prompt_length + new_tokens - 1)  # before each decode step
    return {(shape, tuple(length >= window for window in windows)) for length in lengths}


def _prefill_values(cache) -> list[torch.Tensor]:
    """Each layer's keys and values at the prompt's positions: what the eager prefill wrote."""
    return [t[:, :, :PROMPT].clone() for layer in cache.layers for t in (layer.keys, layer.values)]


def _decode_steps(requests: int, new_tokens: int = NEW_TOKENS) -> int:
    """Forwards after the prefill: the first new token comes from the prefill's logits."""
    return requests * (new_tokens - 1)


def _graphed_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("graphed:")]


def test_decode_steps_replay_one_graph_per_cache_and_prefills_run_eager(emulated_backend):
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, cache_implementation="static")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    requests = 3
    for _ in range(requests):
        cache.reset()
        got = _generate(model, prompt, cache=cache)
        # The prefill is eager and the first decode step is the capture's own forward: both are
        # eager's on any backend (later emulated replays repeat the capture's token).
        assert torch.equal(got[:, : PROMPT + 2], want[:, : PROMPT + 2])
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["graphs"]) == (1, 1), stats
    assert stats["replays"] == _decode_steps(requests), stats
    assert (stats["eager_forwards"], stats["eager_calls"]) == (requests, 0), stats
    # The one cache passed is the graph's: nothing copied.
    assert (stats["held_caches"], stats["cache_adoptions"], stats["cache_copies_out"]) == (1, 0, 0)


def test_generate_with_a_static_cache_reaches_the_graph_without_a_warning(emulated_backend):
    """The call pattern of the docs, on the installed transformers: every decode step reaches the
    graph (transformers 5.24 passes the cache as `cache`, which an older graph_generation did not
    look for, and ran every step eagerly without a word)."""
    model = _build(_llama, "cpu")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _generate(model, _prompt(model, "cpu"), cache_implementation="static")
    assert not _graphed_warnings(caught)
    stats = generation.stats()
    assert (stats["captures"], stats["replays"]) == (1, _decode_steps(1)), stats
    assert (stats["eager_forwards"], stats["api_mismatches"]) == (1, 0), stats


def test_the_capturing_step_leaves_the_cache_as_eager_leaves_it(emulated_backend):
    """graphed's probe and warm-up forwards each advance a static cache's length; the capturing
    decode step must still leave every layer's keys, values and length as eager leaves them."""
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    eager_cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    want = _generate(model, prompt, 2, cache=eager_cache)
    graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    got = _generate(model, prompt, 2, cache=cache)
    assert torch.equal(got, want)
    assert int(cache.layers[0].cumulative_length) == PROMPT + 1
    for index, (mine, eagers) in enumerate(
        zip(_cache_tensors(cache), _cache_tensors(eager_cache), strict=True)
    ):
        torch.testing.assert_close(mine, eagers, rtol=0, atol=0, msg=f"cache tensor {index}")


def test_the_caches_generate_makes_per_request_share_one_graph(emulated_backend):
    """generate(cache_implementation="static") makes a new StaticCache per request: one capture
    serves them all, even with max_entries=1 (the first request's tensors become the graph's;
    each later request's are copied into them at its first decode step). The caches generate made
    are gone when the next request comes (no copy out), without a garbage collection."""
    model = _build(_llama, "cpu")
    requests = 4
    prompts = [_prompt(model, "cpu", seed) for seed in range(requests)]
    wants = [_generate(model, prompt, cache_implementation="static") for prompt in prompts]
    generation = graphed.graph_generation(
        model, device="cpu", max_entries=1, backend=emulated_backend
    )
    gc.disable()
    try:
        for prompt, want in zip(prompts, wants, strict=True):
            got = _generate(model, prompt, cache_implementation="static")
            assert torch.equal(got[:, : PROMPT + 1], want[:, : PROMPT + 1])  # the eager prefill's
    finally:
        gc.enable()
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["graphs"], stats["evictions"]) == (1, 1, 0), stats
    assert stats["replays"] == _decode_steps(requests), stats
    assert stats["held_caches"] == 1, stats
    assert (stats["cache_adoptions"], stats["cache_copies_out"]) == (requests - 1, 0), stats


def test_an_adopted_cache_holds_its_own_request_and_a_cache_kept_alive_keeps_its_values(
    emulated_backend,
):
    """The cache generate() returns (return_dict_in_generate) is bound to the graph's tensors
    holding its own prefill; when a later request takes those tensors over, the earlier cache,
    still held here, first gets copies of its own: its values stay its request's."""
    model = _build(_llama, "cpu")
    prompts = [_prompt(model, "cpu", seed) for seed in (1, 2, 3)]
    wants = []
    for prompt in prompts:
        _, eager_cache = _generate_keeping_the_cache(model, prompt, cache_implementation="static")
        wants.append(_prefill_values(eager_cache))
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    kept = []
    for prompt, want in zip(prompts, wants, strict=True):
        _, cache = _generate_keeping_the_cache(model, prompt, cache_implementation="static")
        kept.append(cache)
        for index, (mine, eagers) in enumerate(zip(_prefill_values(cache), want, strict=True)):
            torch.testing.assert_close(mine, eagers, rtol=0, atol=0, msg=f"tensor {index}")
    for cache, want in zip(kept, wants, strict=True):
        for index, (mine, eagers) in enumerate(zip(_prefill_values(cache), want, strict=True)):
            torch.testing.assert_close(mine, eagers, rtol=0, atol=0, msg=f"kept tensor {index}")
    pointers = [{t.data_ptr() for t in _cache_tensors(cache)} for cache in kept]
    assert all(a.isdisjoint(b) for i, a in enumerate(pointers) for b in pointers[i + 1 :])
    stats = generation.stats()
    assert stats["captures"] == 1, stats
    assert (stats["cache_adoptions"], stats["cache_copies_out"]) == (2, 2), stats


def test_a_cache_passed_again_takes_the_graph_back_from_another(emulated_backend):
    """Two StaticCaches passed in turn, both alive: each request on the one not bound to the
    graph's tensors copies the other out and its own values in; one graph throughout."""
    model = _build(_llama, "cpu")
    prompts = [_prompt(model, "cpu", seed) for seed in (1, 2)]
    wants = []
    for prompt in prompts:
        eager_cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
        _generate(model, prompt, cache=eager_cache)
        wants.append(_prefill_values(eager_cache))
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    caches = [StaticCache(config=model.config, max_cache_len=CACHE_LENGTH) for _ in prompts]
    for _ in range(2):
        for cache, prompt in zip(caches, prompts, strict=True):
            cache.reset()
            _generate(model, prompt, cache=cache)
    for cache, want in zip(caches, wants, strict=True):
        for index, (mine, eagers) in enumerate(zip(_prefill_values(cache), want, strict=True)):
            torch.testing.assert_close(mine, eagers, rtol=0, atol=0, msg=f"tensor {index}")
    stats = generation.stats()
    assert (stats["captures"], stats["held_caches"]) == (1, 1), stats
    # The first request binds its own cache; each of the three after it adopts and copies out.
    assert (stats["cache_adoptions"], stats["cache_copies_out"]) == (3, 3), stats


def test_adopted_and_copied_out_caches_hold_eagers_values_when_the_steps_run_eager(
    emulated_backend,
):
    """With the runner disabled, each decode step runs the model's own forward on the graph's
    cache tensors, which gives real values on the CPU: across requests on caches generate()
    makes (some kept), and StaticCaches passed, every token and every kept cache is eager's, so
    the adoptions copy each request's values in and the copies out give the kept caches theirs."""
    model = _build(_llama, "cpu")
    prompts = [_prompt(model, "cpu", seed) for seed in range(6)]
    want_tokens, want_caches = _mixed_requests(model, prompts)
    generation = graphed.graph_generation(
        model, device="cpu", enabled=False, backend=emulated_backend
    )
    got_tokens, got_caches = _mixed_requests(model, prompts)
    for index, (got, want) in enumerate(zip(got_tokens, want_tokens, strict=True)):
        assert torch.equal(got, want), f"request {index}"
    for index, (got, want) in enumerate(zip(got_caches, want_caches, strict=True)):
        for mine, eagers in zip(_cache_tensors(got), _cache_tensors(want), strict=True):
            torch.testing.assert_close(mine, eagers, rtol=0, atol=0, msg=f"kept cache {index}")
    stats = generation.stats()
    assert stats["eager_calls"] == _decode_steps(len(prompts)), stats
    assert stats["cache_adoptions"] == len(prompts) - 1, stats
    # Each kept cache but the last is copied out by the request after it; the caches not kept
    # are gone by then.
    assert stats["cache_copies_out"] == len(got_caches) - 1, stats


def test_requests_from_two_threads_at_once_never_share_a_set_in_flight(emulated_backend):
    """Two threads generating at once on caches of one shape that generate() makes: a request in
    flight keeps its set of the graph's cache tensors (generate() reads the cache between decode
    steps, where another thread's adoption must not change it), so requests that overlap get a set
    each, and with the steps run eagerly on those tensors (runner disabled: real values on the
    CPU) every token is eager's."""
    model = _build(_llama, "cpu")
    prompts = {
        thread: [_prompt(model, "cpu", 10 * thread + i) for i in range(3)] for thread in (1, 2)
    }
    wants = {
        thread: [_generate(model, prompt, cache_implementation="static") for prompt in mine]
        for thread, mine in prompts.items()
    }
    generation = graphed.graph_generation(
        model, device="cpu", enabled=False, backend=emulated_backend
    )
    got, errors = {}, []

    def requests(thread: int) -> None:
        try:
            got[thread] = [
                _generate(model, prompt, cache_implementation="static")
                for prompt in prompts[thread]
            ]
        except BaseException as error:  # raised again below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=requests, args=(thread,)) for thread in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    for thread, mine in wants.items():
        for index, want in enumerate(mine):
            assert torch.equal(got[thread][index], want), f"thread {thread}, request {index}"
    stats = generation.stats()
    assert stats["eager_calls"] == _decode_steps(6), stats
    # A set each for requests that overlapped (how many did is the scheduler's): every other
    # request adopts a set whose cache is gone, and none is copied out (none is kept).
    assert stats["held_caches"] in (1, 2), stats
    assert stats["cache_adoptions"] == 6 - stats["held_caches"], stats
    assert stats["cache_copies_out"] == 0, stats


def test_requests_from_a_pool_of_threads_one_at_a_time_share_one_graph(emulated_backend):
    """A server's pool of threads, one request at a time, each on another thread: one set of
    cache tensors and one graph serve them all (a set is another thread's to take once its
    cache is gone)."""
    model = _build(_llama, "cpu")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    errors = []

    def request(seed: int) -> None:
        try:
            _generate(model, _prompt(model, "cpu", seed), cache_implementation="static")
        except BaseException as error:  # raised again below, in the test's thread
            errors.append(error)

    for seed in range(4):
        thread = threading.Thread(target=request, args=(seed,))
        thread.start()
        thread.join()
    if errors:
        raise errors[0]
    stats = generation.stats()
    assert (stats["captures"], stats["held_caches"]) == (1, 1), stats
    assert (stats["cache_adoptions"], stats["cache_copies_out"]) == (3, 0), stats


def test_a_cache_stepped_on_another_thread_is_not_taken_from_it(emulated_backend):
    """A cache kept alive and stepped last on another thread keeps its set: a new request here
    gets a set of its own instead of copying that cache out (its thread may be between two of
    its steps, where generate() reads it)."""
    model = _build(_llama, "cpu")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    kept = {}

    def elsewhere() -> None:
        prompt = _prompt(model, "cpu", 3)
        kept["cache"] = _generate_keeping_the_cache(model, prompt, cache_implementation="static")[1]

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert "cache" in kept
    _generate(model, _prompt(model, "cpu", 4), cache_implementation="static")
    stats = generation.stats()
    assert (stats["held_caches"], stats["cache_copies_out"]) == (2, 0), stats


def test_each_batch_size_has_its_graph_and_its_cache_tensors(emulated_backend):
    model = _build(_llama, "cpu")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    for batch in (2, 1, 2, 1):
        _generate(model, _prompt(model, "cpu", batch=batch), cache_implementation="static")
    stats = generation.stats()
    assert (stats["captures"], stats["graphs"], stats["held_caches"]) == (2, 2, 2), stats
    assert (stats["cache_adoptions"], stats["cache_copies_out"]) == (2, 0), stats
    assert stats["replays"] == _decode_steps(4), stats


@pytest.mark.parametrize(
    ("make", "options", "named"),
    [
        pytest.param(_llama, {}, "DynamicCache", id="dynamic-cache"),
    ],
)
def test_caches_a_graph_cannot_hold_run_every_forward_eager(make, options, named, emulated_backend):
    """A dynamic cache grows: every forward runs the model's own, with eager's tokens; one warning
    says why (no API mismatch)."""
    model = _build(make, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, **options)
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(_generate(model, prompt, **options), want)
        assert torch.equal(_generate(model, prompt, **options), want)
    said = _graphed_warnings(caught)
    assert len(said) == 1 and named in said[0] and "run eagerly" in said[0], said
    stats = generation.stats()
    assert (stats["captures"], stats["replays"], stats["api_mismatches"]) == (0, 0, 0), stats
    assert stats["eager_forwards"] == 2 * NEW_TOKENS, stats


def test_a_declined_caches_layers_are_looked_at_once_a_request(emulated_backend, monkeypatch):
    """A declined decode step costs what generate() costs without graphed: the cache's layers are
    looked at on its first decode step only (bench/declined_generate.py times it)."""
    model = _build(_lfm2, "cpu")
    prompt = _prompt(model, "cpu")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    looks = []
    why_not = generation._why_not_graphable
    monkeypatch.setattr(generation, "_why_not_graphable", lambda *a: looks.append(1) or why_not(*a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            _generate(model, prompt, cache=_recording_its_past(model))
    assert len(looks) == 2, "one look a request (each on a cache of its own)"
    assert generation.stats()["eager_forwards"] == 2 * NEW_TOKENS


def test_an_encoder_decoder_model_runs_eager_and_says_so_once(emulated_backend):
    """An encoder-decoder model (T5: decoder_input_ids, an EncoderDecoderCache) is not what
    graph_generation graphs: its tokens are eager's and one warning says why."""
    config = transformers.T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
        decoder_start_token_id=0, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    model = _build(lambda: transformers.T5ForConditionalGeneration(config), "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt)
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(_generate(model, prompt), want)
        assert torch.equal(_generate(model, prompt), want)
    said = _graphed_warnings(caught)
    assert len(said) == 1 and "encoder-decoder" in said[0], said
    assert generation.stats()["captures"] == 0


def test_a_static_layer_it_does_not_know_is_said_once(emulated_backend, monkeypatch):
    """As if transformers had moved StaticLayer (the class graph_generation recognizes a static
    cache's layers by): the decode steps on a StaticCache run eagerly, with eager's tokens, and
    one warning names the transformers version and what was not found."""
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, cache_implementation="static")
    cache_utils = transformers.cache_utils
    moved = type("StaticLayer", (cache_utils.StaticLayer,), {})
    monkeypatch.setattr(cache_utils, "StaticLayer", moved)
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    with pytest.warns(RuntimeWarning, match=f"transformers {transformers.__version__}") as caught:
        assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
        assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
    said = _graphed_warnings(caught)
    assert len(said) == 1 and "StaticLayer" in said[0], said
    assert {w.filename for w in caught if str(w.message).startswith("graphed:")} == {__file__}
    stats = generation.stats()
    assert (stats["captures"], stats["api_mismatches"]) == (0, _decode_steps(2)), stats


def test_a_layer_attribute_it_cannot_find_is_said_once(emulated_backend):
    """As if transformers had renamed StaticLayer's length tensor: a decode step on such a cache
    warns once, naming it, and runs the model's own forward (which here fails on the renamed
    attribute, as it is transformers' own)."""
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    _generate(model, prompt, 1, cache=cache)
    for layer in cache.layers:
        layer.renamed_length = vars(layer).pop("cumulative_length")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    step = {"input_ids": prompt["input_ids"][:, -1:], "use_cache": True, CACHE: cache}
    with pytest.warns(RuntimeWarning, match="cumulative_length") as caught:
        with pytest.raises(AttributeError, match="cumulative_length"):
            model(**step)
        with pytest.raises(AttributeError, match="cumulative_length"):
            model(**step)
    said = _graphed_warnings(caught)
    assert len(said) == 1 and f"transformers {transformers.__version__}" in said[0], said
    assert generation.stats()["api_mismatches"] == 2


def test_a_decode_step_without_a_cache_it_can_find_is_said_once(emulated_backend):
    """As if generate() passed its cache under a name graph_generation does not look for: a
    forward of one token a row with use_cache=True and no cache warns once, naming the kwargs."""
    model = _build(_llama, "cpu")
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    step = {"input_ids": _prompt(model, "cpu")["input_ids"][:, -1:], "use_cache": True}
    with pytest.warns(RuntimeWarning, match="no cache as 'cache' or 'past_key_values'") as caught:
        model(**step)
        model(**step)
    said = _graphed_warnings(caught)
    assert len(said) == 1 and "input_ids, use_cache" in said[0], said
    # Said where the user's call is, not inside torch's module call or graphed.
    (where,) = {w.filename for w in caught if str(w.message).startswith("graphed:")}
    assert where == __file__, where
    stats = generation.stats()
    assert (stats["api_mismatches"], stats["eager_forwards"], stats["captures"]) == (2, 2, 0)


def test_what_graph_generation_cannot_work_without_is_refused_or_said_at_once(
    emulated_backend, monkeypatch
):
    """A forward with no cache parameter it knows, and a transformers without StaticLayer, are
    refused when graph_generation is called; a model without get_compiled_call (through which
    generate() compiles the decode step) is warned about."""

    class CacheUnderAnotherName(transformers.LlamaForCausalLM):
        def forward(self, input_ids=None, kv_cache=None, **kwargs):
            return super().forward(input_ids=input_ids, **kwargs)

    class NoCompiledCall(transformers.LlamaForCausalLM):
        get_compiled_call = None

    config = transformers.LlamaConfig(**TINY)
    with pytest.raises(ValueError, match="takes none of 'cache', 'past_key_values'"):
        graphed.graph_generation(
            CacheUnderAnotherName(config), device="cpu", backend=emulated_backend
        )
    with pytest.warns(RuntimeWarning, match="has no get_compiled_call"):
        graphed.graph_generation(NoCompiledCall(config), device="cpu", backend=emulated_backend)
    monkeypatch.delattr(transformers.cache_utils, "StaticLayer")
    with pytest.raises(ImportError, match=f"transformers {transformers.__version__} has no"):
        graphed.graph_generation(_build(_llama, "cpu"), device="cpu", backend=emulated_backend)


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
    for _ in range(2):
        assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
    stats = generation.stats()
    assert not stats["enabled"] and stats["disabled_reason"], stats
    assert (stats["captures"], stats["replays"]) == (0, 0), stats
    assert stats["eager_calls"] == _decode_steps(2), stats


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
        wants.append(_generate(model, prompt, cache=eager_cache, disable_compile=True))
    fresh_wants = [
        _generate(model, prompt, cache_implementation="static", disable_compile=True)
        for prompt in prompts
    ]
    generation = graphed.graph_generation(model, device="cuda")
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    for prompt, want in zip(prompts, wants, strict=True):
        cache.reset()
        assert torch.equal(_generate(model, prompt, cache=cache), want)
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, _decode_steps(len(prompts))), stats
    # generate()'s own caches (another length than the one passed: a second shape), one graph
    # for all of them.
    for prompt, want in zip(prompts, fresh_wants, strict=True):
        assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
    stats = generation.stats()
    assert stats["captures"] == 2, stats
    assert stats["replays"] == _decode_steps(2 * len(prompts)), stats
    assert (stats["cache_adoptions"], stats["api_mismatches"]) == (len(prompts) - 1, 0), stats


def _mixed_requests_as_eagers(make) -> tuple:
    """_mixed_requests on a bf16 GPU model, eagerly and then graphed: every token eager's, and
    every kept cache's tensors and Python lengths eager's at the end (another request's values
    would differ by far more than bf16's tolerance). Returns (the GraphedGeneration, the prompts,
    the graphed run's kept caches)."""
    model = _build(make, "cuda").to(torch.bfloat16)
    prompts = [_prompt(model, "cuda", seed) for seed in range(6)]
    want_tokens, want_caches = _mixed_requests(model, prompts, disable_compile=True)
    generation = graphed.graph_generation(model, device="cuda")
    got_tokens, got_caches = _mixed_requests(model, prompts)
    for index, (got, want) in enumerate(zip(got_tokens, want_tokens, strict=True)):
        assert torch.equal(got, want), f"request {index}"
    for index, (got, want) in enumerate(zip(got_caches, want_caches, strict=True)):
        (mine, my_lengths), (eagers, eager_lengths) = _cache_state(got), _cache_state(want)
        assert my_lengths == eager_lengths, f"kept cache {index}"
        for tensor, expected in zip(mine, eagers, strict=True):
            torch.testing.assert_close(tensor, expected, msg=f"kept cache {index}")
    return generation, prompts, got_caches


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_requests_on_caches_generate_makes_and_caches_kept_alive_on_the_gpu(family):
    """Requests on the caches generate() makes, with some of those caches kept (returned by
    return_dict_in_generate) and a StaticCache passed in between, all of one shape: one capture,
    every token eager's, and every kept cache exactly the eager request's cache at the end."""
    generation, prompts, got_caches = _mixed_requests_as_eagers(FAMILIES[family])
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["held_caches"]) == (1, 1), stats
    assert stats["replays"] == _decode_steps(len(prompts)), stats
    assert stats["cache_adoptions"] == len(prompts) - 1, stats
    # Each kept cache but the last is copied out by the request after it; the caches not kept
    # are gone by then.
    assert stats["cache_copies_out"] == len(got_caches) - 1, stats


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(WINDOWED_AND_LINEAR))
def test_windowed_and_linear_families_give_eagers_tokens_at_every_step_on_the_gpu(family):
    """Sliding-window (Gemma 3, GPT-OSS, Mistral) and linear-attention (Qwen3-Next, LFM2) caches
    on the GPU: prompts shorter than the window (the steps fill it, then roll it) and longer
    (every step rolls), generations past it; every token eager's, in two rounds of requests, the
    second capturing nothing."""
    model = _build(WINDOWED_AND_LINEAR[family], "cuda").to(torch.bfloat16)
    prompts = [
        _long_prompt(model, "cuda", seed, length, batch=BATCH)
        for seed in (1, 2)
        for length in (SHORT, LONG)
    ]
    wants = [
        _generate(model, p, PAST_THE_WINDOW, cache=_cache_for(model, p), disable_compile=True)
        for p in prompts
    ]
    generation = graphed.graph_generation(model, device="cuda")
    captures = []
    for round_ in range(2):
        for index, (prompt, want) in enumerate(zip(prompts, wants, strict=True)):
            got = _generate(model, prompt, PAST_THE_WINDOW, cache_implementation="static")
            assert torch.equal(got, want), f"round {round_}, request {index}"
        captures.append(generation.stats()["captures"])
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert 1 <= captures[0] == captures[1] <= 4, (captures, stats)
    assert stats["replays"] == 2 * len(prompts) * (PAST_THE_WINDOW - 1), stats
    assert (stats["eager_forwards"], stats["api_mismatches"]) == (2 * len(prompts), 0), stats


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["gemma3", "qwen3_next"])
def test_windowed_and_linear_caches_kept_alive_hold_eagers_state_on_the_gpu(family):
    """The mixed requests of one shape a server makes, on a sliding-window and a linear-attention
    cache: every token eager's, and every kept cache holds its own request's tensors and Python
    lengths at the end (adopted, copied out, re-bound: the linear layers' states included)."""
    generation, prompts, _ = _mixed_requests_as_eagers(WINDOWED_AND_LINEAR[family])
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1 and stats["cache_adoptions"] == len(prompts) - 1, stats


@pytest.mark.parametrize("regions", [None, True])
def test_a_decode_step_that_cannot_be_captured_runs_eagerly_unless_regions_are_asked_for(
    emulated_backend, regions
):
    """graph_generation's default keeps regions off (graphing the parts around a synchronizing
    decode step measured slower than eager): the decode step runs eagerly, eager's tokens; with
    regions=True the model's parts are graphed."""
    model = _build(_llama, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, cache_implementation="static")
    fail_captures_of(model.model.layers[1].mlp)
    options = {} if regions is None else {"regions": regions}
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend, **options)
    try:
        got = _generate(model, prompt, cache_implementation="static")
        assert not generation.stats()["enabled"]
        described = generation.graphed.regions()
    finally:
        generation.remove()
    if regions is None:
        assert torch.equal(got, want)
        assert described == []
    else:
        assert any(entry["state"] == "graphed" for entry in described), described


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA device")
def test_a_cuda_runner_on_a_machine_without_a_gpu_raises_grapheds_own_error():
    """generate() on a CPU model graphed for "cuda" where no GPU answers: graphed's ValueError
    naming the input on the CPU, not torch's "no NVIDIA driver" from a stream asked for on the
    way out."""
    model = _build(FAMILIES["llama"], "cpu")
    prompt = _prompt(model, "cpu", 1)
    graphed.graph_generation(model, device="cuda")
    with pytest.raises(ValueError, match="is on cpu; the runner is on cuda") as raised:
        _generate(model, prompt, cache_implementation="static")
    assert "NVIDIA driver" not in repr(raised.value.__context__)


def test_where_no_graph_can_replay_decode_steps_adopt_no_cache():
    """Without a graph backend (a laptop), graph_generation's decode steps are the model's own
    forwards: tokens as eager's, and no cache copied into held tensors for a graph."""
    model = _build(_llama, "cpu")
    prompts = [_prompt(model, "cpu", seed) for seed in range(3)]
    wants = [_generate(model, prompt, cache_implementation="static") for prompt in prompts]
    generation = graphed.graph_generation(model, device="cpu", backend="none")
    for prompt, want in zip(prompts, wants, strict=True):
        assert torch.equal(_generate(model, prompt, cache_implementation="static"), want)
    stats = generation.stats()
    assert (stats["cache_adoptions"], stats["held_caches"], stats["captures"]) == (0, 0, 0), stats
    assert stats["eager_forwards"] > 0


class _AnyLayer:
    def __init__(self, **kwargs) -> None:
        self.is_initialized = True


def test_a_declined_layer_kind_is_named_with_what_it_keeps(emulated_backend):
    """Each kind of cache layer graph_generation leaves eager is named with why (graphed.
    _cache_layers.why_declined): an indexed layer's indexer keys, a hybrid with a dynamic part's
    growing keys, any other kind's being none of those it holds; the kinds it holds (a sliding
    window, a linear-attention hybrid with a static part) are not named."""
    from transformers import cache_utils

    model = _build(_llama, "cpu")
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    base = cache_utils.StaticLayer
    declined = {
        "StaticIndexedLayer": "indexer keys",
        "LinearAttentionAndFullAttentionLayer": "grows",
        "SomeOtherLayer": "is none of the layer kinds",
    }
    bases = {
        "StaticIndexedLayer": (cache_utils.StaticIndexedLayer,),
        "LinearAttentionAndFullAttentionLayer": (cache_utils.LinearAttentionAndFullAttentionLayer,),
        "SomeOtherLayer": (_AnyLayer,),
    }
    cache.layers = (
        [base(max_cache_len=CACHE_LENGTH)]
        + [type(name, bases[name], {})(max_cache_len=CACHE_LENGTH) for name in declined]
        + [cache_utils.StaticSlidingWindowLayer(max_cache_len=CACHE_LENGTH, sliding_window=4)]
    )
    if hasattr(cache_utils, "LinearAttentionAndStaticFullAttentionLayer"):
        cache.layers.append(
            cache_utils.LinearAttentionAndStaticFullAttentionLayer(max_cache_len=CACHE_LENGTH)
        )
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    why, mismatch = generation._why_not_graphable(cache, None)
    assert not mismatch
    for name, said in declined.items():
        assert f"a {name} " in why and said in why.split(f"a {name} ")[1].split(";")[0], why
    assert "a StaticSlidingWindowLayer " not in why and "StaticFullAttention" not in why, why


def _cache_for(model, prompt: dict) -> StaticCache:
    """A static cache of the length generate() would give this request (generate() itself keeps
    the longest it made and reuses it for shorter requests)."""
    return StaticCache(
        config=model.config, max_cache_len=prompt["input_ids"].shape[1] + PAST_THE_WINDOW
    )


def _lengths_after(model, prompt: dict, new_tokens: int, **options) -> tuple:
    """generate()'s tokens and the Python lengths and tensors of the cache it returns."""
    output = _generate(model, prompt, new_tokens, return_dict_in_generate=True, **options)
    tensors, lengths = _cache_state(output[CACHE])
    return output.sequences, lengths, tensors


@pytest.mark.parametrize("family", list(WINDOWED_AND_LINEAR))
def test_windowed_and_linear_caches_capture_a_graph_per_regime_and_keep_eagers_lengths(
    family, emulated_backend
):
    """Decode steps on sliding-window and linear-attention caches reach the graph: a graph per
    shape and per regime of the windows (filling, full), none more over later requests, and the
    cache generate() returns has eager's Python lengths though no Python ran in a replay."""
    model = _build(WINDOWED_AND_LINEAR[family], "cpu")
    prompts = [
        _long_prompt(model, "cpu", seed, length) for seed in (1, 2) for length in (SHORT, LONG)
    ]
    wants = [_lengths_after(model, p, PAST_THE_WINDOW, cache=_cache_for(model, p)) for p in prompts]
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    keys = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for prompt, want in zip(prompts, wants, strict=True):
            cache = _cache_for(model, prompt)
            got = _lengths_after(model, prompt, PAST_THE_WINDOW, cache=cache)
            assert got[1] == want[1], "the sliding windows' Python lengths"
            keys |= _graph_keys(cache, prompt["input_ids"].shape[1], PAST_THE_WINDOW)
    assert not _graphed_warnings(caught)
    stats = generation.stats()
    assert stats["enabled"], stats["disabled_reason"]
    expected = len(keys)
    assert 2 <= expected <= 4 and stats["captures"] == expected, (keys, stats)
    assert stats["replays"] == len(prompts) * (PAST_THE_WINDOW - 1), stats
    assert (stats["eager_forwards"], stats["api_mismatches"]) == (len(prompts), 0), stats


@pytest.mark.parametrize("inference_mode", [False, True], ids=["no_grad", "inference_mode"])
@pytest.mark.parametrize("family", ["gemma3", "qwen3_next", "lfm2"])
def test_the_capturing_step_leaves_a_windowed_or_linear_cache_as_eager_leaves_it(
    family, inference_mode, emulated_backend
):
    """graphed's probe and warm-ups run the capturing step more than once: each would advance a
    sliding window's Python length and roll it or write a linear layer's states; the step must
    leave every tensor and Python length as eager's one step leaves them, also for a cache made
    under torch.inference_mode (inference tensors, which have no version counter to tell a
    write by: put back always)."""
    model = _build(WINDOWED_AND_LINEAR[family], "cpu")
    prompt = _prompt(model, "cpu")  # PROMPT tokens: past the window of 4
    mode = torch.inference_mode if inference_mode else torch.no_grad
    eager_cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    with mode():
        want = _generate(model, prompt, 2, cache=eager_cache)
    graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    with mode():
        assert torch.equal(_generate(model, prompt, 2, cache=cache), want)
    (mine, my_lengths), (eagers, eager_lengths) = _cache_state(cache), _cache_state(eager_cache)
    assert my_lengths == eager_lengths
    assert len(mine) == len(eagers)
    for index, (got, expected) in enumerate(zip(mine, eagers, strict=True)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=f"cache tensor {index}")


def test_a_decode_step_that_raises_leaves_the_windows_length_as_eager_leaves_it(emulated_backend):
    """A decode step whose forward raises (an out-of-range token, before any cache update): the
    sliding windows' Python length stays where eager's leaves it, not one ahead."""
    model = _build(_mistral_with_a_sliding_window, "cpu")
    prompt = _prompt(model, "cpu")

    def failed_step(cache) -> list:
        with torch.no_grad():
            model(input_ids=prompt["input_ids"], use_cache=True, **{CACHE: cache})
            mask = torch.zeros(BATCH, 1, 1, cache.layers[0].max_cache_len)
            step = {"input_ids": torch.full((BATCH, 1), 10_000), "use_cache": True}
            step["position_ids"] = torch.full((BATCH, 1), PROMPT)
            with pytest.raises(IndexError):
                model(**step, attention_mask=mask, **{CACHE: cache})
        return _cache_state(cache)[1]

    want = failed_step(StaticCache(config=model.config, max_cache_len=CACHE_LENGTH))
    graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    got = failed_step(StaticCache(config=model.config, max_cache_len=CACHE_LENGTH))
    assert got == want == [PROMPT] * len(want)


def test_a_linear_attention_layer_without_state_holds_nothing(emulated_backend):
    """A linear-attention layer that never allocates a state (transformers 5.17 gives MoE and MLP
    layers this kind) holds nothing: the cache's other layers are graphed, not declined as a
    cache "the prefill did not allocate"."""
    from graphed._cache_layers import NOT_ALLOCATED, CacheLayers
    from transformers import cache_utils

    model = _build(_llama, "cpu")
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    with torch.no_grad():
        model(**_prompt(model, "cpu"), use_cache=True, **{CACHE: cache})
    layers = CacheLayers(cache_utils)
    stateless = cache_utils.LinearAttentionLayer()
    tensors, sliding = layers.read([*cache.layers, stateless])
    assert len(tensors) == 3 * len(cache.layers) and sliding == []
    assert layers.read([stateless]) == NOT_ALLOCATED


def test_a_windowed_decode_step_called_without_positions_runs_eager_and_says_why(
    emulated_backend,
):
    """A decode step on a sliding-window cache called directly, without generate()'s position_ids
    and prepared mask: the model would compute both from the window's Python length, which a graph
    would bake in; it runs eagerly with eager's logits, said once."""
    model = _build(_gemma3, "cpu")
    prompt = _prompt(model, "cpu")
    caches = [StaticCache(config=model.config, max_cache_len=CACHE_LENGTH) for _ in range(2)]
    step = {"input_ids": prompt["input_ids"][:, -1:], "use_cache": True}
    with torch.no_grad():
        model(input_ids=prompt["input_ids"], use_cache=True, **{CACHE: caches[0]})
        want = model(**step, **{CACHE: caches[0]}).logits
        generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
        model(input_ids=prompt["input_ids"], use_cache=True, **{CACHE: caches[1]})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = model(**step, **{CACHE: caches[1]}).logits
    said = _graphed_warnings(caught)
    assert len(said) == 1 and "position_ids" in said[0] and "Python length" in said[0], said
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert generation.stats()["captures"] == 0


def _recording_its_past(model) -> StaticCache:
    """A static cache whose linear-attention layers record their past states (for crop())."""
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    for layer in cache.layers:
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return cache


def test_a_linear_attention_layer_recording_its_past_is_declined_with_why(emulated_backend):
    """A linear-attention layer that records its past states for crop() re-binds them each step;
    its decode steps run eagerly, eager's tokens, and the warning says so."""
    model = _build(_lfm2, "cpu")
    prompt = _prompt(model, "cpu")
    want = _generate(model, prompt, cache=_recording_its_past(model))
    generation = graphed.graph_generation(model, device="cpu", backend=emulated_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _generate(model, prompt, cache=_recording_its_past(model))
    said = _graphed_warnings(caught)
    assert len(said) == 1 and "records its past" in said[0], said
    assert torch.equal(got, want)
    assert generation.stats()["captures"] == 0
