"""Tensor fusion: many small gradients per step, Hora against torch.distributed gloo, side by side.

Each step allreduces 200 float32 tensors of 1,000 elements (sum, in place),
the way a framework hands over gradients: submitted one by one without
waiting, then all waited for. Five ways, 2 ranks on this host, same run:

- hora fused: ``allreduce_async_`` per tensor; the engine fuses them.
- hora burst: the 200 tensors in one call (``grouped_allreduce_async_``),
  which crosses into the engine once: how a framework adapter hands over a
  burst of ready gradients.
- hora unfused: the same as hora fused with fusion off (``HORA_FUSION_THRESHOLD=0``).
- gloo one by one: ``all_reduce(async_op=True)`` per tensor, then wait all.
- gloo flattened: the tensors copied into one buffer by hand, one
  ``all_reduce``, copied back (what fusion saves the user from writing).

Reports the median step time and each way's time relative to hora fused.

    python bench/fusion.py [--quick] [--ranks 2] [--tensors 200] [--elements 1000]
"""

from __future__ import annotations

import argparse
import os
import sys

from _peers import median_time, run_peer


def _worker(kind: str, tensors: int, elements: int, steps: int) -> None:
    import json

    import numpy as np

    if kind.startswith("hora"):
        import hora

        hora.init()
        rank = hora.rank()
        arrays = [np.ones(elements, dtype=np.float32) for _ in range(tensors)]

        def step() -> None:
            handles = [hora.allreduce_async_(a, name=f"grad.{i}", op=hora.Sum) for i, a in enumerate(arrays)]
            for handle in handles:
                hora.synchronize(handle)

        def burst() -> None:
            hora.synchronize(hora.grouped_allreduce_async_(arrays, name="grads", op=hora.Sum))

        sync = hora.barrier
        modes = {kind: step, "hora burst": burst} if kind == "hora fused" else {kind: step}
    else:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        grads = [torch.ones(elements) for _ in range(tensors)]
        flat = torch.empty(tensors * elements)

        def one_by_one() -> None:
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for work in works:
                work.wait()

        def flattened() -> None:
            torch.cat(grads, out=flat)
            dist.all_reduce(flat)
            for g, piece in zip(grads, flat.split(elements), strict=True):
                g.copy_(piece)

        sync = dist.barrier
        modes = {"gloo one by one": one_by_one, "gloo flattened": flattened}

    results = {}
    for mode, step_fn in modes.items():
        results[mode] = median_time(step_fn, steps, sync)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    if kind == "gloo":
        sync()
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--elements", type=int, default=1000)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (20 if args.quick else 100)
    if args.worker:
        _worker(args.worker, args.tensors, args.elements, steps)
        return

    def argv(kind: str) -> list[str]:
        script = os.path.abspath(__file__)
        shape = ["--tensors", str(args.tensors), "--elements", str(args.elements), "--steps", str(steps)]
        return [sys.executable, script, "--worker", kind, *shape]

    results: dict[str, float] = {}
    results.update(run_peer("hora", args.ranks, argv("hora fused")))
    results.update(run_peer("hora", args.ranks, argv("hora unfused"), env={"HORA_FUSION_THRESHOLD": "0"}))
    results.update(run_peer("gloo", args.ranks, argv("gloo")))
    fused = results["hora fused"]
    total = args.tensors * args.elements * 4
    print(
        f"{args.tensors} float32 tensors x {args.elements} elements ({total / 2**20:.2f} MiB) per step, "
        f"allreduce sum, {args.ranks} ranks on one host, median of {steps} steps"
    )
    print(f"{'way':>16} | {'step ms':>9} | {'us/tensor':>9} | {'time / hora fused':>17}")
    print("-" * 62)
    for mode in ("hora fused", "hora burst", "hora unfused", "gloo one by one", "gloo flattened"):
        t = results[mode]
        print(f"{mode:>16} | {t * 1e3:9.3f} | {t * 1e6 / args.tensors:9.2f} | {t / fused:17.2f}")


if __name__ == "__main__":
    main()
