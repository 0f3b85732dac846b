"""Weights and state that change between calls: a replay never computes with what eager would not.

Each row of the changed-state table, on the CPU with the emulated backend (whose replay returns
what the capture-time forward wrote, so a graph that missed a change returns the old result, as a
stale device graph would), and bitwise on the GPU:
- an in-place update at the same address (load_state_dict, copy_) keeps replaying: no recapture;
- a parameter re-assigned, swapped through .data or torch.utils.swap_tensors, moved or re-typed,
  a submodule replaced, a hook added: the graphs are dropped and the next call captures what the
  module is now;
- accelerate's offload hooks: the runner runs eager, with the reason, whether the hook was there at
  construction or added later;
- warm-up side effects: keep_alive tensors and tensor attributes are put back after the warm-ups;
  a Python attribute the forward rebinds is named in one warning;
- a non-tensor output that differs between runs of one key is refused (eager, named);
- verify mode catches a graph whose input it cannot see, and returns eager's result.
"""

from __future__ import annotations

import collections
import enum
import logging

import pytest
import torch
from _gpu import on_gpu
from graphed import GraphedForward, _verify


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _x(device: str = "cpu") -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(4, 8, device=device)


def _graphed(module: torch.nn.Module, backend: str | None, device: str = "cpu") -> GraphedForward:
    return GraphedForward(module, device=device, backend=backend)


def _eager(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x)


