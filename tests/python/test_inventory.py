"""A capture's inventory (graphed._inventory): every tensor a graph reads is accounted for.

- Externals (a tensor read from a module global or a plain object's attribute): re-bound and the
  old tensor freed, the graph is dropped before its next replay and the key captured again, so
  the call gives eager's result (on the CPU with the emulated backend, whose replay returns what
  the capture wrote, a missed re-bind returns the old result; on the GPU, the freed memory is
  reused first). Eight such drops in a row disable the runner. The runner warns once, naming
  them; inventory() lists them; what the module holds, its containers and keep_alive are not
  externals.
- Host constants (a CPU tensor copied to the device inside the forward: `.to`, `torch.tensor`
  and `torch.as_tensor` with a device, `copy_`, a list or CPU-tensor index, an assignment): staged
  through pinned memory, captured whole, bitwise equal to eager with new inputs on the GPU; one
  that changes between runs of a key fails the capture with where it was made.
- A TorchDispatchMode the caller holds around a graphed call sees the forward's own operators
  in the runs before the capture, and the call's result stays eager's.
"""

from __future__ import annotations

import gc
import logging

import graphed
import pytest
import torch
from _gpu import on_gpu
from graphed import GraphedForward, _phases
from torch.utils._python_dispatch import TorchDispatchMode

TABLE = torch.ones(4)


class ReadsAGlobal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) + TABLE


class ReadsAPlainObject(torch.nn.Module):
    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 4)
        self.holder = type("Holder", (), {})()
        self.holder.table = torch.ones(4, device=device)

    def forward(self, x):
        return self.linear(x) + self.holder.table


def _eager(module, **kwargs):
    with torch.no_grad():
        return module(**kwargs)


def _rebind_global(value: torch.Tensor) -> None:
    global TABLE
    TABLE = value


def test_a_rebound_global_is_captured_again(emulated_backend, caplog):
    _rebind_global(torch.ones(4))
    module = ReadsAGlobal()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, name="reads-global")
    x = torch.randn(2, 4)
    with caplog.at_level(logging.INFO, logger="graphed"):
        for _ in range(3):
            torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
        _rebind_global(torch.full((4,), 1e6))  # the old table is freed
        gc.collect()
        torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
        torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    stats = gf.stats()
    assert (stats["captures"], stats["stale_drops"], stats["externals"]) == (2, 1, 1), stats
    assert stats["enabled"]
    warnings = [r.message for r in caplog.records if "neither kwargs nor module" in r.message]
    assert len(warnings) == 1 and "global TABLE (float32[4])" in warnings[0], warnings
    assert "test_inventory.py" in warnings[0]
    dropped = [r.message for r in caplog.records if "was freed since" in r.message]
    assert len(dropped) == 1 and "global TABLE" in dropped[0], dropped
    (record,) = graphed.inventory(gf)
    assert record["shapes"] == "float32[2, 4]" and record["staged"] == []
    assert record["externals"][0].startswith("global TABLE (float32[4]) read at ")
    (entry,) = gf.entries()
    assert (entry["externals"], entry["staged"]) == (1, 0)


def test_a_rebound_attribute_of_a_plain_object_is_captured_again(emulated_backend):
    module = ReadsAPlainObject()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4)
    for _ in range(3):
        gf(x=x)
    module.holder.table = torch.full((4,), 1e6)
    torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    assert (gf.stats()["captures"], gf.stats()["stale_drops"]) == (2, 1)


def test_externals_freed_before_every_replay_disable_the_runner(emulated_backend):
    module = ReadsAPlainObject()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4)
    for step in range(12):
        module.holder.table = torch.full((4,), float(step))
        torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    stats = gf.stats()
    assert not stats["enabled"] and stats["disabled_cause"] == "recapture_limit", stats
    assert stats["stale_drops"] == 8
    assert "register them as buffers" in stats["disabled_reason"]


# A cache the forward fills on its first run and reads from then on (as functools.lru_cache or a
# module-level dict of tables does): made by the run that records the capture's reads, it is
# read by the capture from outside.
_CACHE: dict = {}
_CACHE_FILL = [1.0]


