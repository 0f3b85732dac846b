"""The sequence-parallel benchmark: bench/sp_dit.py's DiT across two GPUs, eager against
GraphedForward(group=...), with the same DiT on one GPU beside it.

    PYTHONPATH=python:bench python bench/sp_bench.py --out DIR [--rows 1024] [--rounds 30]

Each rank times, in turns, one eager forward and one graphed forward (both run the same
collectives, so the ranks stay in step): wall milliseconds between two synchronizes, and the host
time the call took before returning (the rank's host cost). It checks that the graphed output is
bitwise the eager one first. Then the parent times the one-GPU model with the whole sequence.
Writes DIR/sp_results.json and prints a table; needs two CUDA devices (else it says so, exits 0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import graphed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sp_dit import SequenceParallelDiT, SPConfig, make_sp_inputs  # noqa: E402
from timing import choose_host_clock, wall_ms_interleaved  # noqa: E402

WORLD = 2


def _measure(config: SPConfig, group, world: int, rank: int, rounds: int) -> dict:
    """eager and graphed on this rank: wall ms per forward and host ms per call (medians)."""
    torch.manual_seed(0)
    module = SequenceParallelDiT(config, group).to(device=config.device, dtype=config.dtype)
    module = module.eval()
    gf = graphed.GraphedForward(module, device=config.device, group=group, name="sp_dit")
    request = make_sp_inputs(config, world, rank, call=1)
    with torch.no_grad():
        eager_out = module(**request)
    graphed_out = gf(**request)  # captures
    graphed_out = gf(**request)  # replays
    bitwise = torch.equal(graphed_out, eager_out)

    def eager() -> None:
        with torch.no_grad():
            module(**request)

    def graphed_call() -> None:
        gf(**request)

    sync = torch.cuda.synchronize
    timed = wall_ms_interleaved(
        {"eager": eager, "graphed": graphed_call},
        sync,
        choose_host_clock(),
        rounds=rounds,
        warmup_rounds=3,
    )
    stats = gf.stats()
    return {
        "rank": rank,
        "bitwise_equal": bitwise,
        "enabled": stats["enabled"],
        "captures": stats["captures"],
        "eager_ms": timed["eager"]["wall_ms"]["median"],
        "graphed_ms": timed["graphed"]["wall_ms"]["median"],
        "graphed_host_us": 1e3 * timed["graphed"]["host_ms"]["median"],
        "eager_host_us": 1e3 * timed["eager"]["host_ms"]["median"],
    }


def _rank(rank: int, port: int, rows: int, rounds: int, out: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        config = SPConfig(rows=rows, dtype=torch.bfloat16, device=f"cuda:{rank}")
        result = _measure(config, dist.group.WORLD, WORLD, rank, rounds)
        Path(out, f"sp_rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=1024, help="tokens of the whole sequence")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if torch.cuda.device_count() < WORLD:
        print(f"sp_bench: skipped, needs {WORLD} CUDA devices, found {torch.cuda.device_count()}")
        return 0
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(
        _rank, args=(port, args.rows, args.rounds, str(args.out)), nprocs=WORLD, join=True
    )
    ranks = [json.loads(Path(args.out, f"sp_rank{r}.json").read_text()) for r in range(WORLD)]
    one_gpu = SPConfig(rows=args.rows, dtype=torch.bfloat16, device="cuda:0")
    single = _measure(one_gpu, None, 1, 0, args.rounds)
    results = {
        "model": {"blocks": one_gpu.blocks, "dim": one_gpu.dim, "heads": one_gpu.heads},
        "rows": args.rows,
        "dtype": "bfloat16",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "ranks": ranks,
        "one_gpu": single,
    }
    Path(args.out, "sp_results.json").write_text(json.dumps(results, indent=2))
    print(f"sequence-parallel DiT, {args.rows} tokens, bf16, {torch.cuda.get_device_name(0)}")
    print("| run | eager ms | graphed ms | speed-up | graphed host us | bitwise | captures |")
    print("|---|---|---|---|---|---|---|")
    for label, row in [(f"SP rank {r['rank']} of 2", r) for r in ranks] + [("one GPU", single)]:
        print(
            f"| {label} | {row['eager_ms']:.3f} | {row['graphed_ms']:.3f} | "
            f"{row['eager_ms'] / row['graphed_ms']:.1f}x | {row['graphed_host_us']:.1f} | "
            f"{row['bitwise_equal']} | {row['captures']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