def _new_weight(like: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(7)
    return torch.randn_like(like)


def _reassign(m: TwoLayers) -> None:
    m.a.weight = torch.nn.Parameter(_new_weight(m.a.weight))


def _swap_data(m: TwoLayers) -> None:
    m.b.weight.data = _new_weight(m.b.weight)


# What _swap_tensors swapped out, kept alive: a freed TensorImpl could fire the check by chance.
_SWAPPED_OUT: list[torch.Tensor] = []


def _swap_tensors(m: TwoLayers) -> None:
    # nn.Module._apply's way for some conversions: the parameter keeps its Python object and every
    # dict stays as it was, but it holds another TensorImpl.
    other = torch.nn.Parameter(_new_weight(m.a.weight))
    torch.utils.swap_tensors(m.a.weight, other)
    _SWAPPED_OUT.append(other)


def _replace_submodule(m: TwoLayers) -> None:
    torch.manual_seed(3)
    m.a = torch.nn.Linear(8, 8).to(m.b.weight.device)


def _add_hook(m: TwoLayers) -> None:
    m.a.register_forward_hook(lambda module, args, out: out * 2)


def _resize_storage(m: TwoLayers) -> None:
    # FSDP-style: the storage is freed and allocated again, same tensor object
    weight = m.b.weight
    values = weight.detach().clone()
    old_address = weight.data_ptr()
    # What the freed block could be handed to, held until the storage's new block is elsewhere:
    # an allocator may hand the same block back (then a graph would read the new values there
    # anyway, and the emulated backend's replay could not tell).
    occupying = []
    for _ in range(16):
        weight.untyped_storage().resize_(0)
        occupying.append(torch.empty_like(values))
        weight.untyped_storage().resize_(values.numel() * values.element_size())
        if weight.data_ptr() != old_address:
            break
    assert weight.data_ptr() != old_address, "the allocator kept handing the same block back"
    del occupying
    with torch.no_grad():
        weight.copy_(values * 3)


CHANGES = {
    "parameter re-assigned": _reassign,
    "parameter .data swapped": _swap_data,
    "parameter swapped by torch.utils.swap_tensors": _swap_tensors,
    "submodule replaced": _replace_submodule,
    "forward hook added": _add_hook,
    "storage freed and re-allocated": _resize_storage,
}


def _run_change(change, backend: str | None, device: str) -> None:
    module = TwoLayers().to(device)
    gf = _graphed(module, backend, device)
    x = _x(device)
    for _ in range(3):
        gf(x)
    change(module)
    want = _eager(module, x)
    for _ in range(2):
        torch.testing.assert_close(gf(x), want, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 2, stats  # the change dropped the graph; one capture after it


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_capture_is_captured_again(emulated_backend, change):
    _run_change(CHANGES[change], emulated_backend, "cpu")


@on_gpu
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_capture_is_captured_again_on_the_device(change):
    _run_change(CHANGES[change], None, "cuda")


def _load_new_state(module: TwoLayers) -> None:
    state = {name: _new_weight(value) for name, value in module.state_dict().items()}
    module.load_state_dict(state)


def test_an_in_place_update_keeps_the_graph(emulated_backend):
    module = TwoLayers()
    gf = _graphed(module, emulated_backend)
    x = _x()
    gf(x)
    _load_new_state(module)
    with torch.no_grad():
        module.a.bias.add_(1.0)
    gf(x)
    stats = gf.stats()
    assert (stats["captures"], stats["replays"]) == (1, 2), stats  # same addresses: no recapture


@on_gpu
def test_an_in_place_update_replays_eagers_result_on_the_device():
    module = TwoLayers().cuda()
    gf = _graphed(module, None, "cuda")
    x = _x("cuda")
    gf(x)
    _load_new_state(module)
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    assert gf.stats()["captures"] == 1


def test_a_move_or_retype_of_the_module_itself_is_seen(emulated_backend):
    module = TwoLayers()
    gf = _graphed(module, emulated_backend)
    x = _x()
    gf(x)
    module.double()  # on the module, not through the GraphedForward's own .double()
    torch.testing.assert_close(gf(x.double()), _eager(module, x.double()), rtol=0, atol=0)
    assert gf.stats()["captures"] == 2


def test_the_change_is_logged_by_its_path(emulated_backend, caplog):
    module = TwoLayers()
    gf = _graphed(module, emulated_backend)
    gf(_x())
    _reassign(module)
    with caplog.at_level(logging.INFO, logger="graphed"):
        gf(_x())
    assert any(
        "a.weight changed since the graphs were captured" in r.message for r in caplog.records
    )


# -- offload hooks ----------------------------------------------------------------------------


def _accelerate_hooks():
    return pytest.importorskip("accelerate.hooks", reason="accelerate is not installed")


def test_a_module_under_cpu_offload_runs_eager_with_the_reason(emulated_backend, caplog):
    hooks = _accelerate_hooks()
    module = TwoLayers()
    hooks.add_hook_to_module(module, hooks.CpuOffload(execution_device="cpu"))
    with caplog.at_level(logging.WARNING, logger="graphed"):
        gf = _graphed(module, emulated_backend)
    x = _x()
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    stats = gf.stats()
    assert (
        not stats["enabled"] and "CpuOffload hook on the module itself" in stats["disabled_reason"]
    )
    assert "enable_model_cpu_offload" in stats["disabled_reason"]
    assert stats["captures"] == 0 and stats["eager_calls"] == 1
    assert any("CpuOffload" in r.message for r in caplog.records)


def test_sequential_offload_added_after_capture_turns_the_runner_eager(emulated_backend):
    _accelerate_hooks()
    import accelerate

    module = TwoLayers()
    gf = _graphed(module, emulated_backend)
    x = _x()
    gf(x)
    accelerate.cpu_offload(module, execution_device=torch.device("cpu"))
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    stats = gf.stats()
    assert not stats["enabled"]
    assert "AlignDevicesHook hook on 'a'" in stats["disabled_reason"], stats["disabled_reason"]


# -- warm-up side effects ---------------------------------------------------------------------


class Accumulates(torch.nn.Module):
    """A forward that advances a tensor attribute (not a registered buffer) the graph reads."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = torch.zeros(1)

    def forward(self, x):
        self.steps.add_(1)
        return x + self.steps


def test_keep_alive_tensors_advance_once_per_call(emulated_backend):
    held = torch.zeros(1)

    def forward(x):
        return x + held.add_(1)

    gf = GraphedForward(forward, device="cpu", backend=emulated_backend, warmup_iters=2)
    x = torch.ones(1)
    first = gf(x, keep_alive=[held])
    assert held.item() == 1.0  # the warm-ups were put back: one step, as eagerly
    torch.testing.assert_close(first, torch.full((1,), 2.0), rtol=0, atol=0)
    assert gf.stats()["captures"] == 1


class RefusesFive(Accumulates):
    def forward(self, x):
        if x.shape[0] == 5:
            raise ValueError("no fives")
        return super().forward(x)


def test_a_warm_up_that_raised_leaves_no_copy_for_the_next_capture(emulated_backend):
    # The copies a capture's warm-ups put back are taken anew for each capture: a key whose probe
    # raised must not leave its copy of the state to the next key's warm-ups.
    module = RefusesFive()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, churn_limit=0)
    gf(torch.ones(1))
    with pytest.raises(ValueError, match="no fives"):
        gf(torch.ones(5))
    module.steps.fill_(100.0)
    gf(torch.ones(2))
    assert module.steps.item() == 101.0  # one step from the user's 100, as eagerly


def test_a_tensor_attribute_is_put_back(emulated_backend):
    module = Accumulates()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, warmup_iters=2)
    x = torch.ones(1)
    torch.testing.assert_close(gf(x), torch.full((1,), 2.0), rtol=0, atol=0)
    assert module.steps.item() == 1.0


class CountsInPython(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2


def test_a_python_attribute_the_forward_rebinds_is_named_once(emulated_backend, caplog):
    gf = GraphedForward(CountsInPython(), device="cpu", backend=emulated_backend, warmup_iters=2)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        gf(torch.ones(2))
        gf(torch.ones(3))
    named = [r.message for r in caplog.records if "cannot put back" in r.message]
    assert len(named) == 1 and "calls" in named[0], named


class KeepsAHistory(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.history: list[int] = []

    def forward(self, x):
        self.history.append(x.shape[0])  # the same list, changed in place: no replay repeats it
        return x * 2


def test_a_list_the_forward_changes_in_place_is_named_once(emulated_backend, caplog):
    gf = GraphedForward(KeepsAHistory(), device="cpu", backend=emulated_backend, warmup_iters=2)
    with caplog.at_level(logging.WARNING, logger="graphed"):
        torch.testing.assert_close(gf(torch.ones(2)), torch.full((2,), 2.0), rtol=0, atol=0)
    named = [r.message for r in caplog.records if "cannot put back" in r.message]
    assert len(named) == 1 and "history" in named[0], named


# -- Python values a module holds (peft's LoRA state, a config dict) ----------------------------


class ReadsPythonValues(torch.nn.Module):
    """Reads numbers and flags from Python values it holds, as peft's LoRA layers do (a `scaling`
    dict, `_disable_adapters`, `merged_adapters`, `_active_adapter`)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 4)
        self.cfg = {"scale": 1.0, "inner": {"shift": 0.0, "names": ["a"]}}
        self.disabled = False
        self.merged: list[str] = []
        self.active = {"a"}
        self.mode = Mode.PLAIN
        self.helper = Doubler()

    def forward(self, x):
        y = self.linear(x) * self.cfg["scale"] + self.cfg["inner"]["shift"]
        y = y + len(self.cfg["inner"]["names"]) + len(self.merged) + 10 * len(self.active)
        if self.mode is Mode.NEGATED:
            y = -y
        return self.helper(y) * 0 if self.disabled else self.helper(y)


