"""GraphedForward answers the nn.Module methods that return the module (eval, train, to, half,
cuda, requires_grad_, apply, ...): each is applied to the wrapped module and returns the
GraphedForward, so that `gf = GraphedForward(m, device=...).eval()` keeps a graphed. The graphs
are dropped when the call changed what they baked in (a parameter's dtype, address or layout);
a mode flip keys the calls in the module's new state, whose graphs are its own, and flipping back
replays the graphs of the state before (graphed._watch.States); a call that changes nothing
keeps them; a move off the runner's device is refused with the module left
as it was; for a callable that is not an nn.Module the names raise AttributeError as before.
Runs on the CPU through the emulated backend, which captures there."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _backend_choice import EMULATED
from graphed import GraphedForward

METHODS = (
    "apply",
    "bfloat16",
    "cpu",
    "cuda",
    "double",
    "eval",
    "float",
    "half",
    "ipu",
    "mtia",
    "requires_grad_",
    "share_memory",
    "to",
    "to_empty",
    "train",
    "type",
    "xpu",
)


# How torch annotates "returns the module" (typing.Self now, a TypeVar T before).
_SELF_ANNOTATIONS = ("typing.Self", "Self", "~T", "T")


class Block(torch.nn.Module):
    """A linear layer, a dropout (whose mode a graph holds) and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.dropout = torch.nn.Dropout(0.5)
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, *, x):
        return self.dropout(self.linear(x.to(self.linear.weight.dtype))) + self.offset


def _captured(module: torch.nn.Module) -> GraphedForward:
    """A GraphedForward of `module` on the emulated CPU backend with one captured graph."""
    gf = GraphedForward(module, device="cpu", backend=EMULATED)
    gf(x=torch.ones(2, 4))
    return gf


def _placement(module: torch.nn.Module) -> list:
    return [(t.data_ptr(), t.dtype, t.device) for t in (module.linear.weight, module.offset)]


def test_every_module_method_that_returns_the_module_is_answered():
    # The list above is torch's: every public nn.Module method annotated to return the module.
    returning_self = {
        name
        for name, value in vars(torch.nn.Module).items()
        if callable(value)
        and not name.startswith("_")
        and str(getattr(value, "__annotations__", {}).get("return")) in _SELF_ANNOTATIONS
    }
    assert {"eval", "cuda", "half"} <= returning_self  # the annotation is read as torch writes it
    returning_self |= {"apply", "requires_grad_", "to", "train"}  # return self, not annotated so
    assert returning_self <= set(METHODS), returning_self - set(METHODS)
    for name in METHODS:
        # The class's own (graphed._module_methods), not the wrapped module's via __getattr__.
        assert any(name in vars(cls) for cls in GraphedForward.__mro__[:-1]), name


@pytest.mark.parametrize(
    ("call", "changed"),
    [
        (lambda gf: gf.half(), lambda m: m.linear.weight.dtype == torch.float16),
        (lambda gf: gf.bfloat16(), lambda m: m.offset.dtype == torch.bfloat16),
        (lambda gf: gf.double(), lambda m: m.linear.weight.dtype == torch.float64),
        (lambda gf: gf.to(torch.float64), lambda m: m.linear.bias.dtype == torch.float64),
        (lambda gf: gf.to("cpu", torch.float16), lambda m: m.offset.dtype == torch.float16),
        (lambda gf: gf.type(torch.float64), lambda m: m.linear.weight.dtype == torch.float64),
        (lambda gf: gf.to_empty(device="cpu"), lambda m: m.linear.weight.device.type == "cpu"),
        (lambda gf: gf.share_memory(), lambda m: m.linear.weight.is_shared()),
        (lambda gf: gf.apply(lambda sub: setattr(sub, "seen", True)), lambda m: m.dropout.seen),
    ],
    ids=["half", "bfloat16", "double", "to-dtype", "to-device-dtype", "type", "to_empty",
         "share_memory", "apply"],
)  # fmt: skip
def test_a_method_that_changes_the_module_returns_the_graphed_and_drops_its_graphs(
    emulated_backend, call: Callable, changed: Callable
):
    module = Block().train()
    gf = _captured(module)
    assert gf.stats()["graphs"] == 1
    assert call(gf) is gf
    assert changed(module)
    assert gf.stats()["graphs"] == 0
    gf(x=torch.ones(2, 4))  # the next call captures again, in the new state
    assert gf.stats()["graphs"] == 1 and gf.stats()["captures"] == 2


