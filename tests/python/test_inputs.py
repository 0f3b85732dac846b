"""What graphed accepts as an input and how long it holds it: every tensor kind torch has through
every entry point (in a child process, _tensor_kinds_child.py, that runs the kinds one after
another, so that an abort is a failed case naming its kind instead of a lost session), the
refusals of kinds and dimensions graphed cannot take, naming the kwarg's path; inputs live for the
whole call even when the forward or another thread drops the caller's only reference; and what
graphed holds (output templates, keep_alive objects) stays bounded however many keys it sees."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest
import torch
from _backend_choice import plugin_missing_reason
from graphed import GraphedForward
from torch import nn

CHILD = Path(__file__).with_name("_tensor_kinds_child.py")

# kind -> what each entry point must do: "ok" (the right values) or the exception type; the
# message of a refusal names the kwarg path (kwargs[...], keep_alive[...], input tensor N).
_REFUSED = {"fast": "TypeError", "python": "TypeError", "keep_alive": "TypeError",
            "keep_alive_python": "TypeError", "op": "TypeError"}  # fmt: skip
_ALL_OK = dict.fromkeys(_REFUSED, "ok")
KINDS = {
    "plain": _ALL_OK,
    "noncontiguous": _ALL_OK,
    "zero_size": _ALL_OK,
    "conj": _ALL_OK,
    "neg": _ALL_OK,
    "subclass": _ALL_OK,
    "sparse_coo": _REFUSED,
    "sparse_csr": _REFUSED,
    "mkldnn": _REFUSED,
    "quantized": _REFUSED,
    "int4": _REFUSED,
    "dims13": {name: "ValueError" for name in _REFUSED},
    # The operator entry under these is refused by torch's own dispatch before graphed runs
    # (nested: no kernel for the nested key; meta: torch sends a meta call to the operator's fake
    # implementation, which knows only GraphedForward runners; vmap: functorch has no batching
    # rule for graphed::forward; grad: the operator runs on the unwrapped tensor).
    "nested": {**_REFUSED, "op": "NotImplementedError"},
    "meta": {**_REFUSED, "op": "ValueError"},
    "vmap": {**_REFUSED, "op": "RuntimeError"},
    "grad": {**_REFUSED, "op": "ok"},
}


CHILD_TIMEOUT_S = 240


def _run_child(kinds: list[str]) -> tuple[str, list[dict], str]:
    """Runs the kinds in one child, in order: how it ended ("" for exit 0), its JSON lines, and
    the tail of its stderr."""
    # The child inherits the environment, so it imports the same graphed as this process
    # (installed, or on PYTHONPATH).
    child = subprocess.Popen(
        [sys.executable, str(CHILD), *kinds],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
        ended = f"exit {child.returncode}" if child.returncode else ""
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
        ended = f"hung past {CHILD_TIMEOUT_S} s and was killed"
    lines = []
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # not one of its lines, or one cut short by the process's death
            continue
        if isinstance(record, dict) and "kind" in record:
            lines.append(record)
    return ended, lines, stderr[-2000:]


def run_kinds(kinds: list[str]) -> dict[str, dict]:
    """Every kind's outcome: its records by entry point and how its child died ("" when it did
    not). The kinds run in one child; when it dies, the kind it had started and not finished is
    charged with the death, and a new child runs the kinds after it. A child that dies with no
    kind in progress (at import, or at exit after its last kind) is charged to every kind it ran."""
    outcomes = {kind: {"records": {}, "died": ""} for kind in kinds}
    pending = list(kinds)
    while pending:
        ended, lines, stderr = _run_child(pending)
        started, done = [], []
        for line in lines:
            event = line.get("event")
            if event == "start":
                started.append(line["kind"])
            elif event == "done":
                done.append(line["kind"])
            else:
                outcomes[line["kind"]]["records"][line["entry"]] = line
        if not ended and done == pending:
            return outcomes
        ended = ended or "exit 0 before its last kind"
        if started and started[-1] not in done:
            culprit = started[-1]
            outcomes[culprit]["died"] = (
                f"the child died during this kind ({ended}), after the kinds {started[:-1]} "
                f"in the same process; alone: python {CHILD.name} {culprit}\n{stderr}"
            )
            pending = pending[pending.index(culprit) + 1 :]
            continue
        for kind in pending:
            outcomes[kind]["died"] = (
                f"the child that ran {pending} died with no kind in progress ({ended})\n{stderr}"
            )
        return outcomes
    return outcomes


def _kinds_here() -> list[str]:
    return [k for k in sorted(KINDS) if k != "mkldnn" or torch.backends.mkldnn.is_available()]


@pytest.fixture(scope="module")
def kind_outcomes() -> dict[str, dict]:
    """One child run for every kind of the matrix, shared by its test ids."""
    reason = plugin_missing_reason()
    if reason is not None:
        pytest.fail(reason)
    return run_kinds(_kinds_here())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_tensor_kind_through_every_entry_point_never_aborts(kind, kind_outcomes):
    if kind == "mkldnn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no mkldnn")
    outcome = kind_outcomes[kind]
    records = outcome["records"]
    assert not outcome["died"], f"{outcome['died']}\nrecords so far: {records}"
    expected = KINDS[kind]
    got = {name: record["result"] for name, record in records.items()}
    assert got == expected, records
    for name, record in records.items():
        if record["result"] in ("TypeError", "ValueError"):
            where = "input tensor 0" if name == "op" else "kwargs['x']"
            where = "keep_alive[0]" if name.startswith("keep_alive") else where
            if not (kind == "meta" and name == "op"):
                assert where in record["message"], record


def test_a_child_that_dies_fails_the_kind_in_progress_and_a_new_child_runs_the_rest(monkeypatch):
    children = []

    def fake_child(kinds):
        """Prints what the child would, aborting in kind "b" and failing at exit after kind "e"."""
        children.append(list(kinds))
        lines = []
        for kind in kinds:
            lines.append({"kind": kind, "event": "start"})
            if kind == "b":
                return "exit -6", lines, "terminate called"
            lines.append({"kind": kind, "entry": "fast", "result": "ok"})
            lines.append({"kind": kind, "event": "done"})
        return ("exit 1" if "e" in kinds else ""), lines, "at exit"

    monkeypatch.setattr(sys.modules[__name__], "_run_child", fake_child)
    outcomes = run_kinds(["a", "b", "c"])
    assert children == [["a", "b", "c"], ["c"]]
    for kind in ("a", "c"):
        ran = {"fast": {"kind": kind, "entry": "fast", "result": "ok"}}
        assert outcomes[kind] == {"records": ran, "died": ""}
    assert outcomes["b"]["records"] == {}
    assert "died during this kind (exit -6)" in outcomes["b"]["died"]
    assert "terminate called" in outcomes["b"]["died"]
    exited = run_kinds(["d", "e"])
    assert all("no kind in progress (exit 1)" in exited[kind]["died"] for kind in ("d", "e"))


# -- inputs live for the whole call, and the forward's kwargs are a snapshot -------------------


class KVCache(nn.Module):
    """Keeps its cache as a dict the caller passes back in; the forward replaces the tensor in it
    (torch.cat), which drops the caller's only reference to the old one."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = {"k": torch.full((4, 8), 3.0)}
        self.junk: list[torch.Tensor] = []

    def forward(self, *, x, cache):
        out = x + cache["k"]
        self.cache["k"] = torch.cat([self.cache["k"][1:], x[:1]])
        self.cache["added"] = 1  # changes the structure of the caller's dict too
        # Allocations of the freed size, so that freed memory would be reused with other bytes.
        self.junk = [torch.full((4, 8), -7.0) for _ in range(16)]
        return out


