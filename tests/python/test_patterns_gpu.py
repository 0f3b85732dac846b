"""GPU tests of the forward patterns real models use, each against eager on the same inputs:
a decode step that writes its KV cache in place through kwargs (contiguous and strided caches,
under inference_mode too), code that asks whether it is being captured before a host sync (as
transformers' mask builder does), and a module whose buffers advance on every run (a cache
position counter), ModelOutput-like containers in and out (test_containers.py's, on the CPU
there), and a CPU tensor among the kwargs (refused by its path). docs/api.md's "What a forward
may do" lists them."""

from __future__ import annotations

import pytest
import torch
from graphed import GraphedForward
from test_containers import Denoiser, _inputs
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class DecodeStep(nn.Module):
    """Writes the new token's key and value at `position` into caches passed as kwargs, then
    attends over the cache: the shape of a KV-cached decode step."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, *, x, cache_k, cache_v, position):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        cache_k.index_copy_(0, position, k)
        cache_v.index_copy_(0, position, v)
        weights = torch.softmax(q @ cache_k.transpose(0, 1) / 8.0, dim=-1)
        return self.out(weights @ cache_v)


def _decode(step, caches, steps, dim=64, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    outs = []
    for position in range(steps):
        x = torch.randn(1, dim, device="cuda", generator=generator)
        outs.append(
            step(
                x=x,
                cache_k=caches[0],
                cache_v=caches[1],
                position=torch.tensor([position], device="cuda"),
            )
        )
    return outs


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("inference", [False, True])
def test_a_cache_written_in_place_advances_as_eagerly(layout, inference):
    torch.manual_seed(0)
    model = DecodeStep().cuda()

    def make_caches():
        if layout == "contiguous":
            return [torch.zeros(16, 64, device="cuda") for _ in range(2)]
        # A strided view (every other row of a larger buffer): graphed passes a dense copy to the
        # core and must copy the write back into the caller's view.
        return [torch.zeros(32, 64, device="cuda")[::2] for _ in range(2)]

    mode = torch.inference_mode() if inference else torch.no_grad()
    with mode:
        eager_caches = make_caches()
        expected = _decode(model, eager_caches, steps=6)
        graphed_caches = make_caches()
        gf = GraphedForward(model, device="cuda")
        actual = _decode(gf, graphed_caches, steps=6)
    assert gf.stats()["enabled"], gf.disabled_reason
    assert gf.stats()["captures"] == 1 and gf.stats()["replays"] == 6
    for step, (got, want) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(got, want, msg=f"step {step}")
    for got, want in zip(graphed_caches, eager_caches, strict=True):
        torch.testing.assert_close(got, want)


class MaskBuilder(nn.Module):
    """Checks its input on the host unless the stream is being captured, as
    transformers.masking_utils does for packed sequences."""

    def forward(self, *, x):
        if not torch.cuda.is_current_stream_capturing():
            if bool((x < -1e9).any()):  # a host sync
                raise ValueError("bad mask")
        return x * 2


def test_capture_aware_code_takes_its_capture_branch_when_probed():
    gf = GraphedForward(MaskBuilder(), device="cuda")
    x = torch.randn(8, device="cuda")
    torch.testing.assert_close(gf(x=x), x * 2)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1
    # Outside graphed's forwards the function answers as torch does.
    assert torch.cuda.is_current_stream_capturing() is False


class Counter(nn.Module):
    """Advances a position buffer on every run, as a StaticCache's write counter does."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("position", torch.zeros((), dtype=torch.long))

    def forward(self, *, x):
        self.position += 1
        return x + self.position


def test_warm_ups_leave_module_buffers_as_eager_would():
    eager_model, graphed_model = Counter().cuda(), Counter().cuda()
    gf = GraphedForward(graphed_model, device="cuda", warmup_iters=3)
    x = torch.zeros(4, device="cuda")
    for _ in range(4):
        with torch.no_grad():
            want = eager_model(x=x)
        got = gf(x=x)
        torch.testing.assert_close(got, want)
    assert int(graphed_model.position) == int(eager_model.position) == 4
    assert gf.stats()["captures"] == 1


def test_registered_containers_replay_with_fresh_values():
    torch.manual_seed(0)
    model = Denoiser().cuda()
    gf = GraphedForward(model, device="cuda")

    def to_cuda(tree):
        return torch.utils._pytree.tree_map(
            lambda leaf: leaf.cuda() if torch.is_tensor(leaf) else leaf, tree
        )

    for _ in range(4):
        kwargs = to_cuda(_inputs())
        with torch.no_grad():
            want = model(**kwargs)
        got = gf(**kwargs)
        assert type(got) is type(want) and list(got) == list(want)
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    # the first call: its last warm-up's outputs
    assert (stats["captures"], stats["replays"]) == (1, 3)


def test_a_cpu_tensor_is_refused_by_its_kwarg_path_in_torch_words():
    gf = GraphedForward(lambda *, x, rotary: x * rotary[0] + rotary[1], device="cuda")
    x = torch.randn(4, device="cuda")
    on_cpu = (torch.randn(4, device="cuda"), torch.randn(4))
    with pytest.raises(
        ValueError, match=r"kwargs\['rotary'\]\[1\] is on cpu; the runner is on cuda"
    ):
        gf(x=x, rotary=on_cpu)
    moved = (on_cpu[0], on_cpu[1].cuda())
    torch.testing.assert_close(gf(x=x, rotary=moved), x * moved[0] + moved[1], rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1


def test_cpu_inputs_to_device_stages_what_a_pipeline_passes_on_the_host():
    """StableAudioPipeline's rotary tables are CPU tensors the model moves itself: with
    cpu_inputs="to_device" graphed copies them to the device first, bitwise as eager; the default
    refusal names the option."""

    def forward(x, *, rotary):
        return x * rotary[0].to(x.device) + rotary[1].to(x.device)

    x = torch.randn(4, device="cuda")
    for step in range(3):
        rotary = (torch.randn(4), torch.randn(4))  # new host tensors each step, as the pipeline
        gf_args = (x,)
        if step == 0:
            refusing = GraphedForward(forward, device="cuda")
            with pytest.raises(ValueError, match="cpu_inputs='to_device'"):
                refusing(*gf_args, rotary=rotary)
            staging = GraphedForward(forward, device="cuda", cpu_inputs="to_device")
        torch.testing.assert_close(
            staging(*gf_args, rotary=rotary), forward(x, rotary=rotary), rtol=0, atol=0
        )
    stats = staging.stats()
    assert stats["enabled"], stats["disabled_reason"]
    # a plain function, whose state no watch sees: its first call replays (docs/api.md)
    assert (stats["captures"], stats["replays"]) == (1, 3)
