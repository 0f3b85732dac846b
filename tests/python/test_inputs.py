"""What graphed accepts as an input and how long it holds it: every tensor kind torch has through
every entry point (in child processes, _tensor_kinds_child.py, so that an abort is a failed case
instead of a lost session), the refusals of kinds and dimensions graphed cannot take, naming the
kwarg's path; inputs live for the whole call even when the forward or another thread drops the
caller's only reference; and what graphed holds (output templates, keep_alive objects) stays
bounded however many keys it sees."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest
import torch
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


def _run_child(kind: str) -> tuple[int, dict[str, dict]]:
    # The child imports the same graphed as this process (installed, or on PYTHONPATH).
    env = dict(os.environ)
    done = subprocess.run(
        [sys.executable, str(CHILD), kind],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    records = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records[record["entry"]] = record
    return done.returncode, records, done.stderr[-2000:]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_tensor_kind_through_every_entry_point_never_aborts(kind, backend_choice):
    if kind == "mkldnn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no mkldnn")
    returncode, records, stderr = _run_child(kind)
    assert returncode == 0, f"the child died (exit {returncode}): {records}\n{stderr}"
    expected = KINDS[kind]
    got = {name: record["result"] for name, record in records.items()}
    assert got == expected, records
    for name, record in records.items():
        if record["result"] in ("TypeError", "ValueError"):
            where = "input tensor 0" if name == "op" else "kwargs['x']"
            where = "keep_alive[0]" if name.startswith("keep_alive") else where
            if not (kind == "meta" and name == "op"):
                assert where in record["message"], record


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
        lambda *, x, n: {"y": x + n, "n": n}, device="cpu", backend=emulated_backend, max_entries=2
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