def test_a_forward_that_replaces_the_callers_tensor_neither_frees_nor_changes_the_input(
    emulated_backend,
):
    m = KVCache()
    gf = GraphedForward(m, device="cpu", backend=emulated_backend, warmup_iters=3)
    x = torch.ones(4, 8)
    cache = m.cache
    expected = x + 3.0
    out = gf(x=x, cache=cache)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    stats = gf.stats()
    assert stats["enabled"], stats["disabled_reason"]
    assert stats["captures"] == 1


def test_another_thread_replacing_the_callers_tensor_while_the_call_waits(emulated_backend):
    started = threading.Event()
    release = threading.Event()

    def forward(*, x, cache=None):
        if cache is None:  # the first thread's call holds the runner until released
            started.set()
            release.wait(10)
            return x
        return x + cache["k"]

    gf = GraphedForward(forward, device="cpu", backend=emulated_backend)
    holder = threading.Thread(target=lambda: gf(x=torch.zeros(2)))
    holder.start()
    started.wait(10)
    shared = {"k": torch.full((4, 8), 5.0)}
    results = []
    waiter = threading.Thread(target=lambda: results.append(gf(x=torch.ones(4, 8), cache=shared)))
    waiter.start()
    # The waiter walked the kwargs and now waits for the runner with the GIL released: drop the
    # caller's only reference to its tensor and reuse the memory.
    waiter.join(0.5)
    shared["k"] = torch.zeros(4, 8)
    junk = [torch.full((4, 8), -7.0) for _ in range(16)]
    release.set()
    holder.join(10)
    waiter.join(10)
    torch.testing.assert_close(results[0], torch.full((4, 8), 6.0), rtol=0, atol=0)
    del junk


