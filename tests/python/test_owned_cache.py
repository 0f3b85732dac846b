"""A forward that owns its state outside its buffers: a wrapper nn.Module holding a transformers
StaticCache as a plain attribute (not a registered buffer) that passes the cache's tensors (each
layer's keys and values, and its length tensor where this transformers version keeps one) as
`keep_alive` on every decode call, as docs/api.md recommends for fixed tensors a graph reads.

graphed's sync probe and warm-ups run the forward before the capture; each such run writes the
cache and advances its length. Eager semantics ask that they leave no trace: after each call
through graphed the cache is what eager's is, and the logits are eager's. The same decode
sequence (the same prompt, then eager's greedy token at each step) runs eagerly on one wrapper and
through graphed on another, over the same model. On the GPU every step is compared bitwise; on
the CPU the emulated backend's replays compute nothing, so only the first decode call (the one
that captures, where the probe's and warm-ups' side effects show) is compared. Skipped with the
reason when transformers is missing."""

from __future__ import annotations

import pytest
import torch
from graphed import GraphedForward

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install transformers)"
)

PROMPT, CACHE_LENGTH, BATCH = 8, 32, 2


class CachedDecoder(torch.nn.Module):
    """Owns a StaticCache (an attribute, so neither a parameter nor a buffer) and runs the model
    on it: a prompt fills it, each decode call appends one token a row. Returns the logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        output = self.model(
            input_ids=input_ids, past_key_values=self.cache, use_cache=True, return_dict=True
        )
        return output.logits

    def cache_tensors(self) -> list[torch.Tensor]:
        """Every tensor of the cache a decode step reads or writes, by address: each layer's
        keys, values and (where it is a tensor) length."""
        tensors = []
        for layer in self.cache.layers:
            tensors += [layer.keys, layer.values]
            length = getattr(layer, "cumulative_length", None)
            if isinstance(length, torch.Tensor):
                tensors.append(length)
        return tensors


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).to(device).eval()


def _differences(got: list[torch.Tensor], want: list[torch.Tensor], names: list[str]) -> list[str]:
    """One line for each tensor that is not bitwise eager's: its name and the largest difference
    (a length tensor: both values)."""
    lines = []
    for name, mine, eagers in zip(names, got, want, strict=True):
        if torch.equal(mine, eagers):
            continue
        if mine.numel() == 1:
            lines.append(f"{name} is {int(mine)} where eager's is {int(eagers)}")
        else:
            largest = (mine.double() - eagers.double()).abs().max().item()
            lines.append(f"{name} differs from eager's by up to {largest:.3g}")
    return lines


def _decode_against_eager(device: str, steps: int, backend: str | None = None) -> None:
    model = _model(device)
    eager, graphed_decoder = CachedDecoder(model), CachedDecoder(model)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT), generator=generator)
    with torch.no_grad():
        logits = eager(input_ids=prompt.to(device))
        graphed_decoder(input_ids=prompt.to(device))  # the prefill allocates the cache's tensors
    gf = GraphedForward(graphed_decoder, device=device, backend=backend)
    keep_alive = graphed_decoder.cache_tensors()
    for step in range(steps):
        token = logits[:, -1:].argmax(dim=-1)
        with torch.no_grad():
            logits = eager(input_ids=token)
        got = gf(input_ids=token.clone(), keep_alive=keep_alive)
        names = ["logits"] + [f"cache tensor {index}" for index in range(len(keep_alive))]
        problems = _differences(
            [got, *graphed_decoder.cache_tensors()], [logits, *eager.cache_tensors()], names
        )
        assert not problems, f"decode step {step}: " + "; ".join(problems)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, steps), stats


def test_the_capturing_call_leaves_the_owned_cache_and_logits_as_eager(emulated_backend):
    _decode_against_eager("cpu", steps=1, backend=emulated_backend)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_decode_step_matches_eager_bitwise_with_an_owned_cache_on_the_gpu():
    _decode_against_eager("cuda", steps=6)
