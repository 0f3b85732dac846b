"""The seed's helpers (clone_static, copy_into, kwargs_signature), exported for code written
against the seed; GraphedForward does not use them. They walk trees as graphed._tree does, so a
signature's key is flatten_kwargs' key, and they name a refusal's path and reject an object that
holds a tensor the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from ._tree import (
    _WHY_REJECTED,
    _is_namedtuple_type,
    _item_segment,
    _leaf_token,
    _PathError,
    _pytree_children,
    _pytree_node,
    _pytree_segment,
    _reject_if_holds_tensor,
    _TensorInObject,
    _type_name,
    _walk_kwargs,
)

__all__ = ["clone_static", "copy_into", "kwargs_signature"]


class _Mismatch(_PathError):
    """Where the current tree differs from the static one; copy_into raises it as ValueError."""


def kwargs_signature(kwargs: dict, variant: Any = None) -> tuple:
    """Hashable (key, ((dtype, device, shape), ...)); tensor values never enter it."""
    tensors, key, _ = _walk_kwargs(kwargs, variant)
    return key, tuple((t.dtype, t.device, tuple(t.shape)) for t in tensors)


def _clone(value: Any) -> Any:
    cls = type(value)
    if cls is torch.Tensor or isinstance(value, torch.Tensor):
        buffer = torch.empty_like(value, memory_format=torch.contiguous_format)
        buffer.copy_(value)
        return buffer
    if cls is dict:
        cloned = {}
        for key, item in value.items():
            try:
                cloned[key] = _clone(item)
            except _PathError as error:
                error.segments.append(f"[{key!r}]")
                raise
        return cloned
    if cls is list or cls is tuple or _is_namedtuple_type(cls):
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_clone(item))
            except _PathError as error:
                error.segments.append(_item_segment(value, index))
                raise
        if cls is list:
            return items
        return tuple(items) if cls is tuple else cls(*items)
    node = _pytree_node(cls)
    if node is not None:
        children, context = _pytree_children(node, value)
        cloned_children = []
        for index, item in enumerate(children):
            try:
                cloned_children.append(_clone(item))
            except _PathError as error:
                error.segments.append(_pytree_segment(node, value, index))
                raise
        return node.unflatten_fn(cloned_children, context)
    _reject_if_holds_tensor(value)
    return value


def clone_static(tree: Any, *, root: str = "tree") -> Any:
    """Copy every tensor of `tree` into a fresh contiguous buffer; other leaves are kept as-is."""
    try:
        with torch.no_grad():
            return _clone(tree)
    except _TensorInObject as error:
        raise TypeError(f"{error.path(root)}: {error.what}; {_WHY_REJECTED}") from None


def _describe(value: Any) -> str:
    return "a tensor" if isinstance(value, torch.Tensor) else _type_name(type(value))


def _pair(static: Any, current: Any, dsts: list, srcs: list) -> None:
    """Match `current` against `static`, collecting the tensor pairs that need a copy."""
    if isinstance(static, torch.Tensor):
        if not isinstance(current, torch.Tensor):
            raise _Mismatch(f"static is a tensor, current is {_describe(current)}")
        if static.dtype != current.dtype:
            raise _Mismatch(f"dtype differs: static {static.dtype}, current {current.dtype}")
        if static.device != current.device:
            raise _Mismatch(f"device differs: static {static.device}, current {current.device}")
        if static.shape != current.shape:
            raise _Mismatch(f"shape differs: static {static.shape}, current {current.shape}")
        if static.data_ptr() != current.data_ptr():
            dsts.append(static)
            srcs.append(current)
        elif static.stride() != current.stride():
            # A differently strided view of the buffer itself: copy_ refuses the overlap.
            dsts.append(static)
            srcs.append(current.clone())
        return
    cls = type(static)
    if cls is not type(current):
        raise _Mismatch(f"static is {_describe(static)}, current is {_describe(current)}")
    if cls is dict:
        if static.keys() != current.keys():
            missing = [key for key in static if key not in current]
            extra = [key for key in current if key not in static]
            raise _Mismatch(f"dict keys differ: missing in current {missing}, extra {extra}")
        for key, item in static.items():
            try:
                _pair(item, current[key], dsts, srcs)
            except _PathError as error:
                error.segments.append(f"[{key!r}]")
                raise
        return
    if cls is list or cls is tuple or _is_namedtuple_type(cls):
        if len(static) != len(current):
            raise _Mismatch(f"length differs: static {len(static)}, current {len(current)}")
        for index, item in enumerate(static):
            try:
                _pair(item, current[index], dsts, srcs)
            except _PathError as error:
                error.segments.append(_item_segment(static, index))
                raise
        return
    node = _pytree_node(cls)
    if node is not None:
        static_children, static_context = _pytree_children(node, static)
        current_children, current_context = _pytree_children(node, current)
        if _leaf_token(static_context) != _leaf_token(current_context) or len(
            static_children
        ) != len(current_children):
            raise _Mismatch(
                f"{_type_name(cls)} structure differs: static {static_context!r}, "
                f"current {current_context!r}"
            )
        for index, (static_item, current_item) in enumerate(
            zip(static_children, current_children, strict=True)
        ):
            try:
                _pair(static_item, current_item, dsts, srcs)
            except _PathError as error:
                error.segments.append(_pytree_segment(node, static, index))
                raise
        return
    if static is current:
        return
    _reject_if_holds_tensor(current)
    if _leaf_token(static) != _leaf_token(current):
        raise _Mismatch(f"value differs: static {static!r}, current {current!r}")


def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    if len(dsts) > 1 and hasattr(torch, "_foreach_copy_"):
        try:
            torch._foreach_copy_(dsts, srcs)
            return
        except RuntimeError:
            pass  # e.g. mixed devices: copy one by one below
    for dst, src in zip(dsts, srcs, strict=True):
        dst.copy_(src)


def copy_into(static: Any, current: Any, *, root: str = "tree") -> int:
    """Copy the tensors of `current` into the same positions of `static`; return how many.

    Both trees must match in structure, non-tensor values and per-tensor dtype, device and
    shape. A current tensor already at its static buffer's address and strides is skipped.
    """
    dsts: list[torch.Tensor] = []
    srcs: list[torch.Tensor] = []
    try:
        _pair(static, current, dsts, srcs)
    except _TensorInObject as error:
        raise TypeError(f"{error.path(root)}: {error.what}; {_WHY_REJECTED}") from None
    except _Mismatch as error:
        raise ValueError(f"copy_into: {error.path(root)}: {error.what}") from None
    if dsts:
        with torch.no_grad():
            _copy_all(dsts, srcs)
    return len(dsts)
