"""Overheads of hora.ray on a local Ray (2 CPUs): starting an executor, and a trial of a Tune sweep.

1. Seconds to start a 2-worker RayExecutor (placement group, actors, Hora
   rendezvous) and run a trivial function with one allreduce, then shut it
   down; median of the repeats, after one warm-up.
2. Seconds per trial of a 4-trial sweep whose trials are 2-worker Hora jobs
   running that same trivial function (wall time of ``Tuner.fit`` / 4, with
   up to 2 trials at a time).

    python bench/ray_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def trivial() -> float:
    import hora
    import numpy as np

    return float(hora.allreduce(np.array([1.0]), op=hora.Sum)[0])


def trial(config: dict) -> None:
    import hora.ray.tune

    hora.ray.tune.report({"value": trivial()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from hora.ray import RayExecutor
    from hora.ray.tune import distributed_trainable
    from ray import tune

    print(f"{os.cpu_count()} cores; load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    times = []
    for repeat in range(1 + (3 if args.quick else 7)):
        started = time.perf_counter()
        with RayExecutor(num_workers=2, cpus_per_worker=0.5) as executor:
            assert executor.run(trivial) == [2.0, 2.0]
        if repeat:  # the first is a warm-up
            times.append(time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as directory:
        tuner = tune.Tuner(
            distributed_trainable(trial, num_workers=2, cpus_per_worker=0.25),
            param_space={"i": tune.grid_search([0, 1, 2, 3])},
            run_config=tune.RunConfig(verbose=0, storage_path=directory),
        )
        started = time.perf_counter()
        results = tuner.fit()
        sweep = time.perf_counter() - started
    assert not results.errors
    ray.shutdown()
    print("\n| what (local Ray, 2 CPUs, 2 workers) | seconds |")
    print("|---|---|")
    start = statistics.median(times)
    print(f"| start a RayExecutor, run a function with one allreduce, shut down (median) | {start:.2f} |")
    print(f"| one trial of a 4-trial Tune sweep of 2-worker jobs (sweep time / 4) | {sweep / 4:.2f} |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