class Mode(enum.Enum):
    PLAIN = 0
    NEGATED = 1


class Doubler:
    def __call__(self, y):
        return y * 2


class Tripler:
    def __call__(self, y):
        return y * 3


VALUE_CHANGES = {
    "dict item set in place": lambda m: m.cfg.__setitem__("scale", 3.0),
    "bool re-bound": lambda m: setattr(m, "disabled", True),
    "list appended to": lambda m: m.merged.append("a"),
    "set added to": lambda m: m.active.add("b"),
    "dict in a dict set in place": lambda m: m.cfg["inner"].__setitem__("shift", 0.5),
    "list in a dict appended to": lambda m: m.cfg["inner"]["names"].append("b"),
    "enum re-bound": lambda m: setattr(m, "mode", Mode.NEGATED),
    "object swapped (an attention processor)": lambda m: setattr(m, "helper", Tripler()),
    "dict re-bound": lambda m: setattr(m, "cfg", {**m.cfg, "scale": 2.0}),
}


@pytest.mark.parametrize("change", list(VALUE_CHANGES))
def test_a_python_value_changed_after_capture_is_captured_again(emulated_backend, change):
    module = ReadsPythonValues()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = _x()[:, :4]
    for _ in range(3):
        gf(x)
    VALUE_CHANGES[change](module)
    want = _eager(module, x)
    assert not torch.equal(want, _eager(ReadsPythonValues(), x))  # the change changes the output
    for _ in range(2):
        torch.testing.assert_close(gf(x), want, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert (stats["captures"], stats["replays"]) == (2, 5), stats  # each call replays


def test_a_python_value_set_to_what_it_was_keeps_the_graph(emulated_backend):
    module = ReadsPythonValues()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = _x()[:, :4]
    gf(x)
    module.cfg["scale"] = 1.0
    module.disabled = False
    module.merged.append("a")
    module.merged.pop()
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    assert gf.stats()["captures"] == 1, gf.stats()


def test_the_changed_python_value_is_logged_by_its_path(emulated_backend, caplog):
    module = torch.nn.Sequential(ReadsPythonValues())
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = _x()[:, :4]
    gf(input=x)
    module[0].cfg["scale"] = 2.0
    with caplog.at_level(logging.INFO, logger="graphed"):
        gf(input=x)
    assert any("'0.cfg'" in r.message or "0.cfg" in r.message for r in caplog.records), [
        r.message for r in caplog.records
    ]


# -- non-tensor outputs that do not follow from the key ------------------------------------------


class ReturnsACounter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2, self.calls


def test_a_non_tensor_output_that_varies_for_one_key_is_refused(emulated_backend):
    module = ReturnsACounter()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, warmup_iters=2)
    out, count = gf(torch.ones(2))
    assert count == module.calls  # eager's value, not a capture's
    stats = gf.stats()
    assert not stats["enabled"]
    assert "non-tensor output[1]" in stats["disabled_reason"], stats["disabled_reason"]
    out, again = gf(torch.ones(2))
    assert again == module.calls


