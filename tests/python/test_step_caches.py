"""diffusers' step caches under graphed (graphed._step_caches): a transformer with
`enable_cache(config)` wrapped in a GraphedForward, or its pipeline through graph_pipeline, runs in
regions with each cached module graphed beneath its hook, and every step equals the same model run
eagerly with the same cache.

A tiny random FluxTransformer2DModel (2 double and 2 single blocks, fp32; nothing downloaded), and a
WanTransformer3DModel (2 blocks) with the same four caches (TaylorSeer naming Wan's attention
modules, which its default patterns miss), each in a 9-step loop whose next latents come from the
model's output, each call inside `cache_context("cond")` as the pipelines do, two requests with the
cache's state reset between them (`_reset_stateful_cache`), against an identical eager copy with the
same cache config. The caches: FirstBlockCache (decides by reading a device value, `.item()`),
MagCache (by its magnitude ratios, on the host), TaylorSeer and PyramidAttentionBroadcast (by a host
step counter). The CPU tests use the emulated backend, whose replays return what the capture wrote:
they check the routing (the runner in regions, each cached module a region beneath its hook, the
hooks still skipping) and the values of the first step; the GPU tests compare every step bitwise.
Skipped without diffusers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import graphed
import pytest
import torch
from _gpu import on_gpu
from graphed import GraphedForward

diffusers = pytest.importorskip("diffusers")
hooks = pytest.importorskip("diffusers.hooks")

STEPS, REQUESTS = 9, 2
pytestmark = [pytest.mark.filterwarnings("ignore:.*FluxPosEmbed:FutureWarning")]


class Timestep:
    """The timestep of the step in flight, for PyramidAttentionBroadcast's callback."""

    def __init__(self) -> None:
        self.value = 1000


# TaylorSeer's default patterns (matched whole, `re.fullmatch`) name Flux's attention modules
# ("transformer_blocks.0.attn") but none of Wan's ("blocks.0.attn1"): a Wan user names them.
TAYLORSEER_MODULES = {"Flux": None, "Wan": [r"^blocks\.\d+\.attn[12]$"]}


def _configs(clock: Timestep, kind: str = "Flux") -> dict[str, Callable[[], Any]]:
    return {
        "FirstBlockCache": lambda: hooks.FirstBlockCacheConfig(threshold=0.5),
        "TaylorSeer": lambda: hooks.TaylorSeerCacheConfig(
            cache_interval=2,
            disable_cache_before_step=2,
            max_order=1,
            cache_identifiers=TAYLORSEER_MODULES[kind],
        ),
        "MagCache": lambda: hooks.MagCacheConfig(
            threshold=0.5, num_inference_steps=STEPS, mag_ratios=[1.0] + [0.95] * (STEPS - 1)
        ),
        "PyramidAttentionBroadcast": lambda: hooks.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2,
            spatial_attention_timestep_skip_range=(-1, 1001),
            current_timestep_callback=lambda: clock.value,
        ),
    }


CACHES = list(_configs(Timestep()))


# The tiny Flux: two double-stream and two single-stream blocks, fp32.
FLUX = {"patch_size": 1, "in_channels": 4, "num_layers": 2, "num_single_layers": 2,
        "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 16,
        "pooled_projection_dim": 16, "axes_dims_rope": (4, 6, 6)}  # fmt: skip


def _flux(device: str) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(**FLUX).to(device).eval()


# What a pipeline makes before its denoising loop, made once per device here as FluxPipeline and
# WanPipeline make them (the prompt's embeddings and ids, the scheduler's timesteps on the device):
# a step's call then copies nothing from the host. A tensor made from a Python number at each step
# would be a copy from pageable memory, which waits for the device at every step; no pipeline does
# that, and it would hide the host's work of one step behind nothing.
_MADE_ONCE: dict[tuple[str, str], dict[str, torch.Tensor]] = {}


def _made_once(kind: str, device: torch.device) -> dict[str, torch.Tensor]:
    key = (kind, str(device))
    if key not in _MADE_ONCE:
        _MADE_ONCE[key] = _make(kind, device)
    return _MADE_ONCE[key]


