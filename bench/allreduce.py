"""Allreduce bandwidth: Hora against torch.distributed's gloo backend, side by side.

Both run 2 ranks on this host, launched the same way (one subprocess per
rank, rendezvous on 127.0.0.1), in the same run, float32 sum, in place.
For each size: median time, bus bandwidth (2(n-1)/n * bytes / time) and the
ratio of Hora's bandwidth to gloo's.

    python bench/allreduce.py [--quick] [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from _peers import human, median_time, run_peer

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def _iterations(nbytes: int, quick: bool) -> int:
    budget = 0.3 if quick else 1.5  # seconds of data movement per size, roughly
    estimate = max(nbytes / 0.5e9, 50e-6)
    return int(min(max(budget / estimate, 5), 2000))


def _worker(kind: str, sizes: list[int], quick: bool) -> None:
    import numpy as np

    if kind == "hora":
        import hora

        hora.init()
        rank = hora.rank()

        def run(buffer: np.ndarray) -> None:
            hora.allreduce_(buffer, op=hora.Sum)

        def sync() -> None:
            hora.barrier()
    else:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()

        def run(buffer: np.ndarray) -> None:
            dist.all_reduce(torch.from_numpy(buffer))

        def sync() -> None:
            dist.barrier()

    results = {}
    for nbytes in sizes:
        buffer = np.ones(nbytes // 4, dtype=np.float32)
        results[nbytes] = median_time(lambda buffer=buffer: run(buffer), _iterations(nbytes, quick), sync)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    if kind == "gloo":
        sync()
        dist.destroy_process_group()


def _run_peer(kind: str, ranks: int, sizes: list[int], quick: bool) -> dict[int, float]:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--sizes", ",".join(map(str, sizes))]
    if quick:
        argv.append("--quick")
    return {int(k): v for k, v in run_peer(kind, ranks, argv).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations, sizes up to 16 MiB")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--worker", choices=["hora", "gloo"], help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, [int(s) for s in args.sizes.split(",")], args.quick)
        return
    sizes = [s for s in SIZES if not args.quick or s <= 16 << 20]
    hora_times = _run_peer("hora", args.ranks, sizes, args.quick)
    gloo_times = _run_peer("gloo", args.ranks, sizes, args.quick)
    factor = 2 * (args.ranks - 1) / args.ranks
    print(f"allreduce float32 sum, {args.ranks} ranks on one host, median of many; busbw = 2(n-1)/n*bytes/time")
    print(f"{'size':>9} | {'hora ms':>9} | {'gloo ms':>9} | {'hora GB/s':>9} | {'gloo GB/s':>9} | {'hora/gloo':>9}")
    print("-" * 69)
    for nbytes in sizes:
        h, g = hora_times[nbytes], gloo_times[nbytes]
        print(
            f"{human(nbytes):>9} | {h * 1e3:9.3f} | {g * 1e3:9.3f} | {factor * nbytes / h / 1e9:9.3f} | "
            f"{factor * nbytes / g / 1e9:9.3f} | {g / h:9.2f}"
        )


if __name__ == "__main__":
    main()