def test_a_non_tensor_output_that_follows_from_the_key_replays(emulated_backend):
    gf = GraphedForward(
        lambda x, scale: (x * scale, scale + 1), device="cpu", backend=emulated_backend
    )
    for _ in range(3):
        assert gf(torch.ones(2), scale=2)[1] == 3
    assert gf.stats()["enabled"] and gf.stats()["replays"] == 3


# -- verify mode --------------------------------------------------------------------------------


class ReadsAHiddenTensor(torch.nn.Module):
    """Reads a tensor through an object attribute graphed cannot watch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.holder = type("Holder", (), {})()
        self.holder.offset = torch.zeros(4)

    def forward(self, x):
        return self.linear(x) + self.holder.offset


def _stale_after_capture(gf: GraphedForward, module: ReadsAHiddenTensor, device: str) -> None:
    x = torch.ones(2, 4, device=device)
    gf(x)
    # Re-bound while the old tensor stays alive elsewhere: the one change graphed's inventory of
    # externals cannot see (the graph reads the old tensor, which was not freed); verify can.
    module.holder.previous = module.holder.offset
    module.holder.offset = torch.ones(4, device=device)
    return x


def test_verify_catches_a_stale_graph_and_returns_eagers_result(emulated_backend, caplog):
    module = ReadsAHiddenTensor()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, verify=3)
    x = _stale_after_capture(gf, module, "cpu")
    with caplog.at_level(logging.WARNING, logger="graphed"):
        got = gf(x)
    torch.testing.assert_close(got, _eager(module, x), rtol=0, atol=0)
    stats = gf.stats()
    assert not stats["enabled"]
    assert "verify: call 2 of a graph differed from eager at output" in stats["disabled_reason"]
    assert "largest difference 1 (bitwise" in stats["disabled_reason"], stats["disabled_reason"]
    assert any("verify" in r.message for r in caplog.records)


@on_gpu
def test_verify_catches_a_stale_graph_on_the_device():
    module = ReadsAHiddenTensor().cuda()
    module.holder.offset = module.holder.offset.cuda()  # unseen by .cuda(), as by the watch
    gf = GraphedForward(module, device="cuda", verify=2)
    x = _stale_after_capture(gf, module, "cuda")
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    # The graph's first replay: its capturing call was answered from its last warm-up, which
    # verify does not count (docs/api.md, Verify mode).
    assert "verify: call 1" in gf.disabled_reason


def _forward_runs(backend: str, calls: int) -> tuple[int, dict]:
    runs = []
    module = TwoLayers()
    module.register_forward_pre_hook(lambda m, args: runs.append(1))
    gf = GraphedForward(module, device="cpu", backend=backend)
    for _ in range(calls):
        gf(_x())
    return len(runs), gf.stats()


def test_verify_passes_a_faithful_graph_and_stops_after_n_calls(emulated_backend, monkeypatch):
    plain_runs, _ = _forward_runs(emulated_backend, 5)
    monkeypatch.setenv("GRAPHED_VERIFY", "2")
    verified_runs, stats = _forward_runs(emulated_backend, 5)
    assert stats["enabled"], stats["disabled_reason"]
    assert verified_runs == plain_runs + 2  # eager beside the graph's first two calls only


def test_verify_with_a_tolerance_accepts_small_differences(emulated_backend):
    module = ReadsAHiddenTensor()
    gf = GraphedForward(
        module, device="cpu", backend=emulated_backend, verify=3, verify_tolerance=(0.0, 2.0)
    )
    x = _stale_after_capture(gf, module, "cpu")
    gf(x)
    assert gf.stats()["enabled"]


def test_verify_options_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="verify must be an int of 0 or more"):
        GraphedForward(TwoLayers(), device="cpu", verify=-1)
    with pytest.raises(ValueError, match=r"verify_tolerance must be \(rtol, atol\)"):
        GraphedForward(TwoLayers(), device="cpu", verify=1, verify_tolerance=(1.0,))
    monkeypatch.setenv("GRAPHED_VERIFY", "some")
    with pytest.raises(ValueError, match=r"\$GRAPHED_VERIFY must be a whole number"):
        GraphedForward(TwoLayers(), device="cpu")


def test_sampled_verify_catches_a_stale_graph_in_serving(emulated_backend):
    module = ReadsAHiddenTensor()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, verify_every=4)
    x = _stale_after_capture(gf, module, "cpu")  # the graph's call 1; then a change it cannot see
    for _ in range(2):
        gf(x)  # calls 2 and 3 are not sampled: the stale graph answers (what verify is for)
    assert gf.stats()["enabled"]
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)  # call 4 is sampled
    reason = gf.stats()["disabled_reason"]
    assert "verify: call 4 of a graph (one in 4 sampled) differed from eager at output" in reason
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)  # eager from then on


def test_sampled_verify_runs_one_eager_forward_in_k_calls_after_the_window(
    emulated_backend, monkeypatch
):
    plain_runs, _ = _forward_runs(emulated_backend, 10)
    monkeypatch.setenv("GRAPHED_VERIFY", "1")
    monkeypatch.setenv("GRAPHED_VERIFY_EVERY", "3")
    verified_runs, stats = _forward_runs(emulated_backend, 10)
    assert stats["enabled"], stats["disabled_reason"]
    assert verified_runs == plain_runs + 4  # the graph's calls 1 (the window), 4, 7 and 10


def test_sampled_verify_options_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="verify_every must be an int of 0 or more"):
        GraphedForward(TwoLayers(), device="cpu", verify_every=-2)
    monkeypatch.setenv("GRAPHED_VERIFY_EVERY", "often")
    with pytest.raises(ValueError, match=r"\$GRAPHED_VERIFY_EVERY must be a whole number"):
        GraphedForward(TwoLayers(), device="cpu")


class SetsUpLazily(torch.nn.Module):
    """Makes a tensor attribute on its first run, as rotary caches and lazy modules do."""

    def forward(self, x):
        if "table" not in vars(self):
            self.table = torch.ones_like(x)
        return x + self.table


def test_a_lazy_setup_in_the_first_run_is_no_change(emulated_backend, caplog):
    gf = GraphedForward(SetsUpLazily(), device="cpu", backend=emulated_backend)
    x = torch.ones(3)
    with caplog.at_level(logging.INFO, logger="graphed"):
        for _ in range(4):
            torch.testing.assert_close(gf(x), torch.full((3,), 2.0), rtol=0, atol=0)
    stats = gf.stats()
    assert (stats["captures"], stats["replays"]) == (1, 4), stats
    assert not [r for r in caplog.records if "changed" in r.message], caplog.records


@on_gpu
def test_sampled_verify_on_the_device_compares_without_waiting_and_tells_at_a_later_call():
    """A sampled call compares on the device: no synchronization (sync debug mode "error" would
    raise), the graph's result returned; once the device has written the verdict, the next call
    disables the runner with the path and the difference and returns eager's result."""
    module = ReadsAHiddenTensor().cuda()
    module.holder.offset = module.holder.offset.cuda()  # unseen by .cuda(), as by the watch
    gf = GraphedForward(module, device="cuda", verify_every=3)
    x = _stale_after_capture(gf, module, "cuda")
    for _ in range(2):
        gf(x)  # the graph's calls 1 (its first replay) and 2 are not sampled
    torch.cuda.set_sync_debug_mode("error")
    try:
        stale = gf(x)  # call 3: sampled, compared on the device
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert gf.stats()["enabled"], "the verdict is read at a later call"
    torch.cuda.synchronize()
    assert not torch.equal(stale, _eager(module, x)), "the graph's stale result was returned"
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    reason = gf.stats()["disabled_reason"]
    assert "verify: call 3 of a graph (one in 3 sampled) differed from eager at output" in reason
    assert "largest difference 1 (bitwise" in reason, reason


