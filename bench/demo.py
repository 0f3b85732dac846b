"""The graphed demo: a small DiT-like model (bench/dit_model.py) run eager and through
graphed.GraphedForward, checked for equal results, timed, and its stats printed.

It exists to show in one command what graphed does and what it buys: on a CUDA machine, the
median milliseconds per forward eager and replayed from a captured graph, and the speedup; on a
machine with no GPU it runs on the CPU, says that graphs are unavailable and why (from
graphed.backend()), and times eager only. Run it through `bash scripts/demo.sh`.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import graphed  # noqa: E402
from dit_model import DiT, DiTConfig, make_inputs  # noqa: E402

# Sizes per device: launch-bound on a GPU, a few seconds in all on a CPU.
_SIZES = {
    "cuda": dict(blocks=6, dim=384, heads=6, rows=256, batch=2, repeats=20, calls=20),
    "cpu": dict(blocks=2, dim=128, heads=4, rows=32, batch=1, repeats=7, calls=5),
}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cuda, cpu")
    for name in ("blocks", "dim", "heads", "rows", "batch", "repeats", "calls"):
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument(
        "--ref-tail",
        type=int,
        default=8,
        help="rows of the reference tail of the second input shape (0: none)",
    )
    return parser.parse_args()


def _median_ms(
    fn: Callable[..., object], kwargs: dict, repeats: int, calls: int, sync: Callable[[], None]
) -> float:
    """Median over `repeats` of the mean milliseconds of `calls` back-to-back forwards."""
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn(**kwargs)
        sync()
        samples.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(samples)


def main() -> int:
    args = _parse_args()
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    sizes = dict(_SIZES["cuda" if device.type == "cuda" else "cpu"])
    for name in sizes:
        if getattr(args, name) is not None:
            sizes[name] = getattr(args, name)
    repeats, calls = sizes.pop("repeats"), sizes.pop("calls")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = DiTConfig(**sizes, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    backend_name, backend_reason = graphed.backend()
    print(f"torch {torch.__version__}, device {device}, dtype {str(dtype).removeprefix('torch.')}")
    print(f"graphed backend: {backend_name} ({backend_reason})")
    print(
        f"model: DiT, {cfg.blocks} blocks, dim {cfg.dim}, {cfg.heads} heads, "
        f"{cfg.batch}x{cfg.rows} tokens, prompt {cfg.prompt_rows} tokens"
    )

    torch.manual_seed(0)
    model = DiT(cfg)
    generator = torch.Generator().manual_seed(1)
    first = make_inputs(cfg, generator=generator)
    rope = first["rope"]
    second = make_inputs(cfg, rope=rope, generator=generator)  # same shapes, new values
    shapes = [first, second]
    if args.ref_tail:
        shapes.append(make_inputs(cfg, ref_tail_rows=args.ref_tail, rope=rope, generator=generator))

    logging.getLogger("graphed").setLevel(logging.ERROR)  # the demo says it below, once
    gf = graphed.GraphedForward(model, device=device, name="dit-demo")
    stats = gf.stats()
    graphs = stats["enabled"] and not stats["disabled_reason"]
    if not graphs:
        print(f"GRAPHS UNAVAILABLE: {stats['disabled_reason'] or backend_reason}")
        print("graphed calls run eager here; only the eager timing is meaningful.")

    # Results: each input set twice (capture, then replay), compared with the eager module.
    # Replays run the captured kernels, so differences are at most a few ulps of the dtype.
    rtol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    worst = scale = 0.0
    with torch.no_grad():
        for kwargs in (*shapes, *shapes):
            expected = model(**kwargs).float()
            got = gf(**kwargs).float()
            worst = max(worst, (got - expected).abs().max().item())
            scale = max(scale, expected.abs().max().item(), 1.0)
    ok = worst <= rtol * scale
    print(
        f"graphed vs eager: max abs difference {worst:.3g} "
        f"({'ok' if ok else 'MISMATCH'}, tolerance {rtol * scale:.3g})"
    )

    with torch.no_grad():
        eager_ms = _median_ms(model, first, repeats, calls, sync)
    print(f"eager:   {eager_ms:8.3f} ms per forward (median of {repeats} x {calls} calls)")
    if graphs:
        graphed_ms = _median_ms(gf, first, repeats, calls, sync)
        print(f"graphed: {graphed_ms:8.3f} ms per forward (median of {repeats} x {calls} calls)")
        print(f"speedup: {eager_ms / graphed_ms:.2f}x")

    print("gf.stats():")
    for key, value in gf.stats().items():
        print(f"  {key}: {value}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
