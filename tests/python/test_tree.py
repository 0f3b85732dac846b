"""Tests for graphed._tree, the Python walker (the fallback for trees the C walker hands back), and
graphed._seed, the seed's key/clone/copy helpers built on it.

Both modules are loaded from their file paths so these tests never need the native library.
"""

import dataclasses
import enum
import importlib.util
import pathlib
import sys
import types
from typing import NamedTuple

import pytest
import torch

# No native code of its own: graphed/_tree.py and graphed/_seed.py loaded from their files, with
# torch's own tensors; the sanitized run (scripts/sanitize.sh) leaves it out.
pytestmark = pytest.mark.pure_python

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[2] / "python" / "graphed"
_TREE_PATH = _PACKAGE_DIR / "_tree.py"
_SEED_PATH = _PACKAGE_DIR / "_seed.py"
# A stand-in package without graphed's __init__ (which loads the native library), so that
# _seed.py's `from ._tree import ...` finds the _tree loaded here.
_PACKAGE = "graphed_tree_only"
_package = types.ModuleType(_PACKAGE)
_package.__path__ = [str(_PACKAGE_DIR)]
sys.modules[_PACKAGE] = _package


def _load(name: str, path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"{_PACKAGE}.{name}", path, submodule_search_locations=None
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    setattr(_package, name, module)
    return module


tree = _load("_tree", _TREE_PATH)
seed = _load("_seed", _SEED_PATH)
# The tensor check is the extension's (tests/python/test_inputs.py tests it); loaded alone, the
# walker takes every tensor.
tree._native_refusal = lambda tensor: None


class Pair(NamedTuple):
    first: torch.Tensor
    second: object


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


@dataclasses.dataclass
class Conditioning:
    emb: torch.Tensor
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class Settings:
    steps: int
    name: str


class Holder:
    def __init__(self, payload):
        self.payload = payload


class SlottedHolder:
    __slots__ = ("inner",)

    def __init__(self, inner):
        self.inner = inner


def _rope(seq=4, dim=8):
    return {"cos": torch.randn(seq, dim), "sin": torch.randn(seq, dim)}


def test_round_trip_with_nested_rope_table():
    x = torch.randn(2, 4, 8)
    rope = _rope()
    kwargs = {"x": x, "rope": rope, "layers": [1, (2, None)], "mode": Mode.FAST}
    tensors, key, spec = tree.flatten_kwargs(kwargs)
    assert len(tensors) == 3
    assert tensors[0] is x and tensors[1] is rope["cos"] and tensors[2] is rope["sin"]
    assert isinstance(key, str)

    replacements = [t + 1 for t in tensors]
    rebuilt = tree.unflatten(spec, replacements)
    assert list(rebuilt) == ["x", "rope", "layers", "mode"]
    assert rebuilt["x"] is replacements[0]
    assert rebuilt["rope"]["cos"] is replacements[1]
    assert rebuilt["rope"]["sin"] is replacements[2]
    assert rebuilt["layers"] == [1, (2, None)] and type(rebuilt["layers"][1]) is tuple
    assert rebuilt["mode"] is Mode.FAST


def test_unflatten_rejects_wrong_tensor_count():
    _, _, spec = tree.flatten_kwargs({"a": torch.zeros(1), "b": [torch.zeros(2)]})
    with pytest.raises(ValueError, match="2 tensor slots"):
        tree.unflatten(spec, [torch.zeros(1)])


def test_key_is_deterministic_and_ignores_tensor_metadata():
    first = tree.flatten_kwargs({"x": torch.zeros(2, 3), "n": 3})[1]
    second = tree.flatten_kwargs({"x": torch.ones(5, dtype=torch.float16), "n": 3})[1]
    assert first == second


def test_optional_tensor_presence_changes_key():
    present = tree.flatten_kwargs({"x": torch.zeros(2), "mask": torch.ones(2)})[1]
    absent = tree.flatten_kwargs({"x": torch.zeros(2), "mask": None})[1]
    missing = tree.flatten_kwargs({"x": torch.zeros(2)})[1]
    assert len({present, absent, missing}) == 3


def test_namedtuple_round_trip_preserves_type():
    pair = Pair(torch.randn(3), "tag")
    tensors, key, spec = tree.flatten_kwargs({"pair": pair})
    assert tensors == [pair.first]
    rebuilt = tree.unflatten(spec, [torch.zeros(3)])["pair"]
    assert type(rebuilt) is Pair
    assert rebuilt.second == "tag" and torch.equal(rebuilt.first, torch.zeros(3))

    plain_tuple_key = tree.flatten_kwargs({"pair": (pair.first, "tag")})[1]
    assert key != plain_tuple_key


def test_non_tensor_values_and_variant_change_key():
    keys = {tree.flatten_kwargs({"n": value})[1] for value in (1, 1.0, True, "1", None)}
    assert len(keys) == 5
    base = tree.flatten_kwargs({"n": 1})[1]
    assert tree.flatten_kwargs({"n": 1}, variant="eval")[1] != base
    assert (
        tree.flatten_kwargs({"n": 1}, variant="eval")[1]
        == tree.flatten_kwargs({"n": 1}, variant="eval")[1]
    )
    assert tree.flatten_kwargs({"a": 1, "b": 2})[1] != tree.flatten_kwargs({"a": 2, "b": 1})[1]


def test_key_cannot_be_forged_by_a_string_that_looks_like_structure():
    nested = tree.flatten_kwargs({"a": ["x", "y"]})[1]
    forged = tree.flatten_kwargs({"a": ["x"], "y": 1})[1]
    assert nested != forged
    text_a = tree.flatten_kwargs({"a": "b", "c": "d"})[1]
    text_b = tree.flatten_kwargs({"a": "b', 'c': 'd"})[1]
    assert text_a != text_b


def test_signature_ignores_values_but_not_shape_dtype_variant():
    sig = seed.kwargs_signature({"x": torch.zeros(2, 3), "rope": _rope()})
    assert sig == seed.kwargs_signature({"x": torch.randn(2, 3), "rope": _rope()})
    assert hash(sig) == hash(seed.kwargs_signature({"x": torch.ones(2, 3), "rope": _rope()}))
    assert sig != seed.kwargs_signature({"x": torch.zeros(2, 4), "rope": _rope()})
    assert sig != seed.kwargs_signature(
        {"x": torch.zeros(2, 3, dtype=torch.float64), "rope": _rope()}
    )
    assert sig != seed.kwargs_signature({"x": torch.zeros(2, 3), "rope": _rope()}, variant=1)
    assert sig != seed.kwargs_signature({"x": torch.zeros(2, 3), "rope": _rope(seq=5)})
    assert sig[1][0] == (torch.float32, torch.device("cpu"), (2, 3))


def test_signature_sees_device():
    cpu = seed.kwargs_signature({"x": torch.zeros(2)})
    meta = seed.kwargs_signature({"x": torch.zeros(2, device="meta")})
    assert cpu != meta


def test_dataclass_holding_tensor_is_rejected_with_path():
    kwargs = {"cond": Conditioning(torch.zeros(2))}
    with pytest.raises(TypeError) as raised:
        tree.flatten_kwargs(kwargs)
    message = str(raised.value)
    assert "kwargs['cond'].emb" in message
    assert "capture-time address" in message
    with pytest.raises(TypeError, match=r"kwargs\['cond'\]\.emb"):
        seed.kwargs_signature(kwargs)


def test_object_holding_tensor_in_dict_attribute_is_rejected_with_path():
    kwargs = {"extra": [1, Holder({"k": [torch.zeros(1)]})]}
    with pytest.raises(TypeError, match=r"kwargs\['extra'\]\[1\]\.payload\['k'\]\[0\]"):
        tree.flatten_kwargs(kwargs)


def test_slots_and_sets_holding_tensors_are_rejected():
    with pytest.raises(TypeError, match=r"kwargs\['s'\]\.inner"):
        tree.flatten_kwargs({"s": SlottedHolder(torch.zeros(1))})
    with pytest.raises(TypeError, match="keep_alive"):
        tree.flatten_kwargs({"s": frozenset({torch.zeros(1)})})


def test_cyclic_tensor_free_object_is_a_plain_leaf():
    holder = Holder(None)
    holder.payload = holder
    tensors, _, spec = tree.flatten_kwargs({"h": holder, "x": torch.zeros(1)})
    assert len(tensors) == 1
    assert tree.unflatten(spec, tensors)["h"] is holder


def test_top_level_must_be_dict_with_str_keys():
    with pytest.raises(TypeError, match="must be a dict"):
        tree.flatten_kwargs([torch.zeros(1)])
    with pytest.raises(TypeError, match="must be str"):
        tree.flatten_kwargs({1: torch.zeros(1)})
    with pytest.raises(TypeError, match="must be a dict"):
        seed.kwargs_signature((torch.zeros(1),))


def test_clone_static_passes_tensor_free_leaves_by_identity():
    settings = Settings(steps=4, name="a")
    size = torch.Size([2, 3])
    device = torch.device("cpu")
    source = {
        "s": settings,
        "dtype": torch.float16,
        "device": device,
        "size": size,
        "n": None,
    }
    cloned = seed.clone_static(source)
    assert cloned is not source
    for name, value in source.items():
        assert cloned[name] is value


def test_clone_static_makes_fresh_contiguous_buffers():
    base = torch.arange(24.0).reshape(4, 6)
    strided = base.t()
    assert not strided.is_contiguous()
    source = [base, (strided, Pair(base[:, 1], 7))]
    cloned = seed.clone_static(source)
    tensors = [cloned[0], cloned[1][0], cloned[1][1].first]
    originals = [base, strided, base[:, 1]]
    for copy, original in zip(tensors, originals, strict=True):
        assert copy.data_ptr() != original.data_ptr()
        assert copy.is_contiguous()
        assert torch.equal(copy, original)
    assert type(cloned[1]) is tuple and type(cloned[1][1]) is Pair

    top = seed.clone_static(strided)
    assert top.is_contiguous() and torch.equal(top, strided)


def test_clone_static_does_not_track_grad():
    leaf = torch.randn(3, requires_grad=True)
    cloned = seed.clone_static({"w": leaf})["w"]
    assert cloned.grad_fn is None and not cloned.requires_grad


def test_clone_static_rejects_object_with_tensor():
    with pytest.raises(TypeError, match=r"tree\['cond'\]\.emb"):
        seed.clone_static({"cond": Conditioning(torch.zeros(2))})


def test_copy_into_copies_and_counts():
    current = {"x": torch.randn(2, 3), "rope": _rope(), "n": 5}
    static = seed.clone_static(current)
    fresh = {"x": torch.randn(2, 3), "rope": _rope(), "n": 5}
    static_ptrs = [static["x"].data_ptr(), static["rope"]["cos"].data_ptr()]
    assert seed.copy_into(static, fresh) == 3
    assert torch.equal(static["x"], fresh["x"])
    assert torch.equal(static["rope"]["cos"], fresh["rope"]["cos"])
    assert torch.equal(static["rope"]["sin"], fresh["rope"]["sin"])
    assert [static["x"].data_ptr(), static["rope"]["cos"].data_ptr()] == static_ptrs


def test_copy_into_single_tensor_and_top_level_tensor():
    static = seed.clone_static(torch.zeros(4))
    assert seed.copy_into(static, torch.full((4,), 2.0)) == 1
    assert torch.equal(static, torch.full((4,), 2.0))


def test_copy_into_skips_tensor_already_at_static_address():
    static = seed.clone_static({"x": torch.randn(3), "y": torch.randn(3)})
    static["x"].fill_(7.0)
    new_y = torch.randn(3)
    assert seed.copy_into(static, {"x": static["x"], "y": new_y}) == 1
    assert torch.equal(static["y"], new_y)
    assert seed.copy_into(static, {"x": static["x"], "y": static["y"]}) == 0
    assert torch.equal(static["x"], torch.full((3,), 7.0))
    assert torch.equal(static["y"], new_y)


def test_copy_into_same_address_different_strides_still_copies():
    square = torch.arange(9.0).reshape(3, 3)
    static = seed.clone_static([square])
    transposed_view = static[0].t()
    expected = static[0].t().clone()
    assert seed.copy_into(static, [transposed_view]) == 1
    assert torch.equal(static[0], expected)


def test_copy_into_handles_non_contiguous_current():
    static = seed.clone_static({"a": torch.zeros(3, 4), "b": torch.zeros(4)})
    source = torch.randn(4, 3)
    column = torch.randn(4, 2)[:, 1]
    assert not source.t().is_contiguous() and not column.is_contiguous()
    assert seed.copy_into(static, {"a": source.t(), "b": column}) == 2
    assert torch.equal(static["a"], source.t())
    assert torch.equal(static["b"], column)
    assert static["a"].is_contiguous()


def test_copy_into_shape_and_dtype_mismatch_raise_value_error():
    static = seed.clone_static({"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"tree\['x'\]: shape differs"):
        seed.copy_into(static, {"x": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match=r"tree\['x'\]: dtype differs"):
        seed.copy_into(static, {"x": torch.zeros(2, 3, dtype=torch.int64)})
    assert torch.equal(static["x"], torch.zeros(2, 3))


def test_copy_into_structure_and_value_mismatch_raise_value_error():
    static = seed.clone_static({"x": torch.zeros(2), "opt": [torch.zeros(1), 3]})
    with pytest.raises(ValueError, match="dict keys differ"):
        seed.copy_into(static, {"x": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"tree\['opt'\]: length differs"):
        seed.copy_into(static, {"x": torch.zeros(2), "opt": [torch.zeros(1)]})
    with pytest.raises(ValueError, match=r"tree\['opt'\]\[0\]: static is a tensor, current is"):
        seed.copy_into(static, {"x": torch.zeros(2), "opt": [None, 3]})
    with pytest.raises(ValueError, match=r"tree\['opt'\]\[1\]: static is int, current is float"):
        seed.copy_into(static, {"x": torch.zeros(2), "opt": [torch.zeros(1), 3.0]})
    with pytest.raises(ValueError, match=r"tree\['opt'\]\[1\]: value differs"):
        seed.copy_into(static, {"x": torch.zeros(2), "opt": [torch.zeros(1), 4]})
    with pytest.raises(ValueError, match=r"tree\['opt'\]: static is list, current is tuple"):
        seed.copy_into(static, {"x": torch.zeros(2), "opt": (torch.zeros(1), 3)})


def test_copy_into_rejects_object_with_tensor_in_current():
    static = seed.clone_static({"cond": Holder(None), "x": torch.zeros(1)})
    with pytest.raises(TypeError, match=r"tree\['cond'\]\.payload"):
        seed.copy_into(static, {"cond": Holder(torch.zeros(1)), "x": torch.ones(1)})
    assert seed.copy_into(static, {"cond": static["cond"], "x": torch.ones(1)}) == 1
