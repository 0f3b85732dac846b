"""Verify mode: proving a graph computes what eager does, where graphed cannot prove it by
construction, and keeping it proved in serving.

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

`verify_every=K` (or `GRAPHED_VERIFY_EVERY=K`) samples after that window: one call in K of each
graph is compared the same way, so that a change graphed cannot see is caught in serving, at the
cost of one eager forward per sampled call. A sampled call on a CUDA device compares on the device
and does not wait for it: its verdict (one byte) is copied to pinned host memory behind the
comparison, the call returns the graph's result, and a later call reads the byte once the device
wrote it (while any verdict is pending, the C entry hands every call here, about a microsecond
each). A difference then disables the runner with the path and the largest difference, as above,
and that call returns eager's result. Reading the result on the host at the sampled call itself
(torch.equal) stalled the stream: 73 to 115 us a sampled call on the H200 beside a 25 to 38 us
eager forward.

Which calls are compared is decided in C, where the call's count is (the CallState's verify
setting, pyext/gf_fastcall.c): such a call comes back as a SampledCall(result, served), and
GraphedForward hands it to its `Verifier`; every other call costs the call path one type test.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

from ._eager import VERIFY, run_eagerly
from ._inventory import inventory

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
        got, got_spec = pytree.tree_flatten_with_path(replayed)
        want, want_spec = pytree.tree_flatten_with_path(expected)
        if got_spec != want_spec:
            return f"in the output's structure ({got_spec} against eager's {want_spec})", []
        unread = []
        for (path, leaf), (_, eager_leaf) in zip(got, want, strict=True):
            where = f"at output{pytree.keystr(path)}"
            if isinstance(leaf, torch.Tensor) and isinstance(eager_leaf, torch.Tensor):
                if not values and leaf.dtype == eager_leaf.dtype and leaf.shape == eager_leaf.shape:
                    unread.append((leaf, eager_leaf))
                    continue
                mismatch = self._tensor_difference(leaf, eager_leaf)
                if mismatch is not None:
                    return f"{where}: {mismatch}", []
            elif leaf != eager_leaf:
                return f"{where}: {leaf!r} against eager's {eager_leaf!r}", []
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


# Verdicts of sampled calls that may wait for the device at once (and the bytes of outputs they
# hold, for the report), so that sampling faster than the device answers (verify_every=1) holds
# a bounded number of outputs; one more waits for the oldest.
_PENDING_MOST = 32
_PENDING_BYTES_MOST = 256 * 2**20
_NOT_WRITTEN = 2  # a verdict byte the device has not written yet (it writes 0 or 1)
# Where a sampled call's comparison is queued and its verdict read at a later call; elsewhere
# (the CPU, whose work is done as it is queued) the call compares at once. Tests widen it to
# show the later reading on the CPU.
DEFERRED_DEVICE_TYPES = ("cuda",)


class _Verdict(NamedTuple):
    """A sampled call's comparison queued on the device: the byte it lands in (pinned host memory,
    read without waiting), the stream it was queued on, and what was compared, for the report."""

    byte: Any  # a one-element numpy view of `host`
    host: torch.Tensor
    stream: Any
    served: int
    replayed: Any
    expected: Any
    nbytes: int  # of the compared tensors, both sides


class Verifier:
    """What a GraphedForward made with verify options does with a call the C entry returned as a
    SampledCall: runs the module eagerly and compares (see the module docstring)."""

    def __init__(self, verification: Verification) -> None:
        self.verification = verification
        self._call_state: Any = None
        self._pending: collections.deque[_Verdict] = collections.deque()
        self._pending_bytes = 0
        self._spare_bytes: list[torch.Tensor] = []

    def arm(self, call_state: Any) -> None:
        """Makes the runner's entries return the calls to compare as SampledCall."""
        self._call_state = call_state
        self._set_pending(False)

    def _set_pending(self, pending: bool) -> None:
        verification = self.verification
        self._call_state.verify(verification.calls, verification.every, pending)

    def _due(self, served: int) -> bool:
        calls, every = self.verification.calls, self.verification.every
        return served <= calls or (every > 0 and (served - calls) % every == 0)

    def compared(self, runner: Any, kwargs: dict, sampled: Any) -> Any:
        """The sampled call's result, compared with eager's for the same kwargs (the call's own,
        graphed's options taken out); a difference disables the runner and returns eager's
        result. A verdict of an earlier sampled call that the device has written is read first."""
        result, served = sampled
        if self._pending and self._read_verdicts(runner):
            return run_eagerly(runner, kwargs, VERIFY)
        if not self._due(served):  # handed here only for the pending verdicts
            return result
        expected = run_eagerly(runner, kwargs, VERIFY)
        verification = self.verification
        deferred = served > verification.calls
        difference, unread = verification._difference(result, expected, values=not deferred)
        if difference is None and unread:
            devices = {tensor.device for pair in unread for tensor in pair}
            if len(devices) == 1 and unread[0][0].device.type in DEFERRED_DEVICE_TYPES:
                if self._full() and self._wait_and_read(runner):  # an earlier call differed
                    return expected
                self._queue(verification.differs_on_device(unread), served, unread, result,
                            expected)  # fmt: skip
                return result
            difference = verification.difference(result, expected)
        if difference is None:
            return result
        self._disable(runner, served, difference)
        return expected

    def _full(self) -> bool:
        return len(self._pending) >= _PENDING_MOST or self._pending_bytes > _PENDING_BYTES_MOST

    def _wait_and_read(self, runner: Any) -> bool:
        """Sampled faster than the device answers: waits for the oldest verdict alone (its
        stream's later work, this call's included, goes on), then reads what is written."""
        oldest = self._pending[0]
        while oldest.byte[0] == _NOT_WRITTEN and not oldest.stream.query():
            time.sleep(0)  # lets other threads run meanwhile
        return self._read_verdicts(runner)

    def _queue(
        self, flag: torch.Tensor, served: int, pairs: list, replayed: Any, expected: Any
    ) -> None:
        """Copies the device's verdict to a pinned byte behind the comparison, without waiting."""
        nbytes = 2 * sum(got.numel() * got.element_size() for got, _ in pairs)
        on_cuda = flag.is_cuda
        host = self._spare_bytes.pop() if self._spare_bytes else _verdict_byte(on_cuda)
        byte = host.numpy()
        byte[0] = _NOT_WRITTEN
        host.view(torch.bool).copy_(flag.reshape(1), non_blocking=on_cuda)
        stream = torch.cuda.current_stream(flag.device) if on_cuda else _DONE
        self._pending.append(_Verdict(byte, host, stream, served, replayed, expected, nbytes))
        self._pending_bytes += nbytes
        if len(self._pending) == 1:
            self._set_pending(True)

    def _read_verdicts(self, runner: Any) -> bool:
        """Reads the verdicts the device has written, oldest first; True when one differed (the
        runner is then disabled)."""
        while self._pending:
            verdict = self._pending[0]
            written = int(verdict.byte[0])
            if written == _NOT_WRITTEN:
                return False
            self._pending.popleft()
            self._pending_bytes -= verdict.nbytes
            self._spare_bytes.append(verdict.host)
            if not self._pending:
                self._set_pending(False)
            if written:
                difference = self.verification.difference(verdict.replayed, verdict.expected)
                if difference is None:  # the caller changed the returned tensors since
                    difference = "on the device (the returned tensors have changed since)"
                self._pending.clear()
                self._pending_bytes = 0
                self._set_pending(False)
                self._disable(runner, verdict.served, difference)
                return True
        return False

    def _disable(self, runner: Any, served: int, difference: str) -> None:
        verification = self.verification
        which = (
            f"call {served} of a graph"
            if served <= verification.calls
            else f"call {served} of a graph (one in {verification.every} sampled)"
        )
        reason = f"verify: {which} differed from eager {difference}"
        read = sorted({name for record in inventory(runner) for name in record["externals"]})
        if read:  # the one staleness graphed cannot see itself (graphed._inventory)
            reason += (
                f"; its capture read tensors from outside the kwargs and the module ({read[0]}"
                f"{f' and {len(read) - 1} more' if len(read) > 1 else ''}): one re-bound while "
                "the old tensor stays alive is read as it was. Pass it as a kwarg or register "
                "it as a buffer"
            )
        # Said once: the disable's own report (graphed._observe) names the reason.
        runner.disable(reason, "verify")


def _verdict_byte(pinned: bool) -> torch.Tensor:
    return torch.empty(1, dtype=torch.uint8, pin_memory=pinned)


class _Done:
    """The "stream" of a comparison the CPU made as it was queued: done."""

    @staticmethod
    def query() -> bool:
        return True


_DONE = _Done()
