"""The Python walker: flattens keyword-argument trees the C walker (pyext/gf_walker.c) hands back
(containers it does not know) into tensors plus a hashable key, and rebuilds outputs; the native
core then copies the tensors into the graph's static buffers.

dict, list, tuple and namedtuple are walked, and so is every container type registered with
torch.utils._pytree (transformers' and diffusers' ModelOutput, OrderedDict, defaultdict, deque,
torch.return_types, dataclasses registered with register_dataclass): keyed by its type and
pytree context, rebuilt through its registered unflatten. Any other object is an opaque leaf that
goes into the key by type and repr (a numpy array by dtype, shape and a digest of its bytes, a
dataclass by every field, since their reprs can be equal for different values); one that holds a
tensor is rejected, because that tensor would keep its capture-time address and never be
refreshed on replay. A plain tensor the core cannot take (sparse, nested, meta, quantized,
storage-less, more than 12 dimensions) is a TypeError or ValueError naming its path.

Plain trees (exact dict/list/tuple, exact tensors, None/bool/int/float/str) are GraphedForward's
fast path and belong to the C walker (pyext/gf_walker.c), which alone decides their tensor order;
this module walks the calls and outputs the C walker hands off.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["TreeSpec", "flatten_kwargs", "unflatten"]

# Leaves that can never hold a tensor: no search inside them.
_PRIMITIVE_TYPES = frozenset(
    (type(None), bool, int, float, complex, str, bytes)
    + (torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format)
)
# Objects whose attributes are not searched for tensors (classes, modules, functions, enums).
_NOT_SEARCHED = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    enum.Enum,
)
_MAX_SEARCH_DEPTH = 8
_WHY_REJECTED = (
    "its tensors would keep their capture-time address and not be refreshed on replay; "
    "pass the tensor through a dict, list or tuple, register its type with "
    "torch.utils._pytree, or pass it through keep_alive"
)
# An output is rebuilt around fresh tensors on every replay, so keep_alive (for what a graph
# reads) is no answer for it.
_WHY_OUTPUT_REJECTED = (
    "graphed rebuilds a forward's output around fresh tensors and cannot rebuild this type; "
    "return a tuple or dict instead, register the class with torch.utils._pytree "
    "(register_dataclass for a dataclass), or, for a diffusers or transformers model, pass "
    "return_dict=False"
)

# Spec nodes: _TENSOR marks a tensor slot; all others are tuples tagged by their first item.
_TENSOR = None
_LEAF, _DICT, _LIST, _TUPLE, _NAMEDTUPLE, _PYTREE = range(6)


@dataclass(frozen=True, slots=True, eq=False)
class TreeSpec:
    """What `unflatten` needs to rebuild a kwargs dict from its tensors."""

    root: tuple
    num_tensors: int


class _PathError(Exception):
    """Raised deep in a walk; each container level adds its path segment while unwinding."""

    def __init__(self, what: str, segment: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.segments = [segment] if segment else []

    def path(self, root: str) -> str:
        return root + "".join(reversed(self.segments))


class _TensorInObject(_PathError):
    pass


class _BadTensor(_PathError):
    """A tensor the core cannot take; `error_type` is TypeError or ValueError."""

    def __init__(self, what: str, error_type: type[Exception]) -> None:
        super().__init__(what)
        self.error_type = error_type


# The check every path makes of a tensor (pyext's gf_tensor_refused: the kinds of tensor the core
# cannot take and the dimension limit), from the extension, looked up at the first check and kept:
# an import statement per tensor cost 1.5 us each on the H200's host (100 us a call at 64 tensors).
# test_tree.py, which loads this file without the package, sets its own.
_native_refusal: Callable[[torch.Tensor], tuple[type[Exception], str] | None] | None = None
# The extension's decoder of a fast-path key, looked up at the first use and kept, likewise.
_native_decode: Callable[[bytes, list], dict] | None = None


def _check_tensor(tensor: torch.Tensor) -> None:
    """The native paths' check, for plain tensors; subclasses go through the dispatcher, where
    their modes see them."""
    global _native_refusal
    if type(tensor) is not torch.Tensor and type(tensor) is not torch.nn.Parameter:
        return
    if _native_refusal is None:
        from ._native._graphed_fastcall import refusal

        _native_refusal = refusal
    refused = _native_refusal(tensor)
    if refused is not None:
        error_type, why = refused
        raise _BadTensor(why, error_type)


def _is_namedtuple_type(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _type_name(cls: type) -> str:
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _key_repr(value: Any) -> str:
    """The repr a leaf is keyed by: repr, except where two different values share one."""
    cls = type(value)
    if cls.__module__ == "numpy" and cls.__name__ == "ndarray":
        # numpy elides the middle of large arrays in repr.
        if value.dtype.hasobject:
            return f"ndarray({_key_repr(value.tolist())})"
        digest = hashlib.blake2b(value.tobytes(), digest_size=16).hexdigest()
        return f"ndarray(dtype={value.dtype}, shape={value.shape}, bytes={digest})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Fields declared with repr=False are missing from the repr but not from the value.
        fields = ", ".join(
            f"{field.name}={_key_repr(getattr(value, field.name))}"
            for field in dataclasses.fields(value)
        )
        return f"{_type_name(cls)}({fields})"
    if cls in (list, tuple) and any(not isinstance(item, (int, float, str)) for item in value):
        close = "]" if cls is list else ",)" if len(value) == 1 else ")"
        return ("[" if cls is list else "(") + ", ".join(_key_repr(item) for item in value) + close
    if cls is dict:
        return "{" + ", ".join(f"{key!r}: {_key_repr(item)}" for key, item in value.items()) + "}"
    return repr(value)


def _leaf_token(value: Any) -> str:
    """Length-prefixed `type:repr`, so no repr can be mistaken for structure in the key."""
    text = f"{_type_name(type(value))}:{_key_repr(value)}"
    return f"L{len(text)}:{text}"


def _slot_names(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            private = slot.startswith("__") and not slot.endswith("__")
            names.append(f"_{klass.__name__.lstrip('_')}{slot}" if private else slot)
    return names


def _find_tensor(obj: Any, depth: int, seen: set[int]) -> str | None:
    """Path suffix to a tensor held somewhere inside `obj`, or None if there is none."""
    if isinstance(obj, torch.Tensor):
        return ""
    if type(obj) in _PRIMITIVE_TYPES or depth >= _MAX_SEARCH_DEPTH:
        return None
    if isinstance(obj, _NOT_SEARCHED) or id(obj) in seen:
        return None
    seen.add(id(obj))
    depth += 1
    if isinstance(obj, dict):
        for key, value in obj.items():
            found = _find_tensor(value, depth, seen)
            if found is not None:
                return f"[{key!r}]{found}"
        return None
    if isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            found = _find_tensor(value, depth, seen)
            if found is not None:
                return f"[{index}]{found}"
        return None
    if isinstance(obj, (set, frozenset)):
        for value in obj:
            found = _find_tensor(value, depth, seen)
            if found is not None:
                return f"{{<element>}}{found}"
        return None
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict):
        for name, value in attributes.items():
            found = _find_tensor(value, depth, seen)
            if found is not None:
                return f".{name}{found}"
    for name in _slot_names(type(obj)):
        try:
            value = getattr(obj, name)
        except AttributeError:
            continue
        found = _find_tensor(value, depth, seen)
        if found is not None:
            return f".{name}{found}"
    return None


def _reject_if_holds_tensor(value: Any) -> None:
    if type(value) in _PRIMITIVE_TYPES:
        return
    found = _find_tensor(value, 0, set())
    if found is not None:
        raise _TensorInObject(f"tensor inside a {_type_name(type(value))} object", found)


def _check_dict_key(key: Any) -> None:
    if type(key) in _PRIMITIVE_TYPES or isinstance(key, enum.Enum):
        return
    if type(key) is tuple:
        for item in key:
            _check_dict_key(item)
        return
    raise _PathError(f"dict key {key!r} of type {_type_name(type(key))} is not a primitive")


def _pytree_node(cls: type) -> Any:
    """The torch.utils._pytree registration of a container type the walk does not know by name
    (ModelOutput, OrderedDict, a registered dataclass), or None. torch.Size is registered too,
    but stays a leaf."""
    return None if cls in _PRIMITIVE_TYPES else pytree.SUPPORTED_NODES.get(cls)


def _pytree_children(node: Any, value: Any) -> tuple[list[Any], Any]:
    """(children, context) of a registered container; the context is the one unflatten_fn takes."""
    children, context = node.flatten_fn(value)
    return list(children), context


def _pytree_segment(node: Any, value: Any, index: int) -> str:
    """The path segment of a registered container's index-th child, for an error only: its key
    from flatten_with_keys_fn where the type has one (whose context may differ from
    flatten_fn's, as register_dataclass's does, so it is never used to rebuild), else "[index]"."""
    if node.flatten_with_keys_fn is not None:
        keyed, _ = node.flatten_with_keys_fn(value)
        if index < len(keyed):
            return str(keyed[index][0])
    return f"[{index}]"


_Check = Callable[[torch.Tensor], None] | None


def _flatten(
    value: Any, tensors: list[torch.Tensor], parts: list[str], check: _Check = None
) -> Any:
    """Append `value`'s tensors and key tokens; return its spec node. `check`, when given, is
    called with each tensor and raises _BadTensor to refuse it (kwargs: the tensors the core
    cannot take; outputs: none)."""
    cls = type(value)
    if cls is torch.Tensor or isinstance(value, torch.Tensor):
        if check is not None:
            check(value)
        tensors.append(value)
        parts.append("T")
        return _TENSOR
    if cls in _PRIMITIVE_TYPES:
        parts.append(_leaf_token(value))
        return (_LEAF, value)
    if cls is dict:
        keys = tuple(value)
        children = []
        parts.append("{")
        for key in keys:
            _check_dict_key(key)
            parts.append(_leaf_token(key))
            try:
                children.append(_flatten(value[key], tensors, parts, check))
            except _PathError as error:
                error.segments.append(f"[{key!r}]")
                raise
        parts.append("}")
        return (_DICT, keys, tuple(children))
    if cls is list or cls is tuple or _is_namedtuple_type(cls):
        node_head: tuple[Any, ...]
        if cls is list:
            node_head, close_token = (_LIST,), "]"
            parts.append("[")
        else:
            node_head, close_token = (_TUPLE,), ")"
            if cls is not tuple:
                name = _type_name(cls)
                node_head = (_NAMEDTUPLE, cls)
                parts.append(f"N{len(name)}:{name}")
            parts.append("(")
        children = _flatten_items(value, tensors, parts, check, _item_segment, value)
        parts.append(close_token)
        return (*node_head, children)
    node = _pytree_node(cls)
    if node is not None:
        items, context = _pytree_children(node, value)
        name = _type_name(cls)
        parts.append(f"P{len(name)}:{name}")
        parts.append(_leaf_token(context))
        parts.append("<")
        children = _flatten_items(items, tensors, parts, check, _pytree_segment, node, value)
        parts.append(">")
        return (_PYTREE, node, context, children)
    _reject_if_holds_tensor(value)
    parts.append(_leaf_token(value))
    return (_LEAF, value)


def _flatten_items(
    items: Any,
    tensors: list[torch.Tensor],
    parts: list[str],
    check: _Check,
    segment: Any,
    *owner: Any,
) -> tuple[Any, ...]:
    """The spec nodes of a container's children, flattened in order; a refusal inside the
    index-th one gets the path segment `segment(*owner, index)` (worked out only then)."""
    children = []
    for index, item in enumerate(items):
        try:
            children.append(_flatten(item, tensors, parts, check))
        except _PathError as error:
            error.segments.append(segment(*owner, index))
            raise
    return tuple(children)


def _item_segment(sequence: Any, index: int) -> str:
    fields = getattr(type(sequence), "_fields", None)
    return f".{fields[index]}" if fields and type(sequence) is not tuple else f"[{index}]"


def _walk(
    value: Any, parts: list[str], root: str, check: _Check, why_rejected: str = _WHY_REJECTED
) -> tuple[list[torch.Tensor], Any]:
    """(tensors, spec node) of `value`; refusals become TypeError/ValueError naming the path from
    `root` ("kwargs", "the forward's output"), an object holding a tensor with `why_rejected`."""
    tensors: list[torch.Tensor] = []
    try:
        return tensors, _flatten(value, tensors, parts, check)
    except _BadTensor as error:
        raise error.error_type(f"graphed: {error.path(root)} {error.what}") from None
    except _TensorInObject as error:
        raise TypeError(f"{error.path(root)}: {error.what}; {why_rejected}") from None
    except _PathError as error:
        raise TypeError(f"{error.path(root)}: {error.what}") from None


def _walk_kwargs(
    kwargs: dict, variant: Any, check: _Check = None
) -> tuple[list[torch.Tensor], str, tuple]:
    if type(kwargs) is not dict:
        raise TypeError(f"kwargs must be a dict, got {_type_name(type(kwargs))}")
    for name in kwargs:
        if type(name) is not str:
            raise TypeError(f"kwargs keys must be str, got {name!r} ({_type_name(type(name))})")
    parts = ["V", _leaf_token(variant)]
    tensors, root = _walk(kwargs, parts, "kwargs", check)
    return tensors, "".join(parts), root


def flatten_kwargs(kwargs: dict, variant: Any = None) -> tuple[list[torch.Tensor], str, TreeSpec]:
    """Split kwargs into (tensors in walk order, skeleton key, spec for `unflatten`).

    The key encodes containers, dict keys, lengths, every non-tensor value with its type, and
    `variant`; tensors appear only as placeholders (their dtype and shape are not in it).
    """
    tensors, key, root = _walk_kwargs(kwargs, variant, check=_check_tensor)
    return tensors, key, TreeSpec(root, len(tensors))


def refuse_tensors(kwargs: dict, why: Callable[[torch.Tensor], str | None]) -> None:
    """Walks `kwargs` as flatten_kwargs does (refusing what it refuses) and raises ValueError
    ("graphed: <path> <why>") for the first tensor `why` gives a sentence for: a refusal the
    native entries make by the tensor's kwarg path, made where they are not reached (an error
    path: it walks the kwargs again)."""

    def check(tensor: torch.Tensor) -> None:
        _check_tensor(tensor)
        what = why(tensor)
        if what is not None:
            raise _BadTensor(what, ValueError)

    _walk_kwargs(kwargs, None, check)


def _rebuild(node: Any, tensors: Any) -> Any:
    if node is _TENSOR:
        return next(tensors)
    tag = node[0]
    if tag == _LEAF:
        return node[1]
    if tag == _DICT:
        return dict(zip(node[1], [_rebuild(child, tensors) for child in node[2]], strict=True))
    if tag == _LIST:
        return [_rebuild(child, tensors) for child in node[1]]
    if tag == _TUPLE:
        return tuple([_rebuild(child, tensors) for child in node[1]])
    if tag == _PYTREE:
        return node[1].unflatten_fn([_rebuild(child, tensors) for child in node[3]], node[2])
    return node[1](*[_rebuild(child, tensors) for child in node[2]])


def unflatten(spec: TreeSpec, tensors: list[torch.Tensor]) -> Any:
    """Rebuild the tree (a kwargs dict, an output) `spec` came from, with `tensors` in the tensor
    slots."""
    if len(tensors) != spec.num_tensors:
        raise ValueError(f"spec has {spec.num_tensors} tensor slots, got {len(tensors)} tensors")
    return _rebuild(spec.root, iter(tensors))


def kwargs_of(source: bytes | TreeSpec, tensors: list[torch.Tensor]) -> dict:
    """The kwargs of a call from what the core keeps of it, with `tensors` in the tensor slots:
    the C walker's key (bytes) decoded, or the Python path's TreeSpec unflattened."""
    global _native_decode
    if type(source) is bytes:
        if _native_decode is None:
            from ._native._graphed_fastcall import decode

            _native_decode = decode
        return _native_decode(source, tensors)
    return unflatten(source, tensors)


def flatten_output(result: Any) -> tuple[TreeSpec, list[torch.Tensor]]:
    """(spec, tensors) of any forward result, walked as the kwargs are; rebuild_output inverts it.
    An object that holds a tensor and is none of the walked containers is a TypeError naming its
    path and what to return instead."""
    tensors, root = _walk(
        result, [], "the forward's output", check=None, why_rejected=_WHY_OUTPUT_REJECTED
    )
    return TreeSpec(root, len(tensors)), tensors


def rebuild_output(spec: TreeSpec, outputs: list[torch.Tensor]) -> Any:
    """The inverse of flatten_output."""
    return unflatten(spec, outputs)