@on_gpu
def test_sampled_verify_on_the_device_keeps_a_faithful_graph_replaying():
    module = TwoLayers().cuda()
    gf = GraphedForward(module, device="cuda", verify_every=1)  # every call sampled
    for step in range(24):
        x = _x("cuda") + step
        torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    torch.cuda.synchronize()
    gf(_x("cuda"))  # reads the last verdicts
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1 and stats["replays"] >= 24, stats


def test_a_sampled_calls_verdict_read_at_a_later_call_disables_there_with_the_difference(
    emulated_backend, monkeypatch
):
    """The later reading of a sampled call's verdict (where the comparison is queued on a device:
    graphed._verify.DEFERRED_DEVICE_TYPES, widened to the CPU here): the sampled call returns the
    graph's result; the next call reads the verdict, disables the runner with the path and the
    difference and returns eager's result."""
    monkeypatch.setattr(_verify, "DEFERRED_DEVICE_TYPES", ("cuda", "cpu"))
    module = ReadsAHiddenTensor()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend, verify_every=4)
    x = _stale_after_capture(gf, module, "cpu")
    for _ in range(3):
        gf(x)  # calls 2 and 3 are not sampled, call 4 is: its verdict waits for the next call
    assert gf.stats()["enabled"]
    torch.testing.assert_close(gf(x), _eager(module, x), rtol=0, atol=0)
    reason = gf.stats()["disabled_reason"]
    assert "verify: call 4 of a graph (one in 4 sampled) differed from eager at output" in reason
    assert "largest difference 1 (bitwise" in reason, reason


