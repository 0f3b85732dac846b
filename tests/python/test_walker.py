"""The contract between the two walkers of a kwargs tree: the C walker (pyext/gf_walker.c, the
fast path's truth for plain trees) and graphed._tree (the Python path, for the trees C hands off).
On a table of plain trees both give the same tensors in the same order, and equal keys on one path
exactly when the other's are equal; the C decode (kwargs from a key, as the forward operator gets
them), output template and rebuild round-trip; and the call state each call sets is the outer
call's again once a nested call returns.
Through GraphedForward: keys of leaves whose repr hides their value, output templates keyed by
shape (also while reset races calls), and a forward calling its own GraphedForward."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
from typing import NamedTuple

import graphed  # noqa: F401  (loads the plugin the extension links against)
import numpy as np
import pytest
import torch
from graphed import GraphedForward
from graphed._native import _graphed_fastcall as fastcall
from graphed._tree import flatten_kwargs, flatten_output, rebuild_output, unflatten
from torch import nn

_F32 = torch.randn(2, 3)
_I64 = torch.arange(5)
_BOOL = torch.tensor(True)
_F16 = torch.zeros(1, 1, 1, dtype=torch.float16)
_STRIDED = torch.randn(4, 3).t()
_PARAM = torch.nn.Parameter(torch.randn(3))

# (kwargs, variant): plain trees the C walker takes.
_TREES = [
    ({"x": _F32}, None),
    ({"x": _F32}, "v1"),
    ({"x": _F32}, 3),
    ({"x": _F32}, True),
    ({"x": _I64}, None),
    ({"x": _F32, "y": _I64}, None),
    ({"y": _I64, "x": _F32}, None),
    ({"a": {"b": [_F32, (_I64, None)], "c": {}}, "d": [], "e": ()}, None),
    ({"a": {"b": [_F32, (_I64, None)], "c": []}, "d": [], "e": ()}, None),
    ({"a": {"b": (_F32, [_I64, None]), "c": {}}, "d": [], "e": ()}, None),
    ({"x": _F32, "leaves": [None, True, False, 0, 1, -5, 2**40, 1.5, -0.0, 0.0, "s", ""]}, None),
    ({"x": _F32, "leaves": [None, True, False, 0, 1, -5, 2**40, 1.5, 0.0, 0.0, "s", ""]}, None),
    ({"x": _F32, "flag": 1}, None),
    ({"x": _F32, "flag": True}, None),
    ({"x": _F32, "flag": 1.0}, None),
    ({"x": _F32, "flag": "1"}, None),
    ({"x": _F32, "seq": [1]}, None),
    ({"x": _F32, "seq": (1,)}, None),
    ({"ключ": _F32, "名前": {"ß": _I64, "": "ünïcødé ✓"}}, None),
    ({"ключ": _F32, "名前": {"ß": _I64, "": "unicode"}}, None),
    ({"shapes": [_F32, _I64, _BOOL, _F16, _STRIDED, _PARAM]}, None),
    ({"a": _F32, "b": [_F32, _F32], "c": {"d": _I64, "e": _F32}}, None),
    ({"a": _I64, "b": [_I64, _F32], "c": {"d": _F32, "e": _I64}}, None),
    ({"deep": [[[[{"t": (_F32,)}]]]]}, "deep"),
    ({}, None),
    ({"empty": {}}, None),
    ({"empty": []}, None),
]


def _python_flat(kwargs, variant):
    tensors, key, _ = flatten_kwargs(kwargs, variant)
    return key, tensors


def _same_tree(left, right) -> bool:
    """Equal structure and leaves (type included), tensors compared by identity."""
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        return left is right
    if type(left) is not type(right):
        return False
    if type(left) is dict:
        return list(left) == list(right) and all(_same_tree(left[k], right[k]) for k in left)
    if type(left) in (list, tuple):
        return len(left) == len(right) and all(map(_same_tree, left, right))
    return repr(left) == repr(right)


@pytest.mark.parametrize(("kwargs", "variant"), _TREES)
def test_both_walkers_give_the_same_tensors_in_the_same_order(kwargs, variant):
    flat = fastcall.flatten(kwargs, variant)
    assert flat is not fastcall.FALLBACK
    key, tensors = flat
    assert isinstance(key, bytes) and key.startswith(b"F")
    python_key, python_tensors = _python_flat(kwargs, variant)
    assert not python_key.startswith("F")
    assert len(tensors) == len(python_tensors)
    assert all(a is b for a, b in zip(tensors, python_tensors, strict=True))


def test_keys_are_equal_on_one_path_exactly_when_on_the_other():
    fast = [fastcall.flatten(kwargs, variant)[0] for kwargs, variant in _TREES]
    python = [_python_flat(kwargs, variant)[0] for kwargs, variant in _TREES]
    for i, j in itertools.combinations(range(len(_TREES)), 2):
        assert (fast[i] == fast[j]) == (python[i] == python[j]), (i, j)
    # Tensors are slots: other tensors in the same places give the same key on both paths.
    assert fast[5] != fast[6]  # dict order is structure
    assert fast[21] == fast[22] and python[21] == python[22]


@pytest.mark.parametrize(("kwargs", "variant"), _TREES)
def test_decode_puts_tensors_back_in_walk_order(kwargs, variant):
    # decode is what the forward operator runs on every probe, warm-up, capture and eager call:
    # the kwargs come from the key bytes alone, with the given tensors in the walk's slots.
    key, tensors = fastcall.flatten(kwargs, variant)
    replacements = [torch.empty(0) for _ in tensors]
    decoded = fastcall.decode(key, replacements)
    assert _same_tree(decoded, unflatten(flatten_kwargs(kwargs, variant)[2], replacements))
    key_again, tensors_again = fastcall.flatten(decoded, variant)
    assert key_again == key
    assert all(a is b for a, b in zip(tensors_again, replacements, strict=True))
    assert _same_tree(fastcall.decode(key, list(tensors)), kwargs)


def test_decode_and_rebuild_reject_a_wrong_tensor_count():
    key, _ = fastcall.flatten({"x": _F32}, None)
    with pytest.raises(ValueError, match="with 2 tensors"):
        fastcall.decode(key, [_F32, _I64])
    key, _ = fastcall.flatten({"x": _F32, "y": _I64}, None)
    with pytest.raises(ValueError, match="with 1 tensors"):
        fastcall.decode(key, [_F32])
    with pytest.raises(ValueError, match="not the key"):
        fastcall.decode(key[:-1], [_F32, _I64])
    template, _ = fastcall.output_template((_F32, _I64))
    with pytest.raises(ValueError, match="more tensor slots"):
        fastcall.rebuild(template, [_F32])


_PLAIN_RESULTS = [
    _F32,
    (_F32, _I64),
    [_F32, None, 2, 2.5, "s", b"b", 1j],
    {"cat": _F32, "mean": (_I64, torch.float32, torch.device("cpu"), torch.Size([2]))},
    {1: _F32, None: None, "empty": {}, "list": []},
    {"same": [_F32, _F32]},
    7,
    None,
    {},
]


class Pair(NamedTuple):
    first: torch.Tensor
    second: int


class Opaque:
    pass


@pytest.mark.parametrize("result", _PLAIN_RESULTS)
def test_output_template_and_rebuild_round_trip(result):
    made = fastcall.output_template(result)
    assert made is not None
    template, tensors = made
    assert type(template) is tuple and len(template) == 1
    # The same tensors in the same order as the Python path's output flattening.
    _, python_tensors = flatten_output(result)
    assert all(a is b for a, b in zip(tensors, python_tensors, strict=True))
    assert _same_tree(fastcall.rebuild(template, tensors), result)
    replacements = [torch.empty(0) for _ in tensors]
    rebuilt = fastcall.rebuild(template, replacements)
    assert _same_tree(rebuilt, rebuild_output(flatten_output(result)[0], replacements))


@pytest.mark.parametrize(
    "result",
    [Pair(_F32, 1), {"p": Pair(_F32, 1)}, [Opaque()], {(1, 2): _F32}, {_F32.dtype: {1, 2}}],
)
def test_output_template_hands_off_results_that_are_not_plain(result):
    assert fastcall.output_template(result) is None


@pytest.mark.parametrize(
    "kwargs",
    [{"p": Pair(_F32, 1)}, {"x": _F32, "o": Opaque()}, {"x": _F32, "big": 2**70}, {1: _F32}],
)
def test_flatten_hands_off_trees_that_are_not_plain(kwargs):
    assert fastcall.flatten(kwargs, None) is fastcall.FALLBACK


def test_call_state_is_a_named_type_set_only_during_a_call(emulated_backend):
    seen = []

    def forward(*, x, pair=None):
        state = gf._call_state
        seen.append((type(state.tree), state.key))
        return {"y": x * 2 if pair is None else pair.first * pair.second, "n": 1}

    # A runner that graphs: a disabled one answers its calls without the core (graphed._forward),
    # and its call state stays empty.
    gf = GraphedForward(forward, device="cpu", backend=emulated_backend)
    state = gf._call_state
    assert isinstance(state, fastcall.CallState)
    assert state.tree is None and state.key == b""
    x = torch.randn(3)
    fast = gf(x=x)
    runs_of_fast, seen[:] = list(seen), []
    python = gf(x=x, pair=Pair(x, 3))
    torch.testing.assert_close(fast["y"], x * 2, rtol=0, atol=0)
    torch.testing.assert_close(python["y"], x * 3, rtol=0, atol=0)
    # Each call's forward runs (warm-ups and the capture) saw that call's state.
    assert runs_of_fast and seen
    assert all(kind is dict and key.startswith(b"F") for kind, key in runs_of_fast)
    tree_spec = type(flatten_kwargs({})[2])
    assert all(kind is tree_spec and key.startswith(b"V") for kind, key in seen)
    assert fast["n"] == 1 and python["n"] == 1  # each call rebuilt from its own template
    assert state.tree is None and state.key == b""


@pytest.mark.parametrize("inner_path", ["c_entry_point", "python_path"])
@pytest.mark.parametrize("outer_path", ["c_entry_point", "python_path"])
def test_nested_calls_put_the_outer_call_state_back(outer_path, inner_path):
    """The forward calls the same GraphedForward again (run eagerly, without entering the core)
    and another one; after each, the state is the outer call's, so its output template lands
    under its key."""
    inner_gf = GraphedForward(lambda *, x, pair=None: {"inner": x + 1}, device="cpu")
    keys_after = []

    def forward(*, x, depth=0, pair=None):
        if pair is not None:
            x = pair.first
        if depth == 0:
            before = (gf._call_state.tree, gf._call_state.key)
            again = {"x": x, "depth": 1}
            if inner_path == "python_path":
                again = {"x": x, "depth": 1, "pair": Pair(x, 0)}
            nested = gf(**again)
            other = inner_gf(x=x, pair=again.get("pair"))
            keys_after.append((gf._call_state.tree, gf._call_state.key) == before)
            return {"out": nested["out"] * 2, "other": other["inner"]}
        return {"out": x * 3}

    gf = GraphedForward(forward, device="cpu")
    x = torch.randn(4)
    if outer_path == "python_path":
        out = gf(x=x, pair=Pair(x, 0))
    else:
        out = gf(x=x)
    torch.testing.assert_close(out["out"], x * 6, rtol=0, atol=0)
    torch.testing.assert_close(out["other"], x + 1, rtol=0, atol=0)
    assert keys_after == [True]
    # Only the outer call reached the core (its one eager run on a machine without graphs): the
    # nested call of the same instance ran eager in Python, through the one eager route, which
    # counts it by its reason; the outer call's output was rebuilt from its own forward's template.
    stats = gf.stats()
    assert stats["eager_by_reason"].get("reentered") == 1, stats
    assert stats["eager_calls"] == 2, stats
    assert gf._call_state.tree is None and inner_gf._call_state.tree is None


def test_captured_plain_call_replays_with_the_c_templates(emulated_backend):
    gf = GraphedForward(
        lambda *, x, cfg: {"y": (x * cfg["k"],), "k": cfg["k"]},
        device="cpu",
        backend=emulated_backend,
    )
    x = torch.randn(2, 2)
    first = gf(x=x, cfg={"k": 2})
    torch.testing.assert_close(first["y"][0], x * 2, rtol=0, atol=0)
    again = gf(x=torch.randn(2, 2), cfg={"k": 2})
    assert type(again["y"]) is tuple and again["k"] == 2 and again["y"][0].shape == (2, 2)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, 2)  # the capturing call replays too


@pytest.mark.parametrize("inner", ["fast", "python"])
@pytest.mark.parametrize("outer", ["fast", "python"])
def test_a_forward_calling_its_own_graphed_forward_runs_the_inner_call_eager(
    emulated_backend, outer, inner
):
    class SelfCalling(nn.Module):
        inside = False

        def forward(self, *, x, pair=None):
            if self.inside:
                return x * 3
            self.inside = True
            try:
                again = gf(x=x, pair=Pair(1, 2)) if inner == "python" else gf(x=x)
            finally:
                self.inside = False
            return again + 1

    m = SelfCalling()
    gf = GraphedForward(m, device="cpu", backend=emulated_backend)
    x = torch.ones(2)
    out = gf(x=x, pair=Pair(1, 2)) if outer == "python" else gf(x=x)
    torch.testing.assert_close(out, x * 3 + 1)


@pytest.mark.parametrize("path", ["fast", "python"])
@pytest.mark.parametrize("order", [(2, 3), (3, 2)])
def test_output_structure_that_depends_on_a_shape(emulated_backend, order, path):
    gf = GraphedForward(
        lambda *, x, pair=None: list(x.unbind(0)), device="cpu", backend=emulated_backend
    )
    extra = {"pair": Pair(1, 2)} if path == "python" else {}
    for batch in order + order:
        out = gf(x=torch.ones(batch, 3), **extra)
        assert isinstance(out, list) and len(out) == batch


def test_reset_racing_calls_never_leaves_a_key_without_its_template(emulated_backend):
    gf = GraphedForward(
        lambda *, x: {"y": x + 1}, device="cpu", backend=emulated_backend, max_entries=64
    )
    errors = []
    stop = threading.Event()

    def caller():
        try:
            while not stop.is_set():
                gf(x=torch.ones(3))
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        thread = threading.Thread(target=caller)
        thread.start()
        for _ in range(400):
            gf.reset()
        stop.set()
        thread.join(30)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    torch.testing.assert_close(gf(x=torch.ones(3))["y"], torch.full((3,), 2.0))


def test_lone_surrogate_strings_key_instead_of_raising(emulated_backend):
    # churn_limit=0: two values in a row, each of which must capture (the churn guard would run
    # the second eagerly).
    gf = GraphedForward(lambda *, x, tag: x, device="cpu", backend=emulated_backend, churn_limit=0)
    gf(x=torch.ones(2), tag="\ud800")
    gf(x=torch.ones(2), tag="\ud801")
    gf(x=torch.ones(2), tag="\ud800")
    assert gf.stats()["captures"] == 2


def test_numpy_arrays_whose_reprs_agree_get_their_own_keys(emulated_backend):
    gf = GraphedForward(  # churn_limit=0: two values in a row, each captured
        lambda *, x, table: x + float(table.sum()),
        device="cpu",
        backend=emulated_backend,
        churn_limit=0,
    )
    first = np.zeros(5000)
    second = np.zeros(5000)
    second[2500] = 1.0  # repr elides the middle: both print the same
    assert repr(first) == repr(second)
    gf(x=torch.zeros(2), table=first)
    out = gf(x=torch.zeros(2), table=second)
    torch.testing.assert_close(out, torch.ones(2), rtol=0, atol=0)
    assert gf.stats()["captures"] == 2


def test_dataclass_fields_hidden_from_repr_are_keyed(emulated_backend):
    @dataclasses.dataclass
    class Config:
        name: str
        scale: float = dataclasses.field(repr=False)

    gf = GraphedForward(lambda *, x, cfg: x * cfg.scale, device="cpu", backend=emulated_backend)
    gf(x=torch.ones(2), cfg=Config("a", 2.0))
    out = gf(x=torch.ones(2), cfg=Config("a", 3.0))
    torch.testing.assert_close(out, torch.full((2,), 3.0), rtol=0, atol=0)
