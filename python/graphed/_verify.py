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

Who does what. One engine, the extension's queue (pyext/gf_verify_sampled.c), makes every compared
call, whichever entry served it (the C fast entry or the Python path) and whatever the device: the
due rule (gf_call_state_due), the eager run (with grad mode off; the module's forward itself where
torch's call would find nothing to do first, pyext/gf_module_call.c), the comparison, the slots of
pending verdicts and their reading. It compares a tensor or a flat tuple, list or dict of them by
bytes in one launch itself; what bytes cannot tell (verify_tolerance, nested outputs and other
leaves, tensors not contiguous or on several devices) it hands to the comparison given at arm
time (`_Comparison`), which queues the same launch or a flag of torch operations into the same
slot, or answers at once. The first `verify` calls, and every call on a device that does not
defer (the CPU), wait for their verdict. Python keeps the options and the words of a difference
(graphed._verification), and here the disable (`Verifier.differed`) for the Differed the queue
returns.

What it costs, a sampled call on an H100 host beyond its replay: 3 to 4.3 us more than an eager
call, of which the comparison's launch is 1.3 (a ready graph, backends/cuda/gf_cuda_compare_jobs.h;
a kernel launch cost 3.4). With the queue kept here it cost 19 us; with the comparison in torch
operations, 93 to 205 us a sampled call in all; reading the result on the host at the sampled call
itself (torch.equal) stalled the stream, 73 to 115 us on the H200 beside a 25 to 38 us eager
forward. What bytes cannot tell still costs a sampled call this module's Python. Every other call
costs the call path the due rule, in C.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ._eager import VERIFY, EagerRun, run_eagerly
from ._inventory import inventory
from ._native import _graphed_fastcall as _fastcall
from ._verification import Verification

# Verdict bytes (one a slot) and scratch a runner's queue keeps (pyext/gf_verify_sampled.c).
_SLOTS = _fastcall.VERDICTS_PENDING_MOST
_RUN_EAGER = _fastcall.RUN_EAGER
# Where a sampled call's verdict is read at a later call; elsewhere (the CPU, whose work is done
# as it is queued) the call waits for it. Tests widen it to show the later reading on the CPU.
DEFERRED_DEVICE_TYPES = ("cuda",)


class Verifier:
    """What a GraphedForward made with verify options hands the extension's queue of compared
    calls when it arms it (the eager run, the comparison where bytes cannot tell, the memory of
    the verdicts), and the report and the disable of a difference the queue found."""

    def __init__(self, verification: Verification, call_state: Any) -> None:
        self.verification = verification
        self._call_state = call_state
        self._eager: EagerRun | None = None  # what its eager runs read (arm)

    @staticmethod
    def of(verification: Verification | None, call_state: Any) -> Verifier | NoVerifier:
        """The verifier of a runner's verify options (None: one that compares nothing) and call
        state."""
        return _NO_VERIFIER if verification is None else Verifier(verification, call_state)

    def arm(self, runner: Any, eager: EagerRun) -> None:
        """Arms the runner's queue (pyext/gf_verify_sampled.c): from now on it compares the calls
        its due rule samples. `eager`: what the runner's eager runs read (graphed._eager)."""
        self._eager = eager
        device, verification = runner.device, self.verification
        try:
            host = torch.empty(_SLOTS, dtype=torch.uint8, pin_memory=device.type == "cuda")
            scratch = torch.zeros(2 * _SLOTS, dtype=torch.int32, device=device)
        except RuntimeError:  # no such device here: the runner has no graphs to compare
            return
        compare = _Comparison(verification, runner.runner_id, host, scratch)
        # The forward itself (called as torch's call would, pyext/gf_module_call.c), with grad
        # mode off: capture_context is entered around an eager run only inside someone else's
        # stream capture (graphed._eager.run_context), where no graph serves a call.
        self._call_state.verify(
            runner.runner_id, verification.calls, verification.every, eager.forward_call,
            compare, host, scratch, verification.tolerance is None,
            device.type in DEFERRED_DEVICE_TYPES,
        )  # fmt: skip

    def stop(self) -> None:
        """The runner is disabled: no call is compared, the verdicts pending are dropped."""
        self._call_state.verify(None)

    def differed(self, runner: Any, kwargs: dict, differed: Any) -> Any:
        """The answer to a call the queue returned a Differed for: the runner disabled, with the
        sampled call's difference, and eager's result for the call (`kwargs`)."""
        served, replayed, expected, difference, result = differed
        if difference is None:  # the bytes said so (None again: the caller changed them since)
            difference = self.verification.difference(replayed, expected) or (
                "on the device (the returned tensors have changed since)"
            )
        self._disable(runner, served, difference)
        return run_eagerly(self._eager, kwargs, VERIFY) if result is _RUN_EAGER else result

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


class _Comparison(NamedTuple):
    """The queue's comparison where bytes cannot tell (`__call__`), with the runner's verdict
    memory: a byte a slot on the host, two int32 a slot on the device. It holds nothing that holds
    the queue, so a runner's CallState is freed with its last reference."""

    verification: Verification
    runner_id: int
    host: torch.Tensor
    scratch: torch.Tensor

    def __call__(self, replayed: Any, expected: Any, slot: int | None) -> str | int | None:
        """None when the outputs agree, where they differ (a phrase), or queued on the device
        into `slot`'s verdict byte (None: none free, compared at once): the bytes of the outputs
        the queue holds till then."""
        verification = self.verification
        difference, unread = verification._difference(replayed, expected, values=False)
        several_devices = len({tensor.device for pair in unread for tensor in pair}) > 1
        if difference is not None or slot is None or several_devices:
            return verification.difference(replayed, expected)  # the first, in the output's order
        if not unread:
            return None
        verdict = self.host[slot : slot + 1]
        if verification.tolerance is None:
            scratch = self.scratch[2 * slot : 2 * slot + 2]
            got, want = [left for left, _ in unread], [right for _, right in unread]
            try:
                queued = _fastcall.compare_later(self.runner_id, got, want, verdict, scratch)
            except RuntimeError:  # the launch failed: its scratch may hold a count
                scratch.zero_()
                queued = None
            if queued:
                return 2 * sum(tensor.nbytes for tensor in got)
        flag = verification.differs_on_device(unread)
        verdict.view(torch.bool).copy_(flag.reshape(1), non_blocking=flag.is_cuda)
        return 2 * sum(tensor.nbytes for tensor, _ in unread)


class NoVerifier:
    """The verifier of a runner without verify options: its entries sample no call."""

    def arm(self, runner: Any, eager: Any) -> None:
        pass

    def stop(self) -> None:
        pass


_NO_VERIFIER = NoVerifier()