def _make(kind: str, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(1)
    if kind == "Flux":
        return {
            "encoder_hidden_states": torch.randn(1, 6, 16, generator=generator, device=device),
            "pooled_projections": torch.randn(1, 16, generator=generator, device=device),
            "timesteps": torch.tensor([1.0 - step / STEPS for step in range(STEPS)]).to(device),
            "img_ids": torch.zeros(16, 3, device=device),
            "txt_ids": torch.zeros(6, 3, device=device),
        }
    return {
        "encoder_hidden_states": torch.randn(1, 6, 16, generator=generator, device=device),
        "timesteps": torch.tensor([1000 - 1000 * step // STEPS for step in range(STEPS)]).to(
            device
        ),
    }


def _assert_inputs_unchanged(kind: str, device: torch.device) -> None:
    """The inputs made once are shared by every run of the process: none may have written them."""
    assert (kind, str(device)) in _MADE_ONCE, f"no inputs were made for {kind} on {device}"
    fresh = _make(kind, device)
    for name, tensor in _made_once(kind, device).items():
        assert torch.equal(tensor, fresh[name]), f"{kind}'s {name} was written by a forward"


def _inputs(latents: torch.Tensor, step: int) -> dict:
    """What FluxPipeline passes its transformer: packed latents (a 4x4 grid of 4 channels), T5 and
    pooled CLIP embeddings, the timestep / 1000, image and text ids."""
    made = _made_once("Flux", latents.device)
    return {
        "hidden_states": latents,
        "encoder_hidden_states": made["encoder_hidden_states"],
        "pooled_projections": made["pooled_projections"],
        "timestep": made["timesteps"][step : step + 1],
        "img_ids": made["img_ids"],
        "txt_ids": made["txt_ids"],
        "return_dict": False,
    }


def _wan(device: str) -> torch.nn.Module:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )  # fmt: skip
    return model.to(device).eval()


def _wan_inputs(latents: torch.Tensor, step: int) -> dict:
    """What WanPipeline passes its transformer: video latents (2 frames of 8x8), UMT5 embeddings,
    the scheduler's timestep."""
    made = _made_once("Wan", latents.device)
    return {
        "hidden_states": latents,
        "encoder_hidden_states": made["encoder_hidden_states"],
        "timestep": made["timesteps"][step : step + 1],
        "return_dict": False,
    }


# Per transformer: its builder, its inputs from the step's latents, the latents' shape, and the
# caches it is run with.
MODELS = {
    "Flux": (_flux, _inputs, (1, 16, 4), CACHES),
    "Wan": (_wan, _wan_inputs, (1, 4, 2, 8, 8), CACHES),
}
CASES = [(model, cache) for model, (*_, caches) in MODELS.items() for cache in caches]


def _requests(
    model: Any,
    cached_model: torch.nn.Module,
    clock: Timestep,
    kind: str = "Flux",
    requests: int = REQUESTS,
) -> list[torch.Tensor]:
    """`requests` requests of STEPS steps through `model` (the cached model, or a GraphedForward
    of it), the cache reset between them; every step's output."""
    _, inputs, shape, _ = MODELS[kind]
    outputs = []
    device = next(cached_model.parameters()).device
    with torch.no_grad():
        for request in range(requests):
            generator = torch.Generator(device=device).manual_seed(request)
            latents = torch.randn(shape, generator=generator, device=device)
            for step in range(STEPS):
                clock.value = int(1000 * (1 - step / STEPS))
                with cached_model.cache_context("cond"):
                    output = model(**inputs(latents, step))[0]
                outputs.append(output)
                latents = latents - output / STEPS
            cached_model._reset_stateful_cache()
    return outputs


def _both(
    cache: str, device: str, backend: str | None, kind: str = "Flux"
) -> tuple[list, list, GraphedForward]:
    """Every step of the eager cached model and of a GraphedForward of an identical one."""
    build = MODELS[kind][0]
    clocks = Timestep(), Timestep()
    eager_model, graphed_model = build(device), build(device)
    eager_model.enable_cache(_configs(clocks[0], kind)[cache]())
    graphed_model.enable_cache(_configs(clocks[1], kind)[cache]())
    want = _requests(eager_model, eager_model, clocks[0], kind)
    gf = GraphedForward(graphed_model, device=device, backend=backend)
    got = _requests(gf, graphed_model, clocks[1], kind)
    _assert_inputs_unchanged(kind, next(graphed_model.parameters()).device)  # cuda:0, not cuda
    return got, want, gf


def _cached_paths(model: torch.nn.Module) -> list[str]:
    return [path for path, _ in graphed._step_caches.cached_modules(model)]


@pytest.mark.parametrize(("kind", "cache"), CASES)
def test_a_cached_transformer_runs_in_regions_graphed_beneath_its_hooks(
    kind, cache, emulated_backend
):
    got, want, gf = _both(cache, "cpu", emulated_backend, kind)
    stats = gf.stats()
    assert stats["disabled_cause"] == "step_cache", stats
    assert "step cache hooks" in stats["disabled_reason"]
    regions = {entry["path"]: entry for entry in gf.regions()}
    cached = _cached_paths(gf.module)
    assert cached and all(regions[path]["state"] == "graphed" for path in cached), regions
    # The hooks still decide: a skipping cache leaves some calls of its modules' graphs out.
    replays = [regions[path]["stats"]["replays"] for path in cached]
    calls = REQUESTS * STEPS
    assert all(0 < count + 1 <= calls for count in replays), replays
    assert any(count + 1 < calls for count in replays), f"{cache} skipped nothing: {replays}"
    # Modules above a cached one are never regions (their forward holds a hook's decision).
    above = graphed._step_caches.above_cached(gf.module)
    named = dict(gf.module.named_modules())
    assert not [path for path in regions if id(named[path]) in above]
    # The emulated replay returns what the capture wrote: values on the first step only.
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


@pytest.mark.parametrize(("kind", "cache"), CASES)
def test_the_reason_names_the_modules_whose_python_runs_eagerly_around_the_cached_ones(
    kind, cache, emulated_backend
):
    model = MODELS[kind][0]("cpu")
    model.enable_cache(_configs(Timestep(), kind)[cache]())
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    reason = gf.stats()["disabled_reason"]
    around = graphed._step_caches.looked_through(model)
    if cache in ("TaylorSeer", "PyramidAttentionBroadcast"):  # they hook attention modules
        blocks = [path for path, _ in model.named_modules() if path.count(".") == 1]
        assert around == [path for path in blocks if "blocks" in path], around
        # Whole: the reason fits the core's 511 bytes.
        assert reason.endswith(
            f"the modules around them ('{around[0]}' and {len(around) - 1} more) run their own "
            "Python eagerly, so on a launch-bound model graphs without the cache may be faster "
            "(docs/api.md, 'Step caches')"
        ), reason
    else:  # whole blocks are hooked: only containers (nn.ModuleList) are above them
        assert around == []
        assert reason.endswith("each cached module's own forward graphed beneath its hook"), reason
    assert reason.startswith("the forward carries diffusers' step cache hooks ("), reason


def test_a_reason_with_names_too_long_for_the_core_says_counts_instead():
    deep = "model." * 60  # a cached module 360 characters deep
    cached = [(f"{deep}blocks.{index}.attn", "taylorseer_cache") for index in range(3)]
    around = [f"{deep}blocks.{index}" for index in range(3)]
    reason = graphed._step_caches.reason(cached, around)
    assert len(reason.encode()) <= 511, len(reason.encode())
    assert "step cache hooks (on 3 modules)" in reason, reason
    assert "the 3 modules around them run their own Python eagerly" in reason, reason
    assert deep not in reason
    short = graphed._step_caches.reason([("blocks.0.attn", "taylorseer_cache")], ["blocks.0"])
    assert "(taylorseer_cache on 'blocks.0.attn')" in short, short
    assert "the modules around them ('blocks.0') run" in short, short


def test_a_hook_graphed_cannot_go_beneath_keeps_the_runner_eager_with_its_name(
    emulated_backend,
):
    from diffusers.hooks import HookRegistry, ModelHook

    class Doubles(ModelHook):
        def post_forward(self, module, output):
            return output * 2

    model = _flux("cpu")
    HookRegistry.check_if_exists_or_initialize(model.norm_out).register_hook(Doubles(), "doubles")
    gf = GraphedForward(model, device="cpu", backend=emulated_backend)
    stats = gf.stats()
    assert stats["disabled_cause"] == "watch", stats
    reason = stats["disabled_reason"]
    assert "doubles hook(s) on 'norm_out'" in reason and "remove those hooks" in reason, reason
    assert "pipe.to(device)" not in reason, "the offload advice is for offload hooks only"


@on_gpu
@pytest.mark.parametrize(("kind", "cache"), CASES)
def test_every_step_equals_eager_with_the_same_cache_bitwise_on_the_gpu(kind, cache):
    got, want, gf = _both(cache, "cuda", None, kind)
    for index, (step, eager) in enumerate(zip(got, want, strict=True)):
        where = f"{kind}, {cache}: request {index // STEPS}, step {index % STEPS}"
        assert torch.equal(step, eager), where
    regions = {entry["path"]: entry for entry in gf.regions()}
    for path in _cached_paths(gf.module):
        assert regions[path]["state"] == "graphed", regions[path]
        # A cache may skip a module at every call after its capture (Wan's second block here).
        assert regions[path]["stats"]["captures"] == 1, regions[path]


# -- through the pipeline's own call ---------------------------------------------------------------

PIPELINE_CACHES = ["FirstBlockCache", "TaylorSeer"]
PIPELINE_STEPS = 6


def _pipelines(cache: str, order: str, device: str, backend: str | None) -> tuple:
    """An eager FluxPipeline with `cache` and an identical one graphed (graph_pipeline before or
    after enable_cache, as `order` says); each one's images of two calls, and the runner."""
    pipelines = pytest.importorskip("test_diffusers_pipelines")
    images = []
    for graphed_one in (False, True):
        pipe, call = pipelines._build("flux", device=device)
        runner = None
        if graphed_one and order == "graph_pipeline first":
            runner = graphed.graph_pipeline(pipe, device=device, backend=backend)["transformer"]
        pipe.transformer.enable_cache(_configs(Timestep())[cache]())
        if graphed_one and order == "enable_cache first":
            runner = graphed.graph_pipeline(pipe, device=device, backend=backend)["transformer"]
        images.append([pipelines._run(pipe, call, steps=PIPELINE_STEPS) for _ in range(2)])
    return images[1], images[0], runner


@pytest.mark.parametrize("order", ["enable_cache first", "graph_pipeline first"])
@pytest.mark.parametrize("cache", PIPELINE_CACHES)
def test_a_cached_pipeline_runs_its_transformer_in_regions(cache, order, emulated_backend):
    got, want, runner = _pipelines(cache, order, "cpu", emulated_backend)
    assert runner.stats()["disabled_cause"] == "step_cache", runner.stats()
    states = {entry["path"]: entry["state"] for entry in runner.regions()}
    assert all(states[path] in ("graphed", "pending") for path in _cached_paths(runner.module))
    assert [image.shape for image in got] == [image.shape for image in want]


@on_gpu
@pytest.mark.parametrize("order", ["enable_cache first", "graph_pipeline first"])
@pytest.mark.parametrize("cache", PIPELINE_CACHES)
def test_a_cached_pipelines_images_equal_eagers_bitwise_on_the_gpu(cache, order):
    got, want, runner = _pipelines(cache, order, "cuda", None)
    for index, (image, eager) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(image, eager), f"{cache}, {order}: call {index}"
    assert any(entry["state"] == "graphed" for entry in runner.regions()), runner.regions()


def test_graph_regions_removed_after_the_cache_is_disabled_leaves_no_region(emulated_backend):
    """diffusers' disable_cache puts the end of a block's hook chain (graphed's region beneath
    the hook) back as the block's forward; remove() takes it out from there too."""
    model = _flux("cpu")
    model.enable_cache(_configs(Timestep())["FirstBlockCache"]())
    block = model.transformer_blocks[1]
    regions = graphed.graph_regions(
        model, blocks=["FluxTransformerBlock"], device="cpu", backend=emulated_backend
    )
    model.disable_cache()
    regions.remove()
    assert "forward" not in vars(block), vars(block).get("forward")


# -- a cached transformer whose blocks are compiled ------------------------------------------------

# diffusers' hooks call functions torch.compile may not trace (`torch.compiler.disable`d), so a
# cached model is compiled with graph breaks allowed (fullgraph=True fails without graphed too).
COMPILED_CACHES = ["FirstBlockCache", "TaylorSeer"]


def _both_compiled(cache: str, device: str, backend: str | None, compiler: Any) -> tuple:
    """_both, with each model's repeated blocks compiled in place after its cache is enabled (the
    order diffusers documents), by `compiler` (a torch.compile backend)."""
    clocks = Timestep(), Timestep()
    eager_model, graphed_model = _flux(device), _flux(device)
    for model, clock in zip((eager_model, graphed_model), clocks, strict=True):
        model.enable_cache(_configs(clock)[cache]())
        model.compile_repeated_blocks(backend=compiler, fullgraph=False, dynamic=False)
    want = _requests(eager_model, eager_model, clocks[0])
    gf = GraphedForward(graphed_model, device=device, backend=backend)
    got = _requests(gf, graphed_model, clocks[1])
    return got, want, gf


def _graphed_code_compiled() -> list[str]:
    """The functions of graphed's own files Dynamo has met as frames in this process (its record
    of the code objects it compiled)."""
    seen = getattr(torch._dynamo.convert_frame, "input_codes", None)
    if seen is None:
        pytest.skip(f"torch {torch.__version__}'s Dynamo keeps no record of the frames it met")
    package = str(Path(graphed.__file__).parent)
    codes = (ref() for ref in seen.seen)
    return [
        f"{code.co_filename}:{code.co_name}"
        for code in codes
        if code is not None and code.co_filename.startswith(package)
    ]


def _assert_blocks_run_compiled(gf: GraphedForward) -> None:
    """No region inside a compiled block; the regions around them graphed and replayed; none of
    graphed's code traced by the compiler; the reason names the compiled blocks."""
    stats = gf.stats()
    assert stats["disabled_cause"] == "step_cache", stats
    assert (
        "compiled modules holding them ('transformer_blocks.0' and " in stats["disabled_reason"]
    ), stats["disabled_reason"]
    regions = {entry["path"]: entry for entry in gf.regions()}
    assert regions and not [path for path in regions if "blocks." in path], regions
    for path, entry in regions.items():
        assert entry["state"] == "graphed" and entry["stats"]["replays"] > 0, (path, entry)
    assert _graphed_code_compiled() == []


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("cache", COMPILED_CACHES)
def test_a_cached_transformer_with_compiled_blocks_runs_them_compiled(cache, emulated_backend):
    """A compiled block that carries a step cache (FirstBlockCache) or holds one (TaylorSeer's
    attention modules) runs its compiled code as it does without graphed: graphed places no
    region inside it, where the compiler would trace graphed's own code; the regions around the
    blocks are graphed and replay, and the first step equals the compiled model's."""
    from _compiling import CompilingBackend

    got, want, gf = _both_compiled(cache, "cpu", emulated_backend, CompilingBackend())
    _assert_blocks_run_compiled(gf)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


@on_gpu
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("cache", COMPILED_CACHES)
def test_a_cached_transformer_with_compiled_blocks_equals_compile_alone_on_the_gpu(cache):
    """Inductor's blocks and a step cache: every step equals the same compiled, cached model run
    without graphed, bitwise."""
    got, want, gf = _both_compiled(cache, "cuda", None, "inductor")
    for index, (step, alone) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(step, alone), f"{cache}: request {index // STEPS}, step {index % STEPS}"
    _assert_blocks_run_compiled(gf)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("how", ["compile in place", "torch.compile"])
def test_a_cached_transformer_compiled_whole_runs_compiled_with_no_region(how, emulated_backend):
    """The whole transformer compiled around its caches: no region anywhere inside the compiled
    frame, the runner runs the compiled model as compile alone does, and its reason says why and
    what to do instead."""
    from _compiling import CompilingBackend

    clock = Timestep()
    model = _flux("cpu")
    model.enable_cache(_configs(clock)["FirstBlockCache"]())
    options = {"backend": CompilingBackend(), "fullgraph": False, "dynamic": False}
    if how == "torch.compile":
        called = torch.compile(model, **options)
    else:
        model.compile(**options)
        called = model
    # The same compiled model alone, then through graphed (its compiled frames compile once).
    want = _requests(called, model, clock, requests=1)
    gf = GraphedForward(called, device="cpu", backend=emulated_backend)
    got = _requests(gf, model, clock, requests=1)
    stats = gf.stats()
    assert stats["disabled_cause"] == "step_cache", stats
    assert "the module is compiled around them" in stats["disabled_reason"], stats
    assert "compile_repeated_blocks" in stats["disabled_reason"], stats
    assert gf.regions() == []
    assert _graphed_code_compiled() == []
    for index, (step, alone) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(step, alone, rtol=0, atol=0, msg=f"call {index}")
