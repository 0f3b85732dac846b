"""Verify mode: proving a graph computes what eager does, where graphed cannot prove it by
construction.

`GraphedForward(..., verify=N)`, or `GRAPHED_VERIFY=N` in the environment for a deployment: each of
the first N calls a graph serves (the capturing call included) also runs the module eagerly and
compares the two outputs, leaf by leaf: tensors bitwise (same dtype, shape and bits; NaN equals
NaN) or, with `verify_tolerance=(rtol, atol)`, as torch.allclose with equal_nan; every other leaf
with ==. The first difference disables the runner with the output path and the largest difference
in `disabled_reason`, warns, and the call returns eager's result. It catches what no check can
see: a tensor read through a closure, a global or an object attribute (not a module attribute), a
value the forward computes on the host from state. A forward that advances state (a KV cache, a
step counter) runs twice per verified call and so differs by design; verify those with the state
reset, or not at all.

A verifying GraphedForward keeps its class (an XPUGraphedForward, a user's subclass): it holds a
`Verifier` as its detour, which its __call__ hands each call to, while the plain call path reads
nothing of verify mode but the one attribute test a runner disabled for good needs too.
"""

from __future__ import annotations

import os
import threading
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

from ._arguments import pop_options

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


class Verifier:
    """The detour of a GraphedForward made with verify=N (see the module docstring): it makes the
    call through the graph, then, for each of the first N calls a graph serves, runs the module
    eagerly and compares."""

    def __init__(self, verification: Verification) -> None:
        self.verification = verification
        # Per thread: the verifier's own call through the graph (in `call`) takes the plain path,
        # while a call another thread makes at the same time is verified as any other.
        self._calling = threading.local()

    def takes_call(self) -> bool:
        """Whether the runner's __call__ hands this call to `call` (not the verifier's own)."""
        return not getattr(self._calling, "active", False)

    def call(self, runner: Any, args: tuple, kwargs: dict) -> Any:
        """`runner(*args, **kwargs)` through its graph, compared with eager while its graph has
        served at most N calls; a difference disables the runner and returns eager's result."""
        outer = getattr(self._calling, "active", False)
        self._calling.active = True
        try:
            result = runner(*args, **kwargs)
        finally:
            self._calling.active = outer
        served = runner._call_state.served
        verification = self.verification
        if runner._detour is not self or not 0 < served <= verification.calls:
            return result  # disabled meanwhile (its calls run eager), or served past N
        call = dict(kwargs)
        pop_options(call)
        expected = runner._eager(runner._bind_positional(args, call) if args else call)
        difference = verification.difference(result, expected)
        if difference is None:
            return result
        reason = f"verify: call {served} of a graph differed from eager {difference}"
        # Said once: the disable's own report (graphed._observe) names the reason.
        runner.disable(reason)
        return expected
