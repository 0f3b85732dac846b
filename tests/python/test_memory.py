"""Graph memory (issue 22): graphed.MemoryPool and runners made on it (memory_pool=), the rules
the shim enforces (a pool of the runner's device, a live pool, a pool that outlives its Python
object while runners use it), static inputs shared between the entries of one runner (reported by
stats() and entries(), every replay still computed from its own inputs, outputs that survive the
next replay as before), and memory_table. CPU tests run on the emulated backend; the GPU tests
(marked gpu) measure the memory figures on CUDA."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import types

import graphed
import pytest
import torch

_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
_library = torch.library.Library("graphed_memory_test", "DEF")
_library.define("scale(Tensor[] inputs) -> Tensor[]")
_library.impl("scale", lambda inputs: [inputs[0] * 2 + inputs[1]], "CompositeExplicitAutograd")
_library.define("identity(Tensor[] inputs) -> Tensor[]")
_library.impl("identity", lambda inputs: [inputs[0]], "CompositeExplicitAutograd")


def _runner(backend, pool=None, op="graphed_memory_test::scale", **options):
    return graphed.Runner(op, device="cpu", backend=backend, memory_pool=pool, **options)


def test_two_runners_on_one_pool_each_replay_their_own_graphs(emulated_backend):
    pool = graphed.MemoryPool("cpu")
    x, y = torch.arange(4.0), torch.ones(4)
    with _runner(emulated_backend, pool) as first, _runner(emulated_backend, pool) as second:
        for _ in range(3):
            (a,) = first.forward("k", [x, y])
            (b,) = second.forward("k", [x, y + 1])
            torch.testing.assert_close(a, x * 2 + y)
            torch.testing.assert_close(b, x * 2 + y + 1)
        assert first.stats()["replays"] == second.stats()["replays"] == 3
    assert "MemoryPool(device=cpu" in repr(pool)


def test_a_pool_lives_while_a_runner_made_on_it_does(emulated_backend):
    pool = graphed.MemoryPool("cpu")
    runner = _runner(emulated_backend, pool)
    pool.release()
    pool.release()  # idempotent
    assert "released" in repr(pool)
    x = torch.arange(4.0)
    (out,) = runner.forward("k", [x, x])
    torch.testing.assert_close(out, x * 3)
    runner.close()
    with pytest.raises(ValueError, match="released"):
        _runner(emulated_backend, pool)


def test_a_pool_of_another_device_or_an_unknown_pool_is_refused(emulated_backend):
    pool_id = torch.ops.graphed.pool_create(torch.device("meta"))
    with pytest.raises(ValueError, match="the memory pool is on meta, the runner on cpu"):
        torch.ops.graphed.create(
            "p", "graphed_memory_test::scale", torch.device("cpu"), memory_pool=pool_id
        )
    torch.ops.graphed.pool_release(pool_id)
    with pytest.raises(ValueError, match=f"no memory pool with id {pool_id}"):
        torch.ops.graphed.create(
            "p", "graphed_memory_test::scale", torch.device("cpu"), memory_pool=pool_id
        )
    with pytest.raises(ValueError, match="to release"):
        torch.ops.graphed.pool_release(pool_id)
    with pytest.raises(TypeError, match="graphed.MemoryPool or None"):
        _runner(emulated_backend, pool=pool_id)


def test_entries_of_one_shape_share_static_inputs_and_replay_their_own(emulated_backend):
    x, y = torch.arange(6.0), torch.full((6,), 3.0)
    with _runner(emulated_backend) as runner:
        (a,) = runner.forward("a", [x, y])
        (b,) = runner.forward("b", [x, y])
        stats = runner.stats()
        assert stats["captures"] == 2
        assert stats["shared_input_bytes"] == 2 * 6 * 4
        # Inputs counted once: one set of input buffers, each entry's own output.
        assert stats["pool_bytes"] == 2 * 6 * 4 + 2 * 6 * 4
        assert [entry["shared_input_bytes"] for entry in runner.entries()] == [48, 48]
        torch.testing.assert_close(a, x * 2 + y)
        torch.testing.assert_close(b, x * 2 + y)


def test_evicting_under_churn_keeps_static_bytes_bounded(emulated_backend):
    with _runner(emulated_backend, max_entries=2) as runner:
        x = torch.arange(8.0)
        for key in range(12):
            runner.forward(f"k{key}", [x, x])
        stats = runner.stats()
        assert stats["evictions"] == 10 and stats["graphs"] == 2
        assert stats["pool_bytes"] == 2 * 8 * 4 + 2 * 8 * 4
        runner.reset()
        assert runner.stats()["pool_bytes"] == 0


def test_static_outputs_that_alias_inputs_survive_another_entrys_replay(emulated_backend):
    """A forward that returns its input: its entries keep their own buffers, so the static output
    of one survives the replay of another, as before sharing."""
    with _runner(emulated_backend, op="graphed_memory_test::identity") as runner:
        x = torch.arange(4.0)
        (kept,) = runner.forward("a", [x], static_outputs=True)
        runner.forward("b", [x + 10], static_outputs=True)
        torch.testing.assert_close(kept, x)
        assert runner.stats()["shared_input_bytes"] == 0


def test_memory_table_lists_each_graph_and_the_totals(emulated_backend):
    with _runner(emulated_backend) as runner:
        x = torch.arange(4.0)
        runner.forward("a", [x, x])
        runner.forward("b", [x, x])
        out = io.StringIO()
        text = graphed.memory_table(runner, file=out)
        assert out.getvalue() == text + "\n"
        lines = text.splitlines()
        assert lines[0].split()[:2] == ["shapes", "replays"]
        assert len(lines) == 4  # header, two graphs, totals
        assert lines[-1].startswith("2 graph(s): static buffers 64 B (of which 32 B shared")
        # the emulated backend cannot say what the device reserves
        assert runner.stats()["pool_reserved_bytes"] == -1
        assert [entry["reserved_bytes"] for entry in runner.entries()] == [-1, -1]
        assert lines[-1].endswith(
            "the graph pool reserves unknown (shared by the runners of one pool)"
        )


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor, extra: dict | None = None) -> torch.Tensor:
        return x * 2 + (extra["y"] if extra else 0)


def test_warm_up_captures_the_largest_call_first_and_replays_after(emulated_backend):
    gf = graphed.GraphedForward(_Double(), device="cpu", backend=emulated_backend)
    small, large, middle = torch.ones(2), torch.ones(16), torch.ones(4)
    nested = {"x": torch.ones(2), "extra": {"y": torch.ones(2) * 3}}  # 16 bytes in a container
    calls = [{"x": small}, {"x": large}, {"x": middle}, nested]
    assert graphed.warm_up(gf, calls) == 4
    # entries() lists the most recent first. Captured: 64 bytes, then the two calls of 16 bytes
    # (4 elements; the nested call's 2 + 2) in their given order, then 8 bytes.
    assert [entry["shapes"] for entry in gf.entries()] == [
        "f32[2]",
        "f32[2], f32[2]",
        "f32[4]",
        "f32[16]",
    ]
    for call in calls:
        torch.testing.assert_close(gf(**call), _Double()(**call), rtol=0, atol=0)
    assert gf.stats()["captures"] == 4 and gf.stats()["replays"] >= 4
    assert graphed.warm_up(gf, calls) == 0  # every key has its graph


def test_warm_up_shows_progress_and_logs_what_it_took(emulated_backend, caplog, capsys):
    pytest.importorskip("tqdm")
    gf = graphed.GraphedForward(_Double(), device="cpu", backend=emulated_backend, name="shapes")
    calls = [{"x": torch.ones(n)} for n in range(1, 7)]
    with caplog.at_level(logging.INFO, logger="graphed"):
        assert graphed.warm_up(gf, calls) == 6
    assert "graphed: warming up 'shapes'" in capsys.readouterr().err  # tqdm's bar, on stderr
    (line,) = [r.message for r in caplog.records if "warm_up captured" in r.message]
    assert line.startswith("runner 'shapes': warm_up captured 6 graph(s) for 6 call(s) in ")
    assert line.endswith("graph pool size unknown"), line  # the emulated backend cannot say
    graphed.warm_up(gf, calls[:2], progress=False)
    assert "warming up" not in capsys.readouterr().err


def test_warm_up_refuses_what_is_not_a_list_of_calls_and_the_runner_stays_usable(
    emulated_backend,
):
    gf = graphed.GraphedForward(_Double(), device="cpu", backend=emulated_backend)
    x = torch.ones(3)
    with pytest.raises(TypeError, match=r"calls\[1\] is a list, not a mapping"):
        graphed.warm_up(gf, [{"x": x}, [x]])
    assert gf.stats()["captures"] == 0  # refused before any call ran
    with pytest.raises(TypeError, match=r"wrap it in a list"):
        graphed.warm_up(gf, {"x": x})
    holder = types.SimpleNamespace(y=x)  # what a call refuses, refused before any call runs
    with pytest.raises(TypeError, match=r"kwargs\['extra'\]\.y: tensor inside"):
        graphed.warm_up(gf, [{"x": x}, {"x": x, "extra": holder}])
    assert gf.stats()["captures"] == 0
    with (
        _runner(emulated_backend) as runner,
        pytest.raises(TypeError, match=r"takes a GraphedForward, got Runner"),
    ):
        graphed.warm_up(runner, [{"x": x}])
    torch.testing.assert_close(gf(x=x), x * 2)
    assert gf.stats()["captures"] == 1


@_gpu[0]
@_gpu[1]
def test_two_runners_on_one_cuda_pool_reserve_about_the_larger():
    """Two runners of one pool on CUDA: the second reserves little beyond the first's pool."""
    device = torch.device("cuda")
    weight = torch.randn(1024, 1024, device=device)

    def reserved() -> int:
        # What the graphs hold: the ordinary pool's cached blocks (the test's own, and any a
        # warm-up left where its scratch pool could not be given back) are given back first.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(device)

    _library.define("mlp(Tensor[] inputs) -> Tensor[]")
    _library.impl(
        "mlp",
        lambda inputs: [torch.relu(inputs[0] @ weight) @ weight],
        "CompositeExplicitAutograd",
    )
    pool = graphed.MemoryPool(device)
    x = torch.randn(4096, 1024, device=device)
    start = reserved()
    with graphed.Runner("graphed_memory_test::mlp", device=device, memory_pool=pool) as first:
        reference = first.forward("k", [x])[0]
        alone = reserved() - start
        with graphed.Runner("graphed_memory_test::mlp", device=device, memory_pool=pool) as second:
            for _ in range(3):
                torch.testing.assert_close(second.forward("k", [x])[0], reference)
                torch.testing.assert_close(first.forward("k", [x])[0], reference)
            both = reserved() - start
    assert both <= 1.2 * alone + 2 * x.nbytes, (alone, both)


