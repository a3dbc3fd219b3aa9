"""Training throughput with Hora's DistributedOptimizer against torch DDP (gloo), side by side in one run.

For each model (a 784-1024-1024-10 MLP and a small CNN), batch 64 per rank,
``torch.set_num_threads(1)`` in every process, samples/s of:

- 1 process, no distribution;
- 2 processes with Hora (DistributedOptimizer, through horarun);
- 2 processes with torch DistributedDataParallel over gloo;
- 2 processes that exchange no gradients at all (the ceiling of this machine);
- 2 processes that exchange no gradients but wait for each other every step
  (``hora.barrier``): what synchronous training costs before any byte moves,
  since every step then lasts as long as the slower rank's (the two cores
  differ, and a noisy step on either delays both).

Scaling efficiency = samples/s / (2 x one process's); the last column is
each way's share of the no-exchange ceiling. With ``--repeat N`` every way
runs N times, the ways in turn, and each ratio is the median of the
repeats' ratios (range in brackets): see ``_peers.alternate``.

    python bench/torch_training.py [--quick] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from _peers import alternate, run_peer, training_rows

BATCH = 64
MODELS = ("mlp", "cnn")


def build(name: str):
    import torch

    if name == "mlp":
        layers = [torch.nn.Flatten(), torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)]
        return torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Linear(1024, 10)), (1, 28, 28)
    layers = [torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
    layers += [torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64 * 8 * 8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)), (
        3,
        32,
        32,
    )


def _worker(way: str, model_name: str, steps: int, rounds: int) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, shape = build(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = int(os.environ.get("RANK", "0"))
    finish = None
    if way == "hora":
        import hora.torch as hvd

        hvd.init()
        rank = hvd.rank()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    elif way == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)

        def finish() -> None:
            dist.barrier()
            dist.destroy_process_group()
    elif way == "barrier":
        import hora

        hora.init()
        rank = hora.rank()

    data, target = torch.randn(BATCH, *shape), torch.randint(0, 10, (BATCH,))

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(data), target).backward()
        if way == "barrier":
            hora.barrier()
        optimizer.step()

    for _ in range(5):
        step()
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        rates.append(BATCH * steps / (time.perf_counter() - start))
    if rank == 0:
        print("RESULT " + json.dumps(sorted(rates)[len(rates) // 2]), flush=True)
    if finish is not None:
        finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    parser.add_argument("--repeat", type=int, default=1, help="run every way this many times, in turn (default 1)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps, rounds = (10, 3) if args.quick else (30, 5)
    if args.worker:
        _worker(args.worker[0], args.worker[1], args.steps, args.rounds)
        return
    started = time.monotonic()
    print(f"batch {BATCH} per rank, 1 torch thread per process, {os.cpu_count()} cores; load average before: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))  # fmt: skip
    print()
    print("| model | way | processes | samples/s | scaling efficiency | share of the ceiling |")
    print("|---|---|---|---|---|---|")
    for model in MODELS:

        def run(way: str, ranks: int, kind: str, model: str = model) -> float:
            argv = [sys.executable, os.path.abspath(__file__), "--worker", way, model, "--steps", str(steps),
                    "--rounds", str(rounds)]  # fmt: skip
            return float(run_peer(kind, ranks, argv))

        ways = {
            "one process": lambda run=run: run("none", 1, "gloo"),
            "hora": lambda run=run: 2 * run("hora", 2, "hora"),
            "torch DDP (gloo)": lambda run=run: 2 * run("ddp", 2, "gloo"),
            "no exchange": lambda run=run: 2 * run("none", 2, "gloo"),
            "barrier only": lambda run=run: 2 * run("barrier", 2, "hora"),
        }
        results = alternate(ways, args.repeat)
        processes = {way: 1 if way == "one process" else 2 for way in ways}
        for cells in training_rows(results, "one process", "no exchange", processes):
            print("| " + " | ".join([model, *cells]) + " |", flush=True)
    print()
    print(
        f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; took {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