# -- refused inputs name their path ------------------------------------------------------------


def test_an_int4_input_is_refused_and_other_keys_stay_graphed(emulated_backend):
    gf = GraphedForward(lambda *, x: x, device="cpu", backend=emulated_backend)
    with pytest.raises(TypeError, match=r"kwargs\['x'\] has a sub-byte dtype"):
        gf(x=torch.empty(4, dtype=torch.int4))
    gf(x=torch.ones(2))
    stats = gf.stats()
    assert stats["enabled"] and stats["captures"] == 1


def test_keep_alive_with_thirteen_dimensions_is_a_value_error_naming_it(emulated_backend):
    gf = GraphedForward(lambda *, x: x, device="cpu", backend=emulated_backend)
    with pytest.raises(ValueError, match=r"keep_alive\[0\] has 13 dimensions"):
        gf(x=torch.ones(2), keep_alive=torch.zeros([1] * 13))
    assert gf.stats()["enabled"]


# -- what graphed holds stays bounded ----------------------------------------------------------


class _Held:
    """A non-tensor keep_alive object, held by the entry its call captured."""


def test_output_templates_and_held_objects_stay_bounded(emulated_backend):
    """Each entry owns its output template and the held objects of the call that captured it:
    eviction releases them, hits hold nothing, and reset and disable release the rest."""
    gf = GraphedForward(
        lambda *, x, n: {"y": x + n, "n": n},
        device="cpu",
        backend=emulated_backend,
        max_entries=2,
        churn_limit=0,  # every key captures, so that eviction releases what each entry held
    )
    refs = []
    for n in range(200):
        held = _Held()
        refs.append(weakref.ref(held))
        assert gf(x=torch.ones(2), n=n, keep_alive=[held])["n"] == n
        del held
    for _ in range(50):  # hits
        held = _Held()
        refs.append(weakref.ref(held))
        assert gf(x=torch.ones(2), n=199, keep_alive=[held])["n"] == 199
        del held
    gc.collect()
    alive = [index for index, ref in enumerate(refs) if ref() is not None]
    assert alive == [198, 199]  # the two resident entries' captures
    stats = gf.stats()
    assert (stats["graphs"], stats["evictions"], stats["replays"]) == (2, 198, 250)
    gf.reset()
    gc.collect()
    assert all(ref() is None for ref in refs)

    held = _Held()
    kept = weakref.ref(held)
    gf(x=torch.ones(2), n=0, keep_alive=[held])
    del held
    gc.collect()
    assert kept() is not None
    gf.disable("asked")
    gc.collect()
    assert kept() is None
