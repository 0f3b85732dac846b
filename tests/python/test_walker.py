"""The contract between the two walkers of a kwargs tree: the C walker (pyext/gf_walker.c, the
fast path's truth for plain trees) and graphed._tree (the Python path, for the trees C hands off).
On a table of plain trees both give the same tensors in the same order, and equal keys on one path
exactly when the other's are equal; the C substitute, output template and rebuild round-trip; and
the call state each call sets is the outer call's again once a nested call returns."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import graphed  # noqa: F401  (loads the plugin the extension links against)
import pytest
import torch
from graphed import GraphedForward
from graphed._native import _graphed_fastcall as fastcall
from graphed._tree import flatten_kwargs, flatten_output, rebuild_output, unflatten

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
def test_substitute_puts_tensors_back_in_walk_order(kwargs, variant):
    _, tensors = fastcall.flatten(kwargs, variant)
    replacements = [torch.empty(0) for _ in tensors]
    substituted = fastcall.substitute(kwargs, replacements)
    assert _same_tree(substituted, unflatten(flatten_kwargs(kwargs, variant)[2], replacements))
    key_again, tensors_again = fastcall.flatten(substituted, variant)
    assert all(a is b for a, b in zip(tensors_again, replacements, strict=True))
    assert _same_tree(fastcall.substitute(kwargs, list(tensors)), kwargs)


def test_substitute_and_rebuild_reject_a_wrong_tensor_count():
    with pytest.raises(ValueError, match="2 tensors"):
        fastcall.substitute({"x": _F32}, [_F32, _I64])
    with pytest.raises(ValueError, match="more tensor slots"):
        fastcall.substitute({"x": _F32, "y": _I64}, [_F32])
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


def test_call_state_is_a_named_type_set_only_during_a_call():
    seen = []

    def forward(*, x, pair=None):
        state = gf._call_state
        seen.append((type(state.tree), state.key))
        return {"y": x * 2 if pair is None else pair.first * pair.second, "n": 1}

    gf = GraphedForward(forward, device="cpu")
    state = gf._call_state
    assert isinstance(state, fastcall.CallState)
    assert state.tree is None and state.key == b""
    x = torch.randn(3)
    fast = gf(x=x)
    python = gf(x=x, pair=Pair(x, 3))
    torch.testing.assert_close(fast["y"], x * 2, rtol=0, atol=0)
    torch.testing.assert_close(python["y"], x * 3, rtol=0, atol=0)
    assert [kind for kind, _ in seen] == [dict, type(flatten_kwargs({})[2])]
    assert seen[0][1].startswith(b"F") and seen[1][1].startswith(b"V")
    assert set(state.templates) == {seen[0][1], seen[1][1]}
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
    # Only the outer call's template: the nested call of the same instance runs eager.
    assert len(gf._call_state.templates) == 1
    assert gf._call_state.tree is None and inner_gf._call_state.tree is None


def test_captured_plain_call_replays_with_the_c_templates():
    torch.ops.graphed.use_backend("emulated")
    try:
        gf = GraphedForward(lambda *, x, cfg: {"y": (x * cfg["k"],), "k": cfg["k"]}, device="cpu")
    finally:
        torch.ops.graphed.use_backend("default")
    x = torch.randn(2, 2)
    first = gf(x=x, cfg={"k": 2})
    torch.testing.assert_close(first["y"][0], x * 2, rtol=0, atol=0)
    again = gf(x=torch.randn(2, 2), cfg={"k": 2})
    assert type(again["y"]) is tuple and again["k"] == 2 and again["y"][0].shape == (2, 2)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (1, 2)  # the capturing call replays too
