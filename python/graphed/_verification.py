"""Which calls verify mode compares and how closely (`Verification`, the verify options), and
the comparison of two outputs leaf by leaf: in words, with the output path and the largest
difference (`Verification.difference`, what a disable's reason says), or as a flag the device
computes without the host reading it (`differs_on_device`). graphed._verify hands it to the
extension's queue, which makes the comparisons; one job, apart from the queue's Python half.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

VERIFY_ENV = "GRAPHED_VERIFY"
VERIFY_EVERY_ENV = "GRAPHED_VERIFY_EVERY"


def _count(value: int | None, option: str, variable: str, what: str) -> int:
    """An option that counts calls (None: the environment variable's, 0 when unset)."""
    if value is None:
        text = os.environ.get(variable, "").strip()
        try:
            value = int(text) if text else 0
        except ValueError:
            raise ValueError(f"${variable} must be a whole number {what}, got {text!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{option} must be an int of 0 or more, got {value!r}")
    return value


class Verification(NamedTuple):
    """Which calls of each graph are compared with eager (the first `calls`, then one in `every`
    when it is not 0), and how closely."""

    calls: int
    tolerance: tuple[float, float] | None
    every: int = 0

    @classmethod
    def of(
        cls, calls: int | None, tolerance: tuple[float, float] | None, every: int | None = None
    ) -> Verification | None:
        """The constructor's verify options (None: $GRAPHED_VERIFY, $GRAPHED_VERIFY_EVERY), or
        None for none."""
        calls = _count(calls, "verify", VERIFY_ENV, "of calls to verify")
        every = _count(every, "verify_every", VERIFY_EVERY_ENV, "(verify one call in that many)")
        if tolerance is not None:
            if len(tolerance) != 2 or any(float(bound) < 0 for bound in tolerance):
                raise ValueError(
                    f"verify_tolerance must be (rtol, atol), both >= 0, got {tolerance!r}"
                )
            tolerance = (float(tolerance[0]), float(tolerance[1]))
        return cls(calls, tolerance, every) if calls > 0 or every > 0 else None

    def difference(self, replayed: Any, expected: Any) -> str | None:
        """None when the outputs agree, else where and by how much they differ (a phrase)."""
        return self._difference(replayed, expected, values=True)[0]

    def _difference(
        self, replayed: Any, expected: Any, values: bool
    ) -> tuple[str | None, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The first difference, and the pairs of tensors whose values were not compared
        (`values` False: structure, other leaves, dtypes and shapes only, nothing read from a
        device)."""
        if type(replayed) is torch.Tensor and type(expected) is torch.Tensor:
            got, want = [((), replayed)], [((), expected)]  # the common output, not flattened
        else:
            got, got_spec = pytree.tree_flatten_with_path(replayed)
            want, want_spec = pytree.tree_flatten_with_path(expected)
            if got_spec != want_spec:
                return f"in the output's structure ({got_spec} against eager's {want_spec})", []
        unread = []
        for (path, leaf), (_, eager_leaf) in zip(got, want, strict=True):
            is_tensor, eager_is_tensor = (isinstance(x, torch.Tensor) for x in (leaf, eager_leaf))
            if is_tensor and eager_is_tensor:
                if not values and leaf.dtype == eager_leaf.dtype and leaf.shape == eager_leaf.shape:
                    unread.append((leaf, eager_leaf))
                    continue
                mismatch = self._tensor_difference(leaf, eager_leaf)
            elif is_tensor or eager_is_tensor:  # != would compare a tensor elementwise
                mismatch = f"{type(leaf).__name__} against eager's {type(eager_leaf).__name__}"
            else:
                mismatch = (
                    None if leaf == eager_leaf else f"{leaf!r} against eager's {eager_leaf!r}"
                )
            if mismatch is not None:
                return f"at output{pytree.keystr(path)}: {mismatch}", []
        return None, unread

    def differs_on_device(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """A one-element bool tensor on the pairs' device, queued behind them and read by no
        one: whether any pair differs (bitwise, or beyond the tolerance)."""
        flag = None
        for got, want in pairs:
            if self.tolerance is None:
                differs = torch.ne(_bits(got), _bits(want)).any()
            else:
                rtol, atol = self.tolerance
                close = torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
                differs = close.logical_not_().any()
            flag = differs if flag is None else flag.logical_or_(differs)
        return flag

    def _tensor_difference(self, got: torch.Tensor, want: torch.Tensor) -> str | None:
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"{got.dtype}{list(got.shape)} against eager's {want.dtype}{list(want.shape)}"
        if self.tolerance is None:
            same = torch.equal(_bits(got), _bits(want))
        else:
            rtol, atol = self.tolerance
            same = torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        if same:
            return None
        if got.is_floating_point() or got.is_complex():
            largest = (got.double() - want.double()).abs().nan_to_num(float("inf")).max().item()
            kind = "bitwise" if self.tolerance is None else f"beyond rtol/atol {self.tolerance}"
            return f"largest difference {largest:.3g} ({kind}, {got.dtype}{list(got.shape)})"
        count = int((got != want).sum().item())
        return f"{count} of {got.numel()} elements differ ({got.dtype}{list(got.shape)})"


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, flat, so that bitwise equality holds for NaN and signed zeros too and
    does not depend on the layout (a contiguous tensor's are a view)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bool:
        return tensor.reshape(-1)
    if tensor.dim() > 0 and tensor.is_contiguous():
        return tensor.view(torch.uint8).reshape(-1)  # a view: no copy
    return tensor.reshape(-1).contiguous().view(torch.uint8)
