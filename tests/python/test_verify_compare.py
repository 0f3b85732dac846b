"""Verify mode's batched comparison (pyext/gf_verify_compare.c, the backend's compare_later): a
sampled call's output pairs compared by bytes in one launch whose verdict the device writes into
a host byte. On the CPU the emulated backend compares at once (graphed._verify's deferral widened
to the CPU); on a GPU the kernel's verdict is read after a synchronize, over pair counts that span
launches, sizes that take its vector and byte paths, and a difference in the last byte."""

from __future__ import annotations

import collections
import functools
import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable

import pytest
import torch
from _gpu import on_gpu
from graphed import GraphedForward, _verification, _verify
from graphed._native import _graphed_fastcall as _fastcall
from test_changed_state import ReadsAHiddenTensor


class Outputs(ReadsAHiddenTensor):
    """A dict of a tuple of tensors and a non-tensor leaf, one tensor read from an object graphed
    cannot watch (re-bound after capture: a stale replay only verify sees)."""

    def forward(self, x):
        y = self.linear(x)
        return {"y": y, "pair": (y * 2, y + self.holder.offset), "scale": 2}


@pytest.fixture
def sampled_on_the_cpu(emulated_backend, monkeypatch):
    """Makes runners on the emulated backend whose every call is sampled, the comparison deferred
    on the CPU as on a device (graphed._verify's deferral widened to the CPU)."""
    monkeypatch.setattr(_verify, "DEFERRED_DEVICE_TYPES", ("cuda", "cpu"))
    return lambda module: GraphedForward(
        module, device="cpu", backend=emulated_backend, verify_every=1
    )


def _slot(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    host = torch.full((1,), 2, dtype=torch.uint8, pin_memory=device == "cuda")
    return host, torch.zeros(2, dtype=torch.int32, device=device)


def _captured(emulated_backend: str | None, device: str) -> GraphedForward:
    """A runner whose graph was captured (so its backend holds its device state)."""
    module = torch.nn.Linear(4, 4).to(device)
    gf = GraphedForward(module, device=device, backend=emulated_backend)
    gf(torch.ones(2, 4, device=device))
    return gf


def test_compare_later_writes_the_verdict_and_tells_what_bytes_cannot(emulated_backend):
    gf = _captured(emulated_backend, "cpu")
    a, b = torch.arange(6.0), torch.arange(6.0)
    host, scratch = _slot("cpu")
    assert _fastcall.compare_later(gf.runner_id, [a, a[:2]], [b, b[:2]], host, scratch) is True
    assert host.item() == 0
    b[5] = -0.0 if a[5] == 0 else -a[5]
    assert _fastcall.compare_later(gf.runner_id, [a], [b], host, scratch) is True
    assert host.item() == 1
    # Another dtype or shape: a difference the host sees; not contiguous: compared another way.
    assert _fastcall.compare_later(gf.runner_id, [a], [b.int()], host, scratch) is False
    assert _fastcall.compare_later(gf.runner_id, [a], [b[:5]], host, scratch) is False
    strided = torch.arange(12.0)[::2]
    assert _fastcall.compare_later(gf.runner_id, [strided], [a], host, scratch) is None
    # A lazy conjugate: its bytes are not its values.
    z = torch.complex(a, a)
    assert _fastcall.compare_later(gf.runner_id, [z.conj()], [z], host, scratch) is None
    # Nothing with bytes: equal at once.
    host.fill_(2)
    assert _fastcall.compare_later(gf.runner_id, [], [], host, scratch) is True
    assert host.item() == 0
    with pytest.raises(TypeError, match="compare_later"):
        _fastcall.compare_later(gf.runner_id, [a], [], host, scratch)


def test_a_runner_without_a_comparing_backend_compares_another_way():
    """The CPU's own runner has no device backend: None, nothing written."""
    gf = GraphedForward(torch.nn.Linear(4, 4), device="cpu")
    gf(torch.ones(2, 4))
    host, scratch = _slot("cpu")
    a = torch.ones(3)
    assert _fastcall.compare_later(gf.runner_id, [a], [a.clone()], host, scratch) is None
    assert host.item() == 2


class FlatOutputs(ReadsAHiddenTensor):
    """A flat tuple of tensors: what the queue compares by bytes itself
    (pyext/gf_verify_sampled.c)."""

    def forward(self, x):
        y = self.linear(x)
        return y * 2, y + self.holder.offset


@pytest.mark.parametrize(
    ("make", "stale_part", "path"),
    [
        (FlatOutputs, lambda output: output[1], "output[1]"),
        (Outputs, lambda output: output["pair"][1], "output['pair'][1]"),
    ],
    ids=["flat, compared by the queue's bytes", "nested, by the Python layer's comparison"],
)
def test_a_stale_output_is_told_at_the_next_call_by_its_path(
    emulated_backend, monkeypatch, make, stale_part, path
):
    monkeypatch.setattr(_verify, "DEFERRED_DEVICE_TYPES", ("cuda", "cpu"))
    module = make()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, verify_every=1)
    x = torch.ones(2, 4)
    for _ in range(3):  # the graph's calls 1 (its capture) to 3, each sampled, equal
        gf(x)
        assert gf._call_state.verdicts_pending == 1, "both kinds pend in the one queue"
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]
    module.holder.previous = module.holder.offset
    module.holder.offset = torch.ones(4)
    gf(x)  # call 4, sampled: the verdict is written, read at the next call
    assert gf.stats()["enabled"]
    with torch.no_grad():
        expected = module(x)
    got = gf(x)
    torch.testing.assert_close(stale_part(got), stale_part(expected), rtol=0, atol=0)
    reason = gf.stats()["disabled_reason"]
    assert f"call 4 of a graph (one in 1 sampled) differed from eager at {path}" in reason, reason
    assert gf._call_state.verdicts_pending == 0, "a disabled runner holds no outputs"


