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
and does not wait for it: every pair of output tensors is compared bitwise in one launch (the
backend's compare_later), whose last block writes the verdict (one byte) into pinned host
memory; the call returns the graph's result, and a later call reads the byte once the device wrote
it. A difference then disables the runner with the path and the largest difference, as above,
and that call returns eager's result.

Who does what. Which calls are compared is decided in C, where the call's count is (the
CallState's verify setting, pyext/gf_fastcall.c). Where the comparison is bitwise on a device that
defers it, the fast entry makes the sampled calls after the first `verify` itself
(pyext/gf_verify_sampled.c: the eager run with grad mode off, the launch, the queue of 32 pending
verdicts and the reading of them at each later call), and hands a call up here, as a
SampledCall(result, served, expected, differed), only for what it cannot do: the first `verify`
calls (compared at once), outputs other than a tensor or a flat tuple, list or dict of them
(`expected` then says eager's result, so the forward is not run twice), a verdict that differed
(`differed`: the sampled call's number and both outputs, for the report), and the Python path's
calls. Those are compared here: by the same launch (`_queue_batched`, with a queue of its own,
which the C entry routes every call here for while it holds a verdict), or with verify_tolerance,
or outputs the bytes cannot tell (not contiguous, on several devices), by torch operations.

What it costs, a sampled call on an H100 host beyond its replay: 3 to 4.3 us more than an eager
call, of which the comparison's launch is 1.3 (a ready graph, backends/cuda/gf_cuda_compare_jobs.h;
a kernel launch cost 3.4), its eager run calling the module's forward without torch's call checks
where they would find nothing (pyext/gf_module_call.c, 1 us). Before: 19 us with the queue kept
here (the launch, a SampledCall handed up, the eager run's context and the bookkeeping), 9 us more
than the eager forward; with the comparison in torch operations queued from here, 21 us for a
pair's comparison and reduction alone and 93 to 205 us a sampled call in all; reading the result
on the host at the sampled call itself (torch.equal) stalled the stream, 73 to 115 us on the H200
beside a 25 to 38 us eager forward. Every other call costs the call path one type test.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

from ._eager import VERIFY, EagerRun, run_eagerly
from ._inventory import inventory
from ._native import _graphed_fastcall as _fastcall

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


# Verdicts of sampled calls that may wait for the device at once (and the bytes of outputs they
# hold, for the report), so that sampling faster than the device answers (verify_every=1) holds
# a bounded number of outputs; one more waits for the oldest. The fast entry's queue's bounds
# (pyext/gf_verify_sampled.c), named once there.
_PENDING_MOST = _fastcall.VERDICTS_PENDING_MOST
_PENDING_BYTES_MOST = _fastcall.VERDICT_BYTES_PENDING_MOST
_NOT_WRITTEN = _fastcall.VERDICT_NOT_WRITTEN  # a verdict byte not written yet (the device: 0 or 1)
# Where a sampled call's comparison is queued and its verdict read at a later call; elsewhere
# (the CPU, whose work is done as it is queued) the call compares at once. Tests widen it to
# show the later reading on the CPU.
DEFERRED_DEVICE_TYPES = ("cuda",)


class _VerdictSlot(NamedTuple):
    """Where a sampled call's verdict lands: one byte of host memory (pinned where the device
    writes it) and its one-element numpy view, read without waiting; and two zeroed int32 on the
    outputs' device that the batched comparison counts its blocks in (and leaves zero)."""

    host: torch.Tensor
    byte: Any
    scratch: torch.Tensor
    device: torch.device

    @classmethod
    def make(cls, device: torch.device) -> _VerdictSlot:
        host = torch.empty(1, dtype=torch.uint8, pin_memory=device.type == "cuda")
        scratch = torch.zeros(2, dtype=torch.int32, device=device)
        return cls(host, host.numpy(), scratch, device)


class _Verdict(NamedTuple):
    """A sampled call's comparison queued on the device: the slot its verdict lands in, and what
    was compared, for the report."""

    slot: _VerdictSlot
    served: int
    replayed: Any
    expected: Any
    nbytes: int  # of the compared tensors, both sides


class Verifier:
    """What a GraphedForward made with verify options does with a call the C entry returned as a
    SampledCall: runs the module eagerly and compares (see the module docstring)."""

    def __init__(self, verification: Verification, call_state: Any) -> None:
        self.verification = verification
        self._call_state = call_state
        self._eager: EagerRun | None = None  # what its eager runs read (arm)
        self._pending: collections.deque[_Verdict] = collections.deque()
        self._pending_bytes = 0
        self._spare_slots: list[_VerdictSlot] = []
        self._routed = False  # what the C entry was last told: verdicts are pending
        # Threads calling one runner take turns on its queue: one verdict is read (and its slot
        # made spare) once, however their bytecodes interleave.
        self._queue_lock = threading.RLock()

    @staticmethod
    def of(verification: Verification | None, call_state: Any) -> Verifier | NoVerifier:
        """The verifier of a runner's verify options (None: one that compares nothing) and call
        state."""
        return _NO_VERIFIER if verification is None else Verifier(verification, call_state)

    def arm(self, runner: Any, eager: EagerRun) -> None:
        """Makes the runner's entries return the calls to compare as SampledCall, and where the
        comparison is bitwise on a device that defers it, the fast entry make the sampled calls
        after the first `calls` itself (pyext/gf_verify_sampled.c). `eager`: what the runner's
        eager runs read (graphed._eager)."""
        self._eager = eager
        self._route(False)
        device, verification = runner.device, self.verification
        if (
            device.type in DEFERRED_DEVICE_TYPES
            and verification.every > 0
            and verification.tolerance is None
            and runner.options.capture_context is None
        ):
            on_cuda = device.type == "cuda"
            try:
                host = torch.full(
                    (_PENDING_MOST,), _NOT_WRITTEN, dtype=torch.uint8, pin_memory=on_cuda
                )
                scratch = torch.zeros(2 * _PENDING_MOST, dtype=torch.int32, device=device)
            except RuntimeError:  # no such device here: the runner has no graphs to sample
                return
            self._call_state.verify_natively(runner.runner_id, eager.forward_call, host, scratch)

    def stop(self) -> None:
        """The runner is disabled: no call is compared, the verdicts pending are dropped."""
        self._call_state.verify_natively(None)
        self._drop_pending()

    def _drop_pending(self) -> None:
        """Drops the verdicts pending, once the device has run their comparisons: a comparison
        still running writes its slot's pinned byte, which torch hands out again once dropped."""
        with self._queue_lock:
            _wait_for_device(self._pending)
            self._pending.clear()
            self._pending_bytes = 0

    def _route(self, pending: bool) -> None:
        """Tells the C entry whether to hand every call here (a verdict to read) or only the
        sampled ones."""
        verification = self.verification
        self._call_state.verify(verification.calls, verification.every, pending)
        self._routed = pending

    def _due(self, served: int) -> bool:
        calls, every = self.verification.calls, self.verification.every
        return served <= calls or (every > 0 and (served - calls) % every == 0)

    def compared(self, runner: Any, kwargs: dict, sampled: Any) -> Any:
        """The sampled call's result, compared with eager's for the same kwargs (the call's own,
        graphed's options taken out); a difference disables the runner and returns eager's
        result. A verdict of an earlier sampled call that the device has written is read first."""
        try:
            return self._compared(runner, kwargs, *sampled)
        finally:
            if self._routed != bool(self._pending):  # told once per change, not per call
                self._route(not self._routed)

    def _compared(
        self, runner: Any, kwargs: dict, result: Any, served: int, expected: Any, differed: Any
    ) -> Any:
        if differed is not None:  # a verdict the fast entry read (pyext/gf_verify_sampled.c)
            self._disable_for(runner, *differed)
            return run_eagerly(self._eager, kwargs, VERIFY)
        if self._pending and self._read_verdicts(runner):
            return run_eagerly(self._eager, kwargs, VERIFY)
        if expected is None:  # else the fast entry ran it and handed the comparison here
            if not self._due(served):  # handed here only for the pending verdicts
                return result
            expected = run_eagerly(self._eager, kwargs, VERIFY)
        verification = self.verification
        deferred = served > verification.calls
        if deferred and self._full() and self._wait_and_read(runner):  # an earlier one differed
            return expected
        difference, unread = verification._difference(result, expected, values=not deferred)
        if difference is None and unread:
            if verification.tolerance is None and self._queue_batched(
                runner, served, unread, result, expected
            ):
                return result
            devices = {tensor.device for pair in unread for tensor in pair}
            if len(devices) == 1 and unread[0][0].device.type in DEFERRED_DEVICE_TYPES:
                self._queue(verification.differs_on_device(unread), served, unread, result,
                            expected)  # fmt: skip
                return result
            difference = verification.difference(result, expected)
        if difference is None:
            return result
        self._disable(runner, served, difference)
        return expected

    def _queue_batched(
        self, runner: Any, served: int, pairs: list, result: Any, expected: Any
    ) -> bool:
        """Queues the bitwise comparison of the output tensors' `pairs` (of one dtype and shape
        each) in one launch, its verdict written by the device (pyext/gf_verify_compare.c): False
        where it queued nothing (a device that does not defer, bytes that cannot tell, a backend
        that cannot), for the torch operations to compare."""
        device = pairs[0][0].device
        if device.type not in DEFERRED_DEVICE_TYPES:
            return False
        got, want = [left for left, _ in pairs], [right for _, right in pairs]
        slot = self._slot(device)
        try:
            queued = _fastcall.compare_later(runner.runner_id, got, want, slot.host, slot.scratch)
        except RuntimeError:  # the launch failed: this slot's scratch may hold a count
            return False
        if not queued:
            self._spare_slots.append(slot)
            return False
        nbytes = 2 * sum(tensor.nbytes for tensor in got)
        self._pend(_Verdict(slot, served, result, expected, nbytes))
        return True

    def _slot(self, device: torch.device) -> _VerdictSlot:
        """A verdict's byte (marked not written) and scratch on `device`, reused once read."""
        slot = self._spare_slots.pop() if self._spare_slots else None
        if slot is None or slot.device != device:
            slot = _VerdictSlot.make(device)
        slot.byte[0] = _NOT_WRITTEN
        return slot

    def _pend(self, verdict: _Verdict) -> None:
        with self._queue_lock:
            self._pending.append(verdict)
            self._pending_bytes += verdict.nbytes

    def _full(self) -> bool:
        return len(self._pending) >= _PENDING_MOST or self._pending_bytes > _PENDING_BYTES_MOST

    def _wait_and_read(self, runner: Any) -> bool:
        """Sampled faster than the device answers: waits for the device to finish what was queued
        (the oldest verdict with it), then reads what is written."""
        oldest = self._pending[0]
        _wait_for_device([oldest])
        if oldest.slot.byte[0] == _NOT_WRITTEN:  # its work failed on the device: never written
            self._pending.popleft()
            self._pending_bytes -= oldest.nbytes
        return self._read_verdicts(runner)

    def _queue(
        self, flag: torch.Tensor, served: int, pairs: list, replayed: Any, expected: Any
    ) -> None:
        """Copies the device's verdict to a pinned byte behind the comparison, without waiting."""
        nbytes = 2 * sum(got.nbytes for got, _ in pairs)
        slot = self._slot(flag.device)
        slot.host.view(torch.bool).copy_(flag.reshape(1), non_blocking=flag.is_cuda)
        self._pend(_Verdict(slot, served, replayed, expected, nbytes))

    def _read_verdicts(self, runner: Any) -> bool:
        """Reads the verdicts the device has written, oldest first; True when one differed (the
        runner is then disabled)."""
        with self._queue_lock:
            return self._read_verdicts_held(runner)

    def _read_verdicts_held(self, runner: Any) -> bool:
        while self._pending:
            verdict = self._pending[0]
            written = int(verdict.slot.byte[0])
            if written == _NOT_WRITTEN:
                return False
            self._pending.popleft()
            self._pending_bytes -= verdict.nbytes
            self._spare_slots.append(verdict.slot)
            if written:
                self._drop_pending()
                self._disable_for(runner, verdict.served, verdict.replayed, verdict.expected)
                return True
        return False

    def _disable_for(self, runner: Any, served: int, replayed: Any, expected: Any) -> None:
        """Disables for a sampled call whose verdict, read later, said it differed."""
        difference = self.verification.difference(replayed, expected)
        if difference is None:  # the caller changed the returned tensors since
            difference = "on the device (the returned tensors have changed since)"
        self._disable(runner, served, difference)

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


def _wait_for_device(verdicts: Any) -> None:
    """Waits for the device to finish what was queued if one of `verdicts` is not written yet
    (the CPU's are written as they are queued)."""
    for verdict in verdicts:
        slot = verdict.slot
        if slot.byte[0] == _NOT_WRITTEN and slot.device.type == "cuda":
            torch.cuda.synchronize(slot.device)
            return


class NoVerifier:
    """The verifier of a runner without verify options: its entries sample no call."""

    def arm(self, runner: Any, eager: Any) -> None:
        pass

    def stop(self) -> None:
        pass


_NO_VERIFIER = NoVerifier()