def test_a_mode_flip_keys_its_own_graphs_and_flipping_back_replays(emulated_backend):
    module = Block().eval()
    gf = _captured(module)
    assert gf.train() is gf
    assert module.training and module.dropout.training
    assert gf.stats()["graphs"] == 1  # the eval graph stays
    gf(x=torch.ones(2, 4))  # captures the train mode's own
    assert (gf.stats()["graphs"], gf.stats()["captures"]) == (2, 2)
    assert gf.train(False) is gf and not module.dropout.training
    x = torch.ones(2, 4)  # the capture's: the emulated replay returns what the capture wrote
    with torch.no_grad():
        torch.testing.assert_close(gf(x=x), module(x=x), rtol=0, atol=0)
    assert gf.stats()["captures"] == 2  # the eval graph replayed


def test_float_of_a_double_module_drops_the_graphs(emulated_backend):
    module = Block().double()
    gf = _captured(module)
    assert gf.float() is gf
    assert module.linear.weight.dtype == torch.float32
    assert gf.stats()["graphs"] == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda gf: gf.eval(),
        lambda gf: gf.train(False),
        lambda gf: gf.float(),
        lambda gf: gf.to("cpu"),
        lambda gf: gf.to(torch.float32),
        lambda gf: gf.cpu(),
        lambda gf: gf.requires_grad_(False),
    ],
    ids=["eval", "train-False", "float", "to-cpu", "to-float32", "cpu", "requires_grad_"],
)
def test_a_method_that_changes_nothing_a_graph_holds_keeps_the_graphs(emulated_backend, call):
    module = Block().eval()
    gf = _captured(module)
    before = _placement(module)
    assert call(gf) is gf
    assert _placement(module) == before
    assert gf.stats()["graphs"] == 1


def test_requires_grad_is_applied(emulated_backend):
    module = Block()
    gf = _captured(module)
    assert gf.requires_grad_(False) is gf
    assert not any(p.requires_grad for p in module.parameters())
    assert gf.requires_grad_() is gf
    assert all(p.requires_grad for p in module.parameters())


def test_the_usual_construction_chain_keeps_a_graphed(emulated_backend):
    module = Block().train()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend).eval().to(torch.float64)
    assert isinstance(gf, GraphedForward)
    assert not module.training and module.linear.weight.dtype == torch.float64
    gf(x=torch.ones(2, 4))
    gf(x=torch.ones(2, 4))
    assert gf.stats()["captures"] == 1 and gf.stats()["replays"] == 2


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda gf: gf.to("meta"), "to(...) would move the module to meta"),
        (lambda gf: gf.to(torch.empty(1, device="meta")), "to meta"),
        (lambda gf: gf.to(device="meta", dtype=torch.float16), "to meta"),
        (lambda gf: gf.cuda(), "cuda() would move the module to cuda"),
        (lambda gf: gf.cuda(1), "to cuda:1"),
        (lambda gf: gf.xpu(), "xpu() would move the module to xpu"),
        (lambda gf: gf.to_empty(device="meta"), "to_empty() would move the module to meta"),
        (lambda gf: gf.type("torch.cuda.FloatTensor"), "type() would move the module to cuda"),
    ],
    ids=["to", "to-tensor", "to-keywords", "cuda", "cuda-1", "xpu", "to_empty", "type"],
)
def test_a_move_off_the_runners_device_is_refused_and_leaves_the_module(
    emulated_backend, call, words
):
    module = Block().eval()
    gf = _captured(module)
    before = _placement(module)
    with pytest.raises(ValueError) as caught:
        call(gf)
    message = str(caught.value)
    assert words in message
    assert "off the device this GraphedForward runs on (cpu)" in message
    assert "make a new GraphedForward for that device" in message
    assert _placement(module) == before
    assert gf.stats()["graphs"] == 1


def test_cpu_is_refused_for_a_runner_on_another_device():
    module = Block()
    gf = GraphedForward(module, device="cuda")  # created disabled on a machine without CUDA
    before = _placement(module)
    with pytest.raises(ValueError, match=r"cpu\(\) would move the module to cpu, off the device"):
        gf.cpu()
    assert _placement(module) == before


@pytest.mark.parametrize("name", METHODS)
def test_for_a_callable_that_is_not_a_module_the_names_raise_attribute_error(name):
    gf = GraphedForward(lambda *, x: x + 1, device="cpu")
    assert not hasattr(gf, name)
    with pytest.raises(AttributeError):
        getattr(gf, name)


def test_for_a_callable_object_with_its_own_to_the_object_answers_as_before():
    class OwnTo:
        def __call__(self, *, x):
            return x

        def to(self, *args):
            return "the object's own"

    gf = GraphedForward(OwnTo(), device="cpu")
    assert gf.to("meta") == "the object's own"
