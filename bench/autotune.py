"""Autotune against hand-picked settings, side by side in one run.

Two workloads, 2 ranks on this host:

- 200 tensors: each step allreduces 200 float32 tensors of 1,000 elements
  one by one (``allreduce_async_``, then synchronize), as bench/fusion.py;
- MLP: a training step of bench/torch_training.py's 784-1024-1024-10 MLP
  with DistributedOptimizer, batch 64 per rank.

For each workload: the median step time under each hand-picked setting
(fusion threshold x cycle time), then under ``HORA_AUTOTUNE=1`` after the
autotuner has finished (the first steps are its trials; the job keeps the
parameters it settled on), with the parameters it chose. The last column is
the autotuned step time over the best hand-picked one: the goal is at most
1.10.

    python bench/autotune.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from _peers import median_time, run_peer

HAND_PICKED = [(fusion, cycle) for fusion in (0, 4, 64) for cycle in (1.0, 5.0)]  # (MiB, ms)
WORKLOADS = ("200 tensors", "mlp")


def _worker(workload: str, tuning_steps: int, steps: int) -> None:
    import hora

    if workload == "mlp":
        import hora.torch as hvd
        import torch
        from torch_training import BATCH, build

        torch.set_num_threads(1)
        torch.manual_seed(0)
        hvd.init()
        model, shape = build("mlp")
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
        )
        data, target = torch.randn(BATCH, *shape), torch.randint(0, 10, (BATCH,))

        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()

    else:
        import numpy as np

        hora.init()
        arrays = [np.ones(1000, dtype=np.float32) for _ in range(200)]

        def step() -> None:
            handles = [hora.allreduce_async_(a, name=f"grad.{i}", op=hora.Sum) for i, a in enumerate(arrays)]
            for handle in handles:
                hora.synchronize(handle)

    for _ in range(tuning_steps):  # the autotuner's trials, or a warm-up
        step()
    seconds = median_time(step, steps, hora.barrier)
    tuned = hora.basics.current_job().engine.parameters
    if hora.rank() == 0:
        chosen = {"fusion_mib": tuned.fusion_threshold_bytes / 2**20, "cycle_ms": tuned.cycle_time_ms,
                  "cache": tuned.cache_enabled}  # fmt: skip
        print("RESULT " + json.dumps({"seconds": seconds, "parameters": chosen}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer measured steps")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tuning-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.tuning_steps, args.steps)
        return
    # The autotuner's defaults: 3 warm-up samples, then 12 trials (5 fusion thresholds, 5 cycle times, cache on
    # and off) of 3 samples, each of 10 steps and the step that ends it: 429 steps, and some margin.
    tuning_steps = 500
    steps = 30 if args.quick else 100
    started = time.time()
    load = os.getloadavg()
    print(f"2 ranks on one host; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print()
    print("| workload | setting | step ms | fusion MiB | cycle ms | cache | / best hand-picked |")
    print("|---|---|---|---|---|---|---|")
    script = os.path.abspath(__file__)
    for workload in WORKLOADS:

        def argv(warm: int, workload: str = workload) -> list[str]:
            return [sys.executable, script, "--worker", workload, "--tuning-steps", str(warm), "--steps", str(steps)]

        picked = {}
        for fusion, cycle in HAND_PICKED:
            env = {"HORA_FUSION_THRESHOLD": str(fusion * 2**20), "HORA_CYCLE_TIME": str(cycle)}
            picked[(fusion, cycle)] = run_peer("hora", 2, argv(20), env=env)
        tuned = run_peer("hora", 2, argv(tuning_steps), env={"HORA_AUTOTUNE": "1"})
        best = min(result["seconds"] for result in picked.values())
        rows = [(f"fusion {f} MiB, cycle {c} ms", r) for (f, c), r in picked.items()] + [("autotuned", tuned)]
        for name, result in rows:
            p = result["parameters"]
            print(f"| {workload} | {name} | {result['seconds'] * 1e3:.3f} | {p['fusion_mib']:g} | {p['cycle_ms']:g} | "
                  f"{'on' if p['cache'] else 'off'} | {result['seconds'] / best:.2f} |")  # fmt: skip
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; took {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