@_gpu[0]
@_gpu[1]
def test_two_runners_on_one_cuda_pool_capture_into_the_same_memory():
    """The sharing rule at the pool itself (stats()["pool_reserved_bytes"], one figure for both
    runners): a forward with two 16 MiB intermediates and a small output; the second runner's
    capture fits in the blocks the first one's left free, so the pool barely grows."""
    device = torch.device("cuda")
    weight = torch.randn(1024, 1024, device=device)
    _library.define("mlp_sum(Tensor[] inputs) -> Tensor[]")
    _library.impl(
        "mlp_sum",
        lambda inputs: [(torch.relu(inputs[0] @ weight) @ weight).sum(dim=1)],
        "CompositeExplicitAutograd",
    )
    pool = graphed.MemoryPool(device)
    x = torch.randn(4096, 1024, device=device)
    expected = (torch.relu(x @ weight) @ weight).sum(dim=1)
    op = "graphed_memory_test::mlp_sum"
    with graphed.Runner(op, device=device, memory_pool=pool) as first:
        torch.testing.assert_close(first.forward("k", [x])[0], expected)
        alone = first.stats()["pool_reserved_bytes"]
        with graphed.Runner(op, device=device, memory_pool=pool) as second:
            for _ in range(3):
                torch.testing.assert_close(second.forward("k", [x])[0], expected)
                torch.testing.assert_close(first.forward("k", [x])[0], expected)
            both = second.stats()["pool_reserved_bytes"]
            assert first.stats()["pool_reserved_bytes"] == both
            assert second.stats()["captures"] == 1 and first.stats()["captures"] == 1
    assert alone >= 2 * x.nbytes, alone  # the two intermediates
    assert both <= 1.2 * alone, (alone, both)