class KeepsACache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 4)
        self.modes_at_capture: list[list[str]] = []

    def forward(self, x):
        if int(torch.ops.graphed.forward_phase()) == _phases.PHASE_CAPTURE:
            stack = torch.overrides._get_current_function_mode_stack()
            self.modes_at_capture.append([type(mode).__name__ for mode in stack])
        table = _CACHE.get(x.shape[-1])
        if table is None:
            table = _CACHE[x.shape[-1]] = torch.full((x.shape[-1],), _CACHE_FILL[0])
        return self.linear(x) + table


class ReadsAGlobalAtCapture(ReadsAGlobal):
    def __init__(self) -> None:
        super().__init__()
        self.modes_at_capture: list[list[str]] = []

    def forward(self, x):
        if int(torch.ops.graphed.forward_phase()) == _phases.PHASE_CAPTURE:
            stack = torch.overrides._get_current_function_mode_stack()
            self.modes_at_capture.append([type(mode).__name__ for mode in stack])
        return super().forward(x)


def test_the_capture_takes_the_reads_its_probe_recorded(emulated_backend):
    """Note [One recorded run per capture]: the probe recorded what the forward reads and
    nothing it made outlived it, so the capture runs without the mode; the global it read is
    still an external, and a re-bind is still captured again."""
    _rebind_global(torch.ones(4))
    module = ReadsAGlobalAtCapture()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, churn_limit=0)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    gf(x=torch.randn(3, 4))  # a later key: its warm-up records, its capture takes the record
    assert module.modes_at_capture == [[], []]
    assert gf.stats()["externals"] == 2  # the global, once per graph
    _rebind_global(torch.full((4,), 1e6))
    gc.collect()
    torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    assert gf.stats()["stale_drops"] == 1


def test_a_cache_made_before_the_capture_is_an_external_of_it(emulated_backend):
    """What the probe made and kept (a cache) outlived it: the capture records its own reads,
    under the mode, and finds the cached table as an external; freed and made again with other
    values, the graph is captured again and the call gives eager's result."""
    _CACHE.clear()
    _CACHE_FILL[0] = 1.0
    module = KeepsACache()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    assert module.modes_at_capture == [["InventoryMode"]]
    assert gf.stats()["externals"] == 1
    (record,) = graphed.inventory(gf)
    assert record["externals"][0].startswith("a float32[4] tensor read at ")
    _CACHE.clear()
    _CACHE_FILL[0] = 5.0
    gc.collect()
    torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    assert gf.stats()["stale_drops"] == 1
    _CACHE.clear()


class HoldsItsState(torch.nn.Module):
    """Reads only what graphed watches: parameters, a buffer, a tensor attribute and tensors in a
    list attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.ones(4))
        self.scale = torch.full((4,), 2.0)
        self.tables = [torch.ones(4), torch.zeros(4)]

    def forward(self, x, extra):
        return (self.linear(x) + self.offset) * self.scale + self.tables[0] + self.tables[1] + extra


def test_what_graphed_watches_is_not_external(emulated_backend, caplog):
    gf = GraphedForward(HoldsItsState(), device="cpu", backend=emulated_backend)
    held = torch.ones(4)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        for _ in range(3):
            gf(x=torch.randn(2, 4), extra=torch.ones(4), keep_alive=(held,))
    assert gf.stats()["externals"] == 0 and gf.stats()["captures"] == 1
    assert graphed.inventory(gf) == [
        {"shapes": "float32[2, 4], float32[4]", "externals": [], "staged": []}
    ]
    assert not [r for r in caplog.records if "neither kwargs" in r.message]


def test_inventory_refuses_what_is_no_graphed_forward():
    with pytest.raises(TypeError, match="takes a GraphedForward, got Linear"):
        graphed.inventory(torch.nn.Linear(2, 2))


# -- on the device --------------------------------------------------------------------------------


@on_gpu
def test_a_rebound_global_on_the_device_reads_the_new_tensor():
    _rebind_global(torch.ones(4, device="cuda"))
    module = ReadsAGlobal().cuda()
    gf = GraphedForward(module, device="cuda")
    x = torch.randn(2, 4, device="cuda")
    for _ in range(3):
        gf(x=x)
    _rebind_global(torch.full((4,), 3.0, device="cuda"))
    gc.collect()
    reuse = [torch.full((4,), 1e6, device="cuda") for _ in range(64)]  # the freed block taken
    torch.testing.assert_close(gf(x=x), _eager(module, x=x), rtol=0, atol=0)
    assert gf.stats()["stale_drops"] == 1 and gf.stats()["captures"] == 2
    del reuse


class HostConstants(torch.nn.Module):
    """Each way model code copies a host constant to the device in its forward (the patterns of
    diffusers' Chroma, HiDream, CogView4 and Qwen-Image, and transformers' Falcon)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.rotary = torch.arange(8, dtype=torch.float32)  # a CPU table, moved per call

    def forward(self, x):
        device = x.device
        ids = torch.tensor([0] * x.shape[0]).to(device)  # Chroma
        size = torch.tensor([x.shape[0], x.shape[1]], device=device)  # HiDream
        table = self.rotary.to(device)  # CogView4
        count = torch.as_tensor(x.shape[1], device=device)  # Qwen-Image
        buffer = torch.empty(8, device=device)
        buffer.copy_(torch.linspace(0, 1, 8))
        picked = self.linear(x)[:, [0, 2, 5]]  # Falcon
        by_host_index = x[:, torch.tensor([1, 3])]
        out = self.linear(x) * table + buffer + size.sum() + count + ids.sum()
        out[:, [7]] = 1.0
        return out, picked, by_host_index