class TakesAnOrderedDict(ReadsAHiddenTensor):
    """Its kwarg is an OrderedDict, which the C walker hands back: its calls take the Python
    path (call_flat)."""

    def forward(self, inputs):
        return super().forward(inputs["x"])


@pytest.mark.parametrize("which", ["the Python path", "a tolerance"])
def test_the_python_paths_and_a_tolerances_sampled_calls_pend_in_the_one_queue(
    emulated_backend, monkeypatch, which
):
    """Whichever entry served the call and however it is compared, its verdict pends in the
    extension's queue and a difference is told at the next call."""
    monkeypatch.setattr(_verify, "DEFERRED_DEVICE_TYPES", ("cuda", "cpu"))
    python_path = which == "the Python path"
    module = TakesAnOrderedDict() if python_path else ReadsAHiddenTensor()
    tolerance = None if python_path else (0.0, 0.5)
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, verify_every=1,
                        verify_tolerance=tolerance)  # fmt: skip
    x = torch.ones(2, 4)
    call = (lambda: gf(collections.OrderedDict(x=x))) if python_path else (lambda: gf(x))
    for _ in range(3):
        call()
        assert gf._call_state.verdicts_pending == 1
    module.holder.previous = module.holder.offset
    module.holder.offset = torch.ones(4)  # beyond the tolerance's atol
    call()  # call 4, sampled: the verdict is written, read at the next call
    assert gf.stats()["enabled"]
    with torch.no_grad():
        torch.testing.assert_close(call(), module.forward(*([{"x": x}] if python_path else [x])))
    reason = gf.stats()["disabled_reason"]
    assert "call 4 of a graph (one in 1 sampled) differed from eager at output" in reason, reason
    assert gf._call_state.verdicts_pending == 0