def test_a_faithful_graphs_verdicts_read_later_keep_it_replaying(emulated_backend, monkeypatch):
    monkeypatch.setattr(_verify, "DEFERRED_DEVICE_TYPES", ("cuda", "cpu"))
    gf = GraphedForward(TwoLayers(), device="cpu", backend=emulated_backend, verify_every=1)
    x = _x()
    waiting = []
    for _ in range(6):
        gf(x)  # the emulated replay returns what the capture wrote: the same input each call
        waiting.append(gf._call_state.verdicts_pending)
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]
    # Every call (the capturing one included: here its graph's replay answers it) reads the last
    # verdict and queues its own, in the extension's queue (pyext/gf_verify_sampled.c).
    assert waiting == [1] * 6, waiting


class ScaleBy(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class HoldsAChild(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ScaleBy(2.0)

    def forward(self, x):
        return self.inner(x)


def test_children_replaced_whole_are_recorded_and_watched(emulated_backend):
    """A module's `_modules` dict re-bound (not mutated: no mutation of the old dict says so)
    records the whole module again: the new child is captured, and then watched."""
    module = HoldsAChild()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = torch.ones(3)
    gf(x)
    vars(module)["_modules"] = collections.OrderedDict(inner=ScaleBy(5.0))
    torch.testing.assert_close(gf(x), torch.full((3,), 5.0), rtol=0, atol=0)
    module.inner.factor = 7.0
    torch.testing.assert_close(gf(x), torch.full((3,), 7.0), rtol=0, atol=0)
    assert gf.stats()["captures"] == 3


def test_a_key_a_module_sets_twice_is_recorded_again_without_error(emulated_backend):
    """A parameter and an instance attribute of one name (the attribute shadows nothing torch
    reads): recorded twice under one key, recorded again after a change without a KeyError."""
    module = TwoLayers()
    vars(module.a)["bias"] = torch.zeros(8)
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    gf(_x())
    module.a.scale = 2.0
    gf(_x())
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]


def test_verify_compares_bytes_whatever_the_outputs_layout(emulated_backend):
    """Eager's output transposed (non-contiguous), the graph's contiguous: equal values pass."""

    class Transposes(torch.nn.Module):
        def forward(self, x):
            return (x * 2).t()

    gf = GraphedForward(Transposes(), device="cpu", backend=emulated_backend, verify=4)
    x = torch.arange(6.0).reshape(2, 3)
    for _ in range(4):
        gf(x)
    assert gf.stats()["enabled"], gf.stats()["disabled_reason"]


def test_a_global_forward_hook_added_after_capture_is_seen(emulated_backend):
    """torch's global forward hooks (recorded again with every change the watch sees) added after
    the capture: the call runs the hook, as eager does."""
    module = TwoLayers()
    gf = GraphedForward(module, device="cpu", backend=emulated_backend)
    x = _x()
    gf(x)
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda hooked, args, output: seen.append(type(hooked).__name__)
    )
    try:
        gf(x)
    finally:
        handle.remove()
    assert "TwoLayers" in seen, seen
    assert gf.stats()["captures"] == 2, gf.stats()