@on_gpu
def test_host_constants_are_staged_and_captured_whole():
    module = HostConstants().cuda()
    gf = GraphedForward(module, device="cuda")
    for seed in range(4):
        torch.manual_seed(seed)
        x = torch.randn(3, 8, device="cuda")
        got, want = gf(x=x), _eager(module, x=x)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1 and stats["replays"] >= 2
    assert stats["staged_constants"] == 9, stats
    (record,) = graphed.inventory(gf)
    assert len(record["staged"]) == 9 and record["externals"] == []


class RandomOnTheHost(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn(x.shape[1]).to(x.device)


@on_gpu
def test_a_host_constant_that_changes_between_runs_is_refused():
    module = RandomOnTheHost()
    gf = GraphedForward(module, device="cuda")
    x = torch.randn(2, 4, device="cuda")
    gf(x=x)
    stats = gf.stats()
    assert not stats["enabled"] and stats["disabled_cause"] == "capture_failed", stats
    assert "differs between runs of one key" in stats["disabled_reason"]
    assert "test_inventory.py" in stats["disabled_reason"]


class _OperatorNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@on_gpu
def test_a_dispatch_mode_around_a_graphed_call_sees_the_forwards_operators():
    module = ReadsAPlainObject(device="cuda").cuda()
    gf = GraphedForward(module, device="cuda")
    x = torch.randn(2, 4, device="cuda")
    with _OperatorNames() as seen:
        first = gf(x=x)
    torch.testing.assert_close(first, _eager(module, x=x), rtol=0, atol=0)
    assert any("addmm" in name or "linear" in name for name in seen.names), seen.names[:20]
    assert not any("graphed" in name for name in seen.names)
    x2 = torch.randn(2, 4, device="cuda")
    torch.testing.assert_close(gf(x=x2), _eager(module, x=x2), rtol=0, atol=0)
    assert gf.stats()["enabled"] and gf.stats()["captures"] == 1


class ReadsOnTheHost(torch.nn.Module):
    def forward(self, x):
        return x * float(x.sum().item())


@on_gpu
def test_the_sync_probe_names_the_forwards_line_and_what_synchronized():
    gf = GraphedForward(ReadsOnTheHost(), device="cuda", regions=False)
    x = torch.randn(2, 4, device="cuda")
    torch.testing.assert_close(gf(x=x), _eager(ReadsOnTheHost(), x=x), rtol=0, atol=0)
    reason = gf.stats()["disabled_reason"]
    assert "test_inventory.py:" in reason and "_inventory.py:" not in reason.replace(
        "test_inventory.py:", ""
    ), reason
    assert "(item: a read of device values on the host" in reason, reason