class Tallied(torch.nn.Module):
    """Counts its forward's runs in an object graphed does not look into (a count kept in a
    module attribute would be a value the watch sees change at every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.tally = type("Tally", (), {"runs": 0})()

    def forward(self, x):
        self.tally.runs += 1
        return self.linear(x)


def _over_sampled_calls(gf: GraphedForward, count: Callable[[], int], calls: int = 5) -> int:
    """How much `count` grew over `calls` sampled calls (each replays, and runs the forward
    eagerly once) after the capture and the first ones; the runner still enabled, its verdicts in
    the queue."""
    x = torch.ones(2, 4)
    for _ in range(3):
        gf(x)
    before = count()
    for _ in range(calls):
        gf(x)
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]
    assert gf._call_state.verdicts_pending == 1
    return count() - before


def test_a_sampled_calls_eager_run_calls_forward_as_torchs_call_would(sampled_on_the_cpu):
    """No hooks, not compiled, no trace: the eager run calls the module's forward itself, as
    torch's own call would after finding nothing to do (gf_module_call.c), not through it."""
    module = Tallied()
    gf = sampled_on_the_cpu(module)
    through_torch = []
    call_impl = torch.nn.Module._call_impl.__code__

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is call_impl and frame.f_locals["self"] is module:
            through_torch.append(frame)

    runs_and_calls = lambda: module.tally.runs * 1000 + len(through_torch)  # noqa: E731
    sys.setprofile(profile)
    try:
        assert _over_sampled_calls(gf, runs_and_calls) == 5 * 1000, "5 runs, none through torch"
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize("where", ["a subclass's", "the instance's"])
def test_a_sampled_calls_eager_run_goes_through_a_replaced_call_impl(sampled_on_the_cpu, where):
    """A _call_impl of the module's own (a subclass's, or set on the instance) is what torch's
    call runs: the eager run goes through it at every sampled call."""
    through = []

    class Own(Tallied):
        def _call_impl(self, *args, **kwargs):
            through.append(self)
            return super()._call_impl(*args, **kwargs)

    module = Own() if where == "a subclass's" else Tallied()
    if where == "the instance's":
        torchs = module._call_impl

        def replaced(*args, **kwargs):
            through.append(module)
            return torchs(*args, **kwargs)

        module._call_impl = replaced
    gf = sampled_on_the_cpu(module)
    runs_and_calls = lambda: module.tally.runs * 1000 + len(through)  # noqa: E731
    assert _over_sampled_calls(gf, runs_and_calls) == 5 * 1000 + 5, "5 runs, each through it"


@pytest.mark.parametrize("where", ["the module's", "global"])
def test_a_sampled_calls_eager_run_runs_the_forward_hooks_as_eager_does(sampled_on_the_cpu, where):
    """With a forward hook on the module or a global one, the eager run goes through torch's
    own call, so the hook runs at every sampled call, as it does eagerly."""
    module = Tallied()
    hooked = []

    def hook(hooked_module, args, output):
        if hooked_module is module:
            hooked.append(output)

    if where == "global":
        handle = torch.nn.modules.module.register_module_forward_hook(hook)
    else:
        handle = module.register_forward_hook(hook)
    try:
        gf = sampled_on_the_cpu(module)
        runs_and_hooks = lambda: module.tally.runs * 1000 + len(hooked)  # noqa: E731
        assert _over_sampled_calls(gf, runs_and_hooks) == 5 * 1000 + 5, "5 runs, 5 hooks"
    finally:
        handle.remove()


def test_the_outputs_a_verdict_held_are_released_once_it_is_read(sampled_on_the_cpu):
    """A flat tuple's tensors, held by the queue until their verdict is read, are
    freed after it (nothing kept beyond the queue)."""
    gf = sampled_on_the_cpu(FlatOutputs())
    x = torch.ones(2, 4)
    held = []
    for _ in range(4):
        held.extend(weakref.ref(tensor) for tensor in gf(x))
    gf(x)  # reads the last verdict
    gc.collect()
    assert gf._call_state.verdicts_pending == 1
    assert sum(ref() is not None for ref in held) == 0, "outputs outlived their verdicts"


