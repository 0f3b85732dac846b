"""Traffic that varies and memory that runs short, on the CPU with the emulated backend.

The churn guard (ops/gf_churn.h): a Python float that changes every call is run eager after one
capture, a new length every call after two (with eager's values); a server's fixed shapes are all
captured as each comes again; a denoising loop's one key and a decode loop's two capture as
before; reset() and churn_limit=0 give today's capture-every-key behaviour. Where graphs are
unavailable, the same traffic is warned of once, with what changes, and a fixed set of shapes is
not.

Out of device memory while warming up or capturing (ops/gf_backoff.h): the call gets eager's
result, the runner stays enabled with its graphs, one warning gives torch's figures, and the key
is held back until the back-off ends or memory is freed."""

from __future__ import annotations

import contextlib
import gc
import logging
import types
import weakref

import pytest
import torch
from graphed import GraphedForward, _phases


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        return self.linear(x) * scale


def _runner(backend: str, **options) -> tuple[GraphedForward, Scaled]:
    module = Scaled()
    return GraphedForward(module, device="cpu", backend=backend, **options), module


def _eager(module: Scaled, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return module(**kwargs)


def test_a_float_that_changes_every_call_runs_eager_after_one_capture(emulated_backend):
    gf, module = _runner(emulated_backend)
    x = torch.randn(4, 8)
    for call in range(40):
        scale = 0.5 + call / 10
        torch.testing.assert_close(
            gf(x, scale=scale), _eager(module, x=x, scale=scale), rtol=0, atol=0
        )
    stats = gf.stats()
    assert (stats["captures"], stats["churn_eager_calls"], stats["eager_calls"]) == (1, 39, 39)
    assert stats["churn_guarding"] == 1 and stats["enabled"]


def test_a_new_length_every_call_runs_eager_and_the_pool_stays_small(emulated_backend):
    gf, module = _runner(emulated_backend, max_entries=16)
    for rows in range(1, 61):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(gf(x), _eager(module, x=x), rtol=0, atol=0)
    stats = gf.stats()
    assert (stats["captures"], stats["graphs"], stats["evictions"]) == (2, 2, 0), stats


def test_a_servers_shapes_are_each_captured_when_they_come_again(emulated_backend):
    gf, module = _runner(emulated_backend, max_entries=16)
    shapes = [torch.randn(rows, 8) for rows in (1, 2, 4, 8, 16, 32)]
    for _ in range(3):
        for x in shapes:
            gf(x)
    stats = gf.stats()
    assert (stats["captures"], stats["churn_eager_calls"]) == (6, 4), stats
    for x in shapes:  # every shape replays now, and the guard has let go after enough hits
        gf(x)
    assert gf.stats()["captures"] == 6


def test_one_key_per_loop_step_and_a_decode_loop_capture_as_before(emulated_backend):
    steps, _ = _runner(emulated_backend)
    latents = torch.randn(2, 8)
    for _ in range(9):
        steps(latents, scale=torch.tensor(0.7))  # a tensor scale: one key for every step
    assert (steps.stats()["captures"], steps.stats()["churn_eager_calls"]) == (1, 0)
    decode, _ = _runner(emulated_backend)
    decode(torch.randn(32, 8))  # the prompt
    for _ in range(16):
        decode(torch.randn(1, 8))  # each new token
    assert (decode.stats()["captures"], decode.stats()["churn_eager_calls"]) == (2, 0)


def test_a_held_back_call_runs_inside_capture_context_as_a_captured_one(emulated_backend):
    """capture_context (an autocast, a kernel choice) is entered around every run of the module
    while the runner is enabled: a call the guard holds back runs eagerly in GraphedForward
    itself, inside it too, so that it computes as the graphs do."""
    entered = []

    @contextlib.contextmanager
    def context():
        entered.append(torch.ops.graphed.forward_phase())
        yield

    gf, module = _runner(emulated_backend, capture_context=context)
    x = torch.randn(2, 8)
    for call in range(6):
        torch.testing.assert_close(
            gf(x, scale=float(call)), _eager(module, x=x, scale=float(call)), rtol=0, atol=0
        )
    stats = gf.stats()
    assert (stats["captures"], stats["churn_eager_calls"]) == (1, 5), stats
    # the capture's probe, warm-up and capture, then one entry for each call held back
    assert len(entered) == 3 + 5, entered


def test_reset_or_a_limit_of_zero_captures_new_keys_at_once(emulated_backend):
    gf, _ = _runner(emulated_backend)
    x = torch.randn(2, 8)
    for call in range(5):
        gf(x, scale=float(call))
    assert gf.stats()["churn_guarding"] == 1
    gf.reset()
    gf(x, scale=10.0)
    assert gf.stats()["churn_guarding"] == 0 and gf.stats()["captures"] == 2
    every, _ = _runner(emulated_backend, churn_limit=0)
    for call in range(5):
        every(x, scale=float(call))
    assert (every.stats()["captures"], every.stats()["churn_eager_calls"]) == (5, 0)


# -- out of device memory while warming up or capturing -------------------------------------------


class RunsOutWhileCapturing(torch.nn.Module):
    """Raises torch's out-of-memory error in the runs graphed makes before a capture (the probe,
    the warm-ups, the capture) while `state.short` is set, as a device whose memory fits the
    forward but not a capture beside it does; its eager runs succeed. The switch and the count
    live in an object the watch of module state does not look into (a change of a module
    attribute would drop the graphs)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = types.SimpleNamespace(short=True, runs=0)

    def forward(self, x):
        self.state.runs += 1
        if self.state.short and torch.ops.graphed.forward_phase() != _phases.PHASE_EAGER:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "8.00 GiB of which 1.50 GiB is free."
            )
        return x * 2


def test_running_out_of_memory_while_capturing_gives_eagers_result_and_holds_the_key_back(
    emulated_backend, caplog
):
    module = RunsOutWhileCapturing()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, name="short")
    fits = torch.ones(2)
    module.state.short = False
    gf(fits)  # a graph captured before memory ran short keeps replaying
    module.state.short = True
    x = torch.arange(3.0)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        torch.testing.assert_close(gf(x), x * 2, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"] and (stats["captures"], stats["eager_calls"]) == (1, 1), stats
    (warning,) = [
        r.getMessage() for r in caplog.records if "out of device memory" in r.getMessage()
    ]
    assert "the call ran eager" in warning and "runs eager for its next 64 calls" in warning
    assert "Tried to allocate 2.00 GiB" in warning and "1.50 GiB is free" in warning, warning
    runs = module.state.runs
    for _ in range(5):  # held back: one eager run a call, no capture attempt
        torch.testing.assert_close(gf(x), x * 2, rtol=0, atol=0)
    assert module.state.runs == runs + 5
    gf(fits)
    assert gf.stats()["captures"] == 1 and gf.stats()["replays"] >= 2
    module.state.short = False
    gf.reset()  # memory freed: the key may capture again
    gf(x)
    assert gf.stats()["captures"] == 2, gf.stats()


def test_eager_running_out_too_raises_eagers_error(emulated_backend):
    module = RunsOutWhileCapturing()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)

    def always_short(x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.")

    module.forward = always_short
    try:
        gf(torch.ones(2))
    except torch.OutOfMemoryError as raised:
        assert "Tried to allocate 4.00 GiB" in str(raised)
    else:
        raise AssertionError("eager's out-of-memory error was not raised")
    assert gf.stats()["enabled"]


class AllocatesTooMuchWhileCapturing(torch.nn.Module):
    """On a CUDA device: asks the caching allocator for more than the device has while graphed
    captures (torch's own OutOfMemoryError, raised inside a stream capture), while its other runs
    compute as usual."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        if torch.ops.graphed.forward_phase() == _phases.PHASE_CAPTURE:
            total = torch.cuda.get_device_properties(x.device).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=x.device)
        return torch.relu(self.linear(x))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_running_out_of_memory_while_capturing_on_the_device_gives_eagers_result():
    module = AllocatesTooMuchWhileCapturing().cuda()
    gf = GraphedForward(module, device="cuda", name="short-on-device")
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        want = module(x)
    reserved = []
    for _ in range(4):
        gf.reset()  # memory freed: each call tries to capture again
        torch.testing.assert_close(gf(x), want, rtol=0, atol=0)
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    stats = gf.stats()
    assert stats["enabled"] and stats["captures"] == 0 and stats["eager_calls"] == 4, stats
    assert reserved[-1] == reserved[1], reserved  # each failed attempt gave back what it took
    torch.testing.assert_close(gf(x), want, rtol=0, atol=0)  # held back: eager, no attempt
    assert gf.stats()["eager_calls"] == 5


class Pair:
    """A container registered with pytree without a keys function (no paths to name)."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second


torch.utils._pytree.register_pytree_node(
    Pair, lambda pair: ([pair.first, pair.second], None), lambda leaves, _: Pair(*leaves)
)


def test_the_guards_record_takes_any_kwarg_the_runner_takes(emulated_backend):
    gf = GraphedForward(lambda *, pair, scale: pair.first * scale + pair.second,
                        device="cpu", backend=emulated_backend)  # fmt: skip
    for call in range(6):
        pair = Pair(torch.ones(2), torch.full((2,), float(call)))
        torch.testing.assert_close(gf(pair=pair, scale=float(call)), torch.full((2,), 2.0 * call))
    stats = gf.stats()
    assert stats["enabled"] and (stats["captures"], stats["churn_eager_calls"]) == (1, 5), stats


def test_the_failed_attempts_tensors_are_freed_before_the_eager_run(emulated_backend):
    """What the forward held when it ran out (its activations) is gone before the eager run that
    answers the call, which needs the memory."""
    alive = []

    class HoldsAnActivation(torch.nn.Module):
        def forward(self, x):
            activation = x * 3
            if torch.ops.graphed.forward_phase() != _phases.PHASE_EAGER:
                alive.append(weakref.ref(activation))
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")
            gc.collect()
            assert all(ref() is None for ref in alive), "the failed attempt's tensors are alive"
            return activation

    gf = GraphedForward(HoldsAnActivation(), device="cpu", backend=emulated_backend)
    torch.testing.assert_close(gf(torch.ones(2)), torch.full((2,), 3.0), rtol=0, atol=0)
    assert alive and gf.stats()["eager_calls"] == 1


def test_where_graphs_are_unavailable_new_keys_every_call_are_warned_of_once(caplog):
    gf, module = _runner("none")
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        for step in range(8):
            torch.testing.assert_close(
                gf(x=x, scale=1.0 + step), _eager(module, x=x, scale=1.0 + step), rtol=0, atol=0
            )
    said = [r.message for r in caplog.records if "new keys in a row" in r.message]
    assert len(said) == 1, said
    assert "Graphs are unavailable here" in said[0]
    assert "kwargs['scale']: a float, 4 values" in said[0], said[0]
    assert gf.stats()["eager_calls"] == 8


def test_where_graphs_are_unavailable_a_fixed_set_of_shapes_is_not_warned_of(caplog):
    gf, _ = _runner("none")
    shapes = [torch.randn(rows, 8) for rows in (1, 2, 3)]
    with caplog.at_level(logging.WARNING, logger="graphed"):
        for _ in range(4):
            for x in shapes:
                gf(x=x)
    assert not [r for r in caplog.records if "new keys in a row" in r.message]
