"""Container types registered with torch.utils._pytree, as third-party models use them:
transformers' and diffusers' ModelOutput (an OrderedDict subclass registered on subclassing),
OrderedDict, register_dataclass types and torch.return_types, in kwargs and in outputs. They are
keyed by type and structure, captured and replayed like plain trees, and outputs come back as the
same type. Runs on the CPU through the emulated backend, whose replays do no work and return what
the capture wrote: values are compared on the capturing call, type and structure on every call.
test_patterns_gpu.py compares the values of replays on a GPU; test_third_party_models.py runs the
real ModelOutput classes when transformers or diffusers is installed."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import pytest
import torch
import torch.utils._pytree as pytree
from graphed import GraphedForward


class ModelOutputLike(OrderedDict):
    """What transformers' ModelOutput is to pytree: an OrderedDict subclass whose subclasses are
    registered with their keys as context, rebuilt from keyword arguments."""

    def __init_subclass__(cls) -> None:
        pytree.register_pytree_node(
            cls,
            lambda output: (list(output.values()), list(output.keys())),
            lambda values, keys: cls(**dict(zip(keys, values, strict=True))),
            flatten_with_keys_fn=lambda output: (
                [(pytree.MappingKey(key), value) for key, value in output.items()],
                list(output.keys()),
            ),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        )


class SampleOutput(ModelOutputLike):
    pass


@dataclasses.dataclass
class Conditioning:
    hidden: torch.Tensor
    scale: float


pytree.register_dataclass(Conditioning)


class Denoiser(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, *, sample, cond, extras):
        hidden = self.proj(sample) * cond.scale + cond.hidden
        return SampleOutput(sample=hidden + extras["bias"], norm=hidden.norm(dim=-1))


def _inputs(batch: int = 2) -> dict:
    return {
        "sample": torch.randn(batch, 4),
        "cond": Conditioning(hidden=torch.randn(batch, 4), scale=0.5),
        "extras": OrderedDict(bias=torch.randn(4)),
    }


def _assert_same_output(got, want, *, values: bool) -> None:
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    for key in want:
        if values:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
        else:
            assert (got[key].shape, got[key].dtype) == (want[key].shape, want[key].dtype)


def test_registered_containers_in_and_out_are_captured_and_replayed(emulated_backend):
    module = Denoiser()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    for call in range(3):
        kwargs = _inputs()
        with torch.no_grad():
            want = module(**kwargs)
        _assert_same_output(gf(**kwargs), want, values=call == 0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (1, 3, 0)


def test_a_new_shape_inside_a_dataclass_captures_again(emulated_backend):
    gf = GraphedForward(Denoiser(), device="cpu", backend=emulated_backend)
    gf(**_inputs(batch=2))
    gf(**_inputs(batch=3))
    assert gf.stats()["captures"] == 2


def test_container_structure_and_context_are_in_the_key(emulated_backend):
    # churn_limit=0: three new keys in a row, each of which must capture.
    gf = GraphedForward(
        lambda *, d: {"s": sum(d.values())}, device="cpu", backend=emulated_backend, churn_limit=0
    )
    x, y = torch.randn(3), torch.randn(3)
    gf(d=OrderedDict(a=x, b=y))
    gf(d=OrderedDict(b=x, a=y))  # other keys order: another pytree context
    gf(d={"a": x, "b": y})  # a plain dict: another type
    conditioning_scales = GraphedForward(  # churn_limit=0: two values in a row, each captured
        lambda *, c: c.hidden * c.scale, device="cpu", backend=emulated_backend, churn_limit=0
    )
    h = torch.randn(3)
    # Each scale captures (its first call), so each value is the capture's, equal to eager.
    torch.testing.assert_close(conditioning_scales(c=Conditioning(h, 2.0)), h * 2, rtol=0, atol=0)
    torch.testing.assert_close(conditioning_scales(c=Conditioning(h, 3.0)), h * 3, rtol=0, atol=0)
    assert gf.stats()["captures"] == 3
    assert conditioning_scales.stats()["captures"] == 2  # a non-tensor field is a key, as in kwargs


def test_torch_return_types_come_back_as_their_type(emulated_backend):
    gf = GraphedForward(lambda *, x: x.max(dim=0), device="cpu", backend=emulated_backend)
    for call in range(2):
        x = torch.randn(4, 3)
        got = gf(x=x)
        want = x.max(dim=0)
        assert type(got) is type(want)
        assert got.indices.dtype == torch.int64 and got.values.shape == (3,)
        if call == 0:
            torch.testing.assert_close(got.values, want.values, rtol=0, atol=0)
            torch.testing.assert_close(got.indices, want.indices, rtol=0, atol=0)
    assert gf.stats()["captures"] == 1


class Unregistered:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def test_an_unregistered_object_holding_an_output_tensor_names_the_output_path():
    gf = GraphedForward(lambda *, x: {"out": Unregistered(x + 1)}, device="cpu")
    with pytest.raises(TypeError) as caught:
        gf(x=torch.randn(2))
    message = str(caught.value)
    assert "the forward's output['out'].tensor" in message
    assert "kwargs['output']" not in message
    assert "torch.utils._pytree" in message


def test_a_registered_input_with_a_bad_tensor_names_its_path(emulated_backend):
    gf = GraphedForward(lambda *, cond: cond.hidden, device="cpu", backend=emulated_backend)
    with pytest.raises(TypeError, match=r"kwargs\['cond'\]\.hidden is a meta tensor"):
        gf(cond=Conditioning(hidden=torch.empty(2, device="meta"), scale=1.0))
    assert gf.stats()["enabled"]


@dataclasses.dataclass
class PlainOutput:
    """A dataclass not registered with pytree, as a model's output class often is."""

    sample: torch.Tensor


class ReturnsPlainOutput(torch.nn.Module):
    def forward(self, *, x):
        return PlainOutput(sample=x * 2)


@pytest.mark.parametrize("backend", ["emulated", None])
def test_a_dataclass_output_is_one_type_error_naming_its_path_and_what_to_do(
    emulated_backend, backend, caplog, recwarn
):
    gf = GraphedForward(ReturnsPlainOutput(), device="cpu", backend=backend)
    with pytest.raises(TypeError) as caught:
        gf(x=torch.ones(3))
    error = caught.value
    assert type(error) is TypeError  # not a RuntimeError wrapping it
    message = str(error)
    assert message.startswith("the forward's output.sample: tensor inside a ")
    assert "PlainOutput object" in message
    assert "return a tuple or dict" in message and "register_dataclass" in message
    assert "return_dict=False" in message
    assert "keep_alive" not in message  # advice for what a graph reads, not for an output
    assert "At:" not in message and message.count("the forward's output") == 1
    # Said once: raised, and neither logged nor warned besides.
    assert not [r for r in caplog.records if "PlainOutput" in r.getMessage()]
    assert not [w for w in recwarn if "PlainOutput" in str(w.message)]
    assert gf.stats()["captures"] == 0
    if backend == "emulated":
        assert gf.stats()["enabled"]  # the forward's own error, not a failed capture