@_gpu[0]
@_gpu[1]
def test_cuda_churn_does_not_grow_reserved_memory():
    device = torch.device("cuda")
    _library.define("square(Tensor[] inputs) -> Tensor[]")
    _library.impl("square", lambda inputs: [inputs[0] * inputs[0] + 1], "CompositeExplicitAutograd")
    with graphed.Runner("graphed_memory_test::square", device=device, max_entries=1) as runner:
        sizes = [(1 << 20) + 4096 * i for i in range(4)]

        def churn() -> None:  # every capture evicts the one before
            for size in sizes:
                out = runner.forward("k", [torch.full((size,), 2.0, device=device)])[0]
                assert torch.equal(out, torch.full((size,), 5.0, device=device))
            torch.cuda.synchronize()

        # Settled after one round, the test's own checks included (torch.equal's result takes a
        # small block of torch's ordinary pool the first time).
        churn()
        settled, pool_settled = (
            torch.cuda.memory_reserved(device),
            runner.stats()["pool_reserved_bytes"],
        )
        for _ in range(3):
            churn()
        assert torch.cuda.memory_reserved(device) <= settled
        assert runner.stats()["pool_reserved_bytes"] <= pool_settled
        assert runner.stats()["captures"] == 4 * len(sizes)
        assert runner.stats()["enabled"]


