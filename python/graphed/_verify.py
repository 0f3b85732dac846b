"""Proving a graph computes what eager does, where graphed cannot prove it by construction.

Two checks live here:

- **Verify mode** (`GraphedForward(..., verify=N)`, or `GRAPHED_VERIFY=N` in the environment for a
  deployment): each of the first N calls a graph serves (the capturing call included) also runs
  the module eagerly and compares the two outputs, leaf by leaf: tensors bitwise (same dtype,
  shape and bits; NaN equals NaN) or, with `verify_tolerance=(rtol, atol)`, as torch.allclose
  with equal_nan; every other leaf with ==. The first difference disables the runner with the
  output path and the largest difference in `disabled_reason`, warns, and the call returns eager's
  result. It catches what no check can see: a tensor read through a closure, a global or an object
  attribute (not a module attribute), a value the forward computes on the host from state. A
  forward that advances state (a KV cache, a step counter) runs twice per verified call and so
  differs by design; verify those with the state reset, or not at all.
- **Non-tensor outputs that do not follow from the key**: a Python number a forward returns is
  kept in the output template and returned by every replay of its graph. Its runs before a
  capture (the probe and the warm-ups) must all return the same one; a forward whose value
  differs between runs of one key (a call counter, a value read from module state) cannot be
  replayed, so the capture fails with the output path named (the runner runs eager from then on,
  agreed across a group, and warns once).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

from ._phases import PHASE_CAPTURE, PHASE_EAGER, PHASE_PROBE, PHASE_WARMUP
from ._tree import TreeSpec

VERIFY_ENV = "GRAPHED_VERIFY"


class Verification(NamedTuple):
    """How many calls of each graph are compared with eager, and how closely."""

    calls: int
    tolerance: tuple[float, float] | None

    @classmethod
    def of(cls, calls: int | None, tolerance: tuple[float, float] | None) -> Verification | None:
        """The constructor's verify options (calls None: $GRAPHED_VERIFY), or None for none."""
        if calls is None:
            text = os.environ.get(VERIFY_ENV, "").strip()
            try:
                calls = int(text) if text else 0
            except ValueError:
                raise ValueError(
                    f"${VERIFY_ENV} must be a whole number of calls to verify, got {text!r}"
                ) from None
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ValueError(f"verify must be an int of 0 or more, got {calls!r}")
        if tolerance is not None:
            if len(tolerance) != 2 or any(float(bound) < 0 for bound in tolerance):
                raise ValueError(
                    f"verify_tolerance must be (rtol, atol), both >= 0, got {tolerance!r}"
                )
            tolerance = (float(tolerance[0]), float(tolerance[1]))
        return cls(calls, tolerance) if calls > 0 else None

    def difference(self, replayed: Any, expected: Any) -> str | None:
        """None when the outputs agree, else where and by how much they differ (a phrase)."""
        got, got_spec = pytree.tree_flatten_with_path(replayed)
        want, want_spec = pytree.tree_flatten_with_path(expected)
        if got_spec != want_spec:
            return f"in the output's structure ({got_spec} against eager's {want_spec})"
        for (path, leaf), (_, eager_leaf) in zip(got, want, strict=True):
            where = f"at output{pytree.keystr(path)}"
            if isinstance(leaf, torch.Tensor) and isinstance(eager_leaf, torch.Tensor):
                mismatch = self._tensor_difference(leaf, eager_leaf)
                if mismatch is not None:
                    return f"{where}: {mismatch}"
            elif leaf != eager_leaf:
                return f"{where}: {leaf!r} against eager's {eager_leaf!r}"
        return None

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
    """The tensor's bytes, so that bitwise equality holds for NaN and signed zeros too."""
    flat = tensor.detach().reshape(-1).contiguous()
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat


def _first_difference(before: Any, now: Any, path: str) -> str:
    """The path of the first leaf two plain output templates differ at (graphed's walker builds
    them from dict, list and tuple; anything else is named as a whole)."""
    if type(before) is type(now) and isinstance(before, (list, tuple)) and len(before) == len(now):
        for index, (old, new) in enumerate(zip(before, now, strict=True)):
            if old != new:
                return _first_difference(old, new, f"{path}[{index}]")
    if type(before) is type(now) and isinstance(before, dict) and before.keys() == now.keys():
        for key in before:
            if before[key] != now[key]:
                return _first_difference(before[key], now[key], f"{path}[{key!r}]")
    return f"{path} ({before!r}, then {now!r})"


def check_template_of_key(owner: Any, phase: int, template: Any) -> None:
    """Records the output template of each run before a capture and, at the capture, raises the
    capture failure that names the first non-tensor output that differed between runs of the
    key (see the module docstring)."""
    runs: list[Any] | None = owner.__dict__.get("_templates_of_key")
    if phase in (PHASE_PROBE, PHASE_WARMUP):
        if runs is None:
            runs = owner.__dict__["_templates_of_key"] = []
        runs.append(template)
        return
    if phase not in (PHASE_CAPTURE, PHASE_EAGER) or runs is None:
        return
    del owner.__dict__["_templates_of_key"]
    if phase == PHASE_EAGER:
        return
    now = _comparable(template)
    for earlier in map(_comparable, runs):
        try:
            same = bool(earlier == now)
        except Exception:  # a value whose == is no truth value: it cannot be compared, so kept
            same = True
        if not same:
            where = (
                _first_difference(earlier, now, "output")
                if not isinstance(template, TreeSpec)
                else "output"
            )
            raise RuntimeError(
                f"graphed: the forward's non-tensor {where} differs between runs of one key "
                "before its capture; a graph would return the capture's value on every replay. "
                "Return it as a tensor, make it follow from the arguments, or leave this "
                "module eager"
            )


def _comparable(template: Any) -> Any:
    """What two runs' templates are compared by: the walked result inside a plain template (a
    1-tuple, graphed's C walker), the structure of a TreeSpec (graphed._tree), else itself."""
    if isinstance(template, TreeSpec):
        return template.root
    if isinstance(template, tuple) and len(template) == 1:
        return template[0]
    return template