class DisablesItsRunner(torch.nn.Module):
    """A forward that disables its own runner when told to, as a forward run in verify's eager
    comparison may (or another thread meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.runner: GraphedForward | None = None

    def forward(self, x):
        if self.runner is not None:
            runner, self.runner = self.runner, None
            runner.disable("disabled from inside the forward")
        return self.linear(x)


def test_a_runner_disabled_during_a_sampled_calls_eager_run_answers_that_call(sampled_on_the_cpu):
    module = DisablesItsRunner()
    gf = sampled_on_the_cpu(module)
    x = torch.ones(2, 4)
    gf(x)
    gf(x)
    module.runner = gf  # the next sampled call's eager run disables the runner
    got = gf(x)
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), rtol=0, atol=0)
    assert not gf.stats()["enabled"]
    assert "disabled from inside the forward" in gf.stats()["disabled_reason"]
    assert gf._call_state.verdicts_pending == 0
    torch.testing.assert_close(gf(x), got, rtol=0, atol=0)  # eager from now on


class CallingThreads:
    """Threads each calling a runner `calls` times (checking each result with `check`), started
    and joined around the block; the exceptions they raised, in `errors`."""

    def __init__(self, gf: GraphedForward, x: torch.Tensor, threads: int, calls: int, check=None):
        self.errors: list[Exception] = []

        def run() -> None:
            try:
                for _ in range(calls):
                    result = gf(x)
                    if check is not None:
                        check(result)
            except Exception as error:  # reported by the test
                self.errors.append(error)

        self._workers = [threading.Thread(target=run) for _ in range(threads)]

    def __enter__(self) -> CallingThreads:
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc_info) -> None:
        for worker in self._workers:
            worker.join()


def test_a_runner_disabled_by_another_thread_while_it_samples_stays_whole(sampled_on_the_cpu):
    module = FlatOutputs()
    gf = sampled_on_the_cpu(module)
    x = torch.ones(2, 4)
    gf(x)
    with CallingThreads(gf, x, threads=1, calls=400) as threads:
        for _ in range(20):
            time.sleep(0.001)
        gf.disable("disabled by another thread")
    assert not threads.errors, threads.errors
    assert gf._call_state.verdicts_pending == 0
    with torch.no_grad():
        torch.testing.assert_close(gf(x)[1], module(x)[1], rtol=0, atol=0)


def test_threads_sharing_a_runner_read_each_python_layer_verdict_once(
    emulated_backend, monkeypatch
):
    """Nested outputs go through the Python layer's comparison, which lets other threads run
    while the queue holds a slot for it: three threads calling one runner, every call sampled,
    each verdict read once (a verdict read twice would pop another unread, and hand its slot out
    twice), and the runner stays enabled. A stress test: when the Python layer kept a queue of its
    own, without its lock it failed in some runs only (one in five, and two in three with fewer
    calls, on a 2-core host)."""
    monkeypatch.setattr(_verify, "DEFERRED_DEVICE_TYPES", ("cuda", "cpu"))
    gf = GraphedForward(Outputs(), device="cpu", backend=emulated_backend, verify_every=1)
    x = torch.ones(2, 4)
    gf(x)

    def scaled(output) -> None:
        assert output["scale"] == 2

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between nearly any two bytecodes
    try:
        with CallingThreads(gf, x, threads=3, calls=600, check=scaled) as threads:
            pass
    finally:
        sys.setswitchinterval(switch)
    assert not threads.errors, threads.errors
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]
    for _ in range(40):  # more calls than slots: none was lost or handed out twice
        gf(x)
        assert gf._call_state.verdicts_pending == 1
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]


def test_disabling_drops_the_pending_verdicts_and_their_outputs(sampled_on_the_cpu):
    gf = sampled_on_the_cpu(FlatOutputs())
    gf(torch.ones(2, 4))
    assert gf._call_state.verdicts_pending == 1
    gf.disable("done")
    assert gf._call_state.verdicts_pending == 0


def test_a_verified_runner_and_its_module_are_freed_with_their_last_reference(sampled_on_the_cpu):
    """What the queue holds (the forward, the Python layer's comparison, the pending outputs)
    makes no cycle back to its CallState: nothing waits for the garbage collector."""
    module = FlatOutputs()
    gf = sampled_on_the_cpu(module)
    gf(torch.ones(2, 4))
    assert gf._call_state.verdicts_pending == 1
    refs = weakref.ref(gf), weakref.ref(module)
    gc.disable()
    try:
        del gf, module
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


def test_verify_refuses_what_it_cannot_use():
    state = _fastcall.CallState(lambda template, outputs: None)
    host = torch.zeros(4, dtype=torch.uint8)
    arm = functools.partial(state.verify, 1, 0, 1)
    with pytest.raises(TypeError, match="CallState.verify"):
        arm(print, print, host, torch.zeros(3, dtype=torch.int32), True, True)  # 2 a slot
    with pytest.raises(TypeError, match="CallState.verify"):
        arm("not callable", print, host, torch.zeros(8, dtype=torch.int32), True, True)
    with pytest.raises(TypeError, match="CallState.verify"):
        arm(print, "not callable", host, torch.zeros(8, dtype=torch.int32), True, True)
    with pytest.raises(TypeError, match="CallState.verify"):
        state.verify(1)
    arm(print, print, host, torch.zeros(8, dtype=torch.int32), True, True)
    state.verify(None)
    assert state.verdicts_pending == 0


def test_the_unread_pairs_are_the_tensors_in_order_or_none_where_the_rest_differs():
    """What a deferred comparison queues: the tensor pairs whose values were not read, in order;
    a difference the host sees without reading values (a leaf, a tensor where eager has none, the
    structure, a shape) is said at once, with its path."""
    a, b = torch.ones(2), torch.zeros(2)
    pairs_of = functools.partial(_verification.Verification(0, None)._difference, values=False)
    assert pairs_of(a, b) == (None, [(a, b)])
    difference, pairs = pairs_of({"x": (a, 1), "y": b}, {"x": (b, 1), "y": a})
    assert difference is None
    assert [(id(got), id(want)) for got, want in pairs] == [(id(a), id(b)), (id(b), id(a))]
    assert pairs_of((a, 1), (a, 2)) == ("at output[1]: 1 against eager's 2", [])  # a leaf
    assert pairs_of((a, 1), (a, b)) == ("at output[1]: int against eager's Tensor", [])
    assert pairs_of((a,), [a])[0].startswith("in the output's structure")
    assert (
        pairs_of(a, torch.ones(3))[0]
        == "at output: torch.float32[2] against eager's torch.float32[3]"
    )
    assert pairs_of((1, "s"), (1, "s")) == (None, [])


_SIZES = [1, 15, 16, 17, 4096, 4096 * 16 + 3, 2**20 + 5]


@on_gpu
@pytest.mark.parametrize("pairs", [1, 64, 65, 130])
def test_the_kernel_finds_one_differing_byte_anywhere(pairs):
    gf = _captured(None, "cuda")
    got = [torch.randint(0, 255, (_SIZES[i % len(_SIZES)],), dtype=torch.uint8, device="cuda")
           for i in range(pairs)]  # fmt: skip
    want = [tensor.clone() for tensor in got]
    host, scratch = _slot("cuda")
    assert _fastcall.compare_later(gf.runner_id, got, want, host, scratch)
    torch.cuda.synchronize()
    assert host.item() == 0
    assert scratch.tolist() == [0, 0], "the comparison leaves its scratch zero"
    for which in sorted({0, pairs // 2, pairs - 1}):
        for at in (0, -1):
            want[which][at] ^= 1
            host.fill_(2)
            assert _fastcall.compare_later(gf.runner_id, got, want, host, scratch)
            torch.cuda.synchronize()
            assert host.item() == 1, (which, at)
            assert scratch.tolist() == [0, 0]
            want[which][at] ^= 1
    # More comparisons in flight than a device has jobs for ready graphs (64): the rest are
    # launched as kernels, with the same verdicts.
    slots = [_slot("cuda") for _ in range(70)]
    want[0][-1] ^= 1
    torch.cuda._sleep(100_000_000)  # every comparison queues behind this
    for index, (byte, words) in enumerate(slots):
        equal = index % 2 == 0
        assert _fastcall.compare_later(gf.runner_id, got, want if not equal else got, byte, words)
    torch.cuda.synchronize()
    assert [byte.item() for byte, _ in slots] == [index % 2 for index in range(70)]
    want[0][-1] ^= 1
    # A view at an odd offset (no 16-byte vectors) that differs in its last byte.
    base = torch.zeros(1001, dtype=torch.uint8, device="cuda")
    other = base.clone()
    other[-1] = 7
    host.fill_(2)
    assert _fastcall.compare_later(gf.runner_id, [base[1:]], [other[1:]], host, scratch)
    torch.cuda.synchronize()
    assert host.item() == 1


@on_gpu
def test_a_verdict_byte_handed_again_before_its_comparison_ran_keeps_both_verdicts():
    """The same verdict byte handed twice while the stream is busy: the second comparison is not
    written into the job the first's queued launch is still to read (it takes another), so the
    first still compares its own pairs. Each verdict is read in stream order."""
    gf = _captured(None, "cuda")
    same = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    other = same.clone()
    other[-1] = 1
    host, scratch = _slot("cuda")
    assert _fastcall.compare_later(gf.runner_id, [same], [same.clone()], host, scratch)
    torch.cuda.synchronize()  # a job's ready graph is made, the job free again
    seen = torch.full((2,), 9, dtype=torch.uint8, device="cuda")
    torch.cuda._sleep(200_000_000)  # both comparisons queue behind this
    assert _fastcall.compare_later(gf.runner_id, [same], [same.clone()], host, scratch)
    seen[0:1].copy_(host, non_blocking=True)
    assert _fastcall.compare_later(gf.runner_id, [same], [other], host, scratch)
    seen[1:2].copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    assert seen.tolist() == [0, 1]
    assert scratch.tolist() == [0, 0]
    # The jobs free again once the device ran them.
    host.fill_(2)
    assert _fastcall.compare_later(gf.runner_id, [same], [other], host, scratch)
    torch.cuda.synchronize()
    assert host.item() == 1


@on_gpu
def test_two_runners_on_two_threads_share_the_devices_jobs_with_every_verdict_right():
    """Two runners queue 40 comparisons each from their own threads behind a busy stream: more
    than a device's 64 jobs in flight, taken by both, the rest launched as kernels."""
    runners = [_captured(None, "cuda") for _ in range(2)]
    same = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    other = same.clone()
    other[-1] = 1
    slots = {which: [_slot("cuda") for _ in range(40)] for which in range(2)}
    queued: dict[int, list] = {}

    def compare(which: int) -> None:
        queued[which] = [
            _fastcall.compare_later(
                runners[which].runner_id,
                [same],
                [other if (index + which) % 3 == 0 else same.clone()],
                byte,
                words,
            )
            for index, (byte, words) in enumerate(slots[which])
        ]

    torch.cuda._sleep(100_000_000)
    threads = [threading.Thread(target=compare, args=(which,)) for which in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    torch.cuda.synchronize()
    for which in range(2):
        assert queued[which] == [True] * 40
        verdicts = [byte.item() for byte, _ in slots[which]]
        assert verdicts == [int((index + which) % 3 == 0) for index in range(40)], which
        assert all(words.tolist() == [0, 0] for _, words in slots[which])


@on_gpu
def test_sampling_faster_than_the_device_answers_waits_and_stays_faithful():
    """verify_every=1 on a forward the device takes longer for than the host: the
    queue fills (32 verdicts), waits for the device, and every call still returns eager's
    values."""
    module = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
    gf = GraphedForward(module, device="cuda", verify_every=1)
    x = torch.randn(512, 1024, device="cuda")
    most = 0
    for step in range(120):
        got = gf(x + step)
        most = max(most, gf._call_state.verdicts_pending)
    torch.cuda.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(got, module(x + 119), rtol=0, atol=0)
    gf(x)
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]
    assert 1 <= most <= 32, most


@on_gpu
def test_a_sampled_call_on_the_device_queues_one_comparison_for_all_outputs():
    """Outputs of a dict of a tuple: the sampled call compares on the device without a
    synchronization; a stale one is told at a later call with its path."""
    module = Outputs().cuda()
    module.holder.offset = module.holder.offset.cuda()
    gf = GraphedForward(module, device="cuda", verify_every=2)
    x = torch.ones(2, 4, device="cuda")
    gf(x)
    module.holder.previous = module.holder.offset
    module.holder.offset = torch.ones(4, device="cuda")
    gf(x)  # call 1: not sampled
    torch.cuda.set_sync_debug_mode("error")
    try:
        gf(x)  # call 2: sampled, compared on the device
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert gf.stats()["enabled"]
    torch.cuda.synchronize()
    gf(x)
    reason = gf.stats()["disabled_reason"]
    assert "call 2 of a graph (one in 2 sampled) differed from eager at output['pair'][1]" in (
        reason
    ), reason