class _LazyScale(torch.nn.Module):
    """Keeps a tensor per length, made the first time a length is seen: in the warm-up of that
    length's capture, which is where a kept tensor is born."""

    def __init__(self) -> None:
        super().__init__()
        self.by_length: dict[int, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[0]
        if length not in self.by_length:
            self.by_length[length] = torch.arange(length, device=x.device, dtype=x.dtype) * 3
        scratch = torch.relu(x) * 2  # scratch memory of the graph
        return scratch + self.by_length[length]


@_gpu[0]
@_gpu[1]
def test_a_tensor_a_later_warmup_keeps_is_not_overwritten_by_other_graphs():
    """A later warm-up allocates outside the graph pool's free blocks (which are the first graph's
    scratch memory): the tensor it keeps survives replays of the first graph."""
    device = torch.device("cuda")
    graphed_module = graphed.GraphedForward(_LazyScale(), device=device)
    # The second length's kept tensor (4 MiB) would fit in the first graph's free 8 MiB blocks.
    lengths = [1 << 21, 1 << 20]
    inputs = {n: torch.randn(n, device=device) for n in lengths}
    expected = {
        n: torch.relu(x) * 2 + torch.arange(n, device=device, dtype=x.dtype) * 3
        for n, x in inputs.items()
    }
    for _ in range(3):
        for n in lengths:
            torch.testing.assert_close(graphed_module(x=inputs[n]), expected[n], rtol=0, atol=0)
    assert graphed_module.stats()["captures"] == 2
    assert graphed_module.stats()["enabled"]


def _child_figures(source: str, environment: dict[str, str] | None = None) -> dict:
    """Runs `source` in a fresh Python process (this one's environment, or `environment`) and
    returns the JSON object its last line prints; the child's stderr where it failed."""
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_LATER_WARMUPS_CHILD = """
import json, torch, graphed

class Call(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)

device = torch.device("cuda")
weight = torch.randn(1024, 1024, device=device)

def mlp(x):
    return torch.relu(x @ weight) @ weight

graphed_mlp = graphed.GraphedForward(Call(mlp), device=device)
small, large = torch.randn(256, 1024, device=device), torch.randn(8192, 1024, device=device)
graphed_mlp(x=small)
expected = mlp(large)
torch.cuda.synchronize()
torch.cuda.empty_cache()  # so that warm-ups in torch's ordinary pool would have to grow it
reserved, pool = torch.cuda.memory_reserved(device), graphed_mlp.stats()["pool_reserved_bytes"]
before = {segment["address"] for segment in torch.cuda.memory_snapshot()}
got = graphed_mlp(x=large)
torch.cuda.synchronize()
# Read before anything else runs: the check below (allclose) caches its own temporaries in torch's
# ordinary pool, 118 MiB on an H200, which a later reading counted as the capture's.
reserved_growth = torch.cuda.memory_reserved(device) - reserved
# Where the new memory is, for the message of a failure: MiB reserved and in use, by pool and
# stream ("side" is the stream the warm-ups and the capture ran on, "caller" the caller's).
caller = torch.cuda.current_stream(device).cuda_stream
where = {}
for segment in torch.cuda.memory_snapshot():
    if segment["address"] in before:
        continue
    place = "pool %s, %s stream" % (
        tuple(segment["segment_pool_id"]), "caller" if segment["stream"] == caller else "side"
    )
    held = where.setdefault(place, [0, 0])
    held[0] += segment["total_size"] >> 20
    held[1] += segment["allocated_size"] >> 20
print(json.dumps({
    "new_segments_mib": where,
    "equal": bool(torch.allclose(got, expected)),
    "pool": pool,
    "pool_growth": graphed_mlp.stats()["pool_reserved_bytes"] - pool,
    "reserved_growth": reserved_growth,
    "entry_reserved": graphed_mlp.entries()[0]["reserved_bytes"],
    "captures": graphed_mlp.stats()["captures"],
    "large_bytes": large.nbytes,
}))
"""


@_gpu[0]
@_gpu[1]
def test_a_later_shapes_warmups_leave_nothing_reserved_beside_the_graph_pool():
    """Once the pool holds a graph, a new shape's warm-ups use a scratch pool that goes back to
    the device: what the device reserves grows by the graph pool's growth, the static buffers and
    little else (before, the warm-ups' blocks stayed cached in torch's ordinary pool). In a fresh
    process, as a server starts: a scratch pool cannot be given back while torch's allocator has a
    capture or routing under way elsewhere, which other tests of this process may leave."""
    figures = _child_figures(_LATER_WARMUPS_CHILD)
    large = figures["large_bytes"]
    assert figures["equal"] and figures["captures"] == 2, figures
    # the graph's two intermediates are in the pool (less what the first graph's free blocks lend:
    # a pool that grows by expandable segments merges them with the new memory)
    assert figures["pool"] > 0 and figures["pool_growth"] >= 2 * large - figures["pool"], figures
    # beside it only the static input and the returned output, not the warm-up's intermediates
    assert figures["reserved_growth"] - figures["pool_growth"] <= 2 * large + 2**22, figures
    assert figures["entry_reserved"] >= figures["pool_growth"], figures


_POOL_GROWTH_CHILD = """
import json, torch, graphed

device = torch.device("cuda")
weight = torch.randn(1024, 1024, device=device)

class Mlp(torch.nn.Module):  # large intermediates, a small output (as a DiT's)
    def forward(self, x):
        return (torch.relu(x @ weight) @ weight).sum(dim=1)

def settings():
    read = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    return None if read is None else read()

def expandable(pool_id):
    return sorted({bool(segment.get("is_expandable")) for segment in torch.cuda.memory_snapshot()
                   if tuple(segment["segment_pool_id"]) == pool_id})

settings_before = settings()
rows = [256, 1024, 2048, 4096, 8192]  # smallest first: the order that fragments plain segments
inputs = {n: torch.randn(n, 1024, device=device) for n in rows}
expected = {n: Mlp()(x) for n, x in inputs.items()}

all_shapes = graphed.GraphedForward(Mlp(), device=device, churn_limit=0)  # each at first sight
largest_alone = graphed.GraphedForward(Mlp(), device=device)
equal = True
with torch.no_grad():
    for n in rows:
        equal &= torch.equal(all_shapes(x=inputs[n]), expected[n])
    equal &= torch.equal(largest_alone(x=inputs[rows[-1]]), expected[rows[-1]])
    for n in rows:  # replays
        equal &= torch.equal(all_shapes(x=inputs[n]), expected[n])
torch.cuda.synchronize()
after = torch.empty(3 << 20, device=device)  # allocated after the captures, outside any window
after_segment = [s for s in torch.cuda.memory_snapshot()
                 if s["address"] <= after.data_ptr() < s["address"] + s["total_size"]][0]
print(json.dumps({
    "equal": bool(equal),
    "captures": all_shapes.stats()["captures"],
    "all_shapes": all_shapes.stats()["pool_reserved_bytes"],
    "largest_alone": largest_alone.stats()["pool_reserved_bytes"],
    "settings_before": settings_before,
    "settings_after": settings(),
    "after_is_expandable": bool(after_segment.get("is_expandable")),
    "ordinary_pool_expandable": expandable((0, 0)),
    "any_expandable": any(s.get("is_expandable") for s in torch.cuda.memory_snapshot()),
}))
"""


# What decides whether graphed's pools grow by expandable segments: the user's allocator settings
# and a distributed launch's variables (backends/cuda/gf_cuda_pool_growth.cpp).
_POOL_GROWTH_VARIABLES = (
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "WORLD_SIZE",
    "MASTER_ADDR",
)


def _pool_growth_child(**variables: str) -> dict:
    """Runs _POOL_GROWTH_CHILD in a fresh process (the allocator as a server starts it), with
    none of _POOL_GROWTH_VARIABLES set but `variables` (other tests of this process may have set
    some)."""
    environment = {
        name: value for name, value in os.environ.items() if name not in _POOL_GROWTH_VARIABLES
    }
    environment.update(variables)
    return _child_figures(_POOL_GROWTH_CHILD, environment)


@_gpu[0]
@_gpu[1]
def test_shapes_captured_smallest_first_reserve_about_the_largest_alone():
    """With the allocator as torch starts it, graphed's pools grow by expandable segments during
    its warm-ups and captures: five shapes captured smallest first reserve about what the largest
    takes alone (plain segments keep the small graphs' segments beside it), every replay equal to
    eager; after the captures the user's settings are back (empty) and a new allocation of the
    ordinary pool is a plain segment again."""
    figures = _pool_growth_child()
    assert figures["equal"] and figures["captures"] == 5, figures
    assert figures["any_expandable"], figures  # the graph pools' segments
    assert figures["all_shapes"] <= 1.1 * figures["largest_alone"] + 2**21, figures
    assert figures["settings_after"] == figures["settings_before"], figures
    assert figures["settings_after"] in (None, ""), figures
    assert not figures["after_is_expandable"], figures


@_gpu[0]
@_gpu[1]
@pytest.mark.parametrize(
    "variables",
    [
        {"PYTORCH_ALLOC_CONF": "expandable_segments:False"},
        {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"},
        {"WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"},
    ],
    ids=["user-said-false", "user-set-another-key", "distributed-launch"],
)
def test_a_user_setting_or_a_distributed_job_keeps_plain_segments(variables):
    """Where the user set the allocator (any key) or the process is part of a distributed job,
    graphed changes nothing: no segment of the process is expandable, the settings read as the
    user left them, and the replays are still equal to eager."""
    figures = _pool_growth_child(**variables)
    assert figures["equal"] and figures["captures"] == 5, figures
    assert figures["settings_after"] in (None, variables.get("PYTORCH_ALLOC_CONF", "")), figures
    assert not figures["after_is_expandable"], figures
    assert figures["ordinary_pool_expandable"] == [False], figures
    assert not figures["any_expandable"], figures
