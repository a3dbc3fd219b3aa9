"""A Ray Tune learning-rate sweep whose trials are 2-worker Hora jobs, on scikit-learn's digits.

    python examples/ray/tune_sweep.py [--num-cpus 2] [--epochs 6]

Four trials (a grid over the learning rate), two workers each with a
quarter of a CPU, so the sweep runs on a 2-core machine. Each trial trains
the digits classifier with DistributedOptimizer; rank 0 reports the
validation accuracy after every epoch. Prints the best config.
"""

from __future__ import annotations

import argparse

import hora.ray.tune
import ray
from ray import tune


def train_digits(config: dict) -> None:
    import hora.torch as hvd
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    hvd.init()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    mine = torch.arange(hvd.rank(), len(x_train), hvd.size())
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=config["lr"]),
                                         named_parameters=net.named_parameters())  # fmt: skip
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    steps = len(mine) // 32
    for epoch in range(1, config["epochs"] + 1):
        order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
        for step in range(steps):
            rows = order[step * 32 : (step + 1) * 32]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x_train[rows]), y_train[rows]).backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (net(x_val).argmax(1) == y_val).float().mean()
        accuracy = float(hvd.allreduce(accuracy, op=hvd.Average, name=f"val.{epoch}"))
        hora.ray.tune.report({"epoch": epoch, "val_accuracy": accuracy})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="ERROR")
    trainable = hora.ray.tune.distributed_trainable(train_digits, num_workers=2, cpus_per_worker=0.25)
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.0003, 0.003, 0.03, 0.3]), "epochs": args.epochs},
        tune_config=tune.TuneConfig(metric="val_accuracy", mode="max"),
        run_config=tune.RunConfig(verbose=0),
    )
    results = tuner.fit()
    for result in results:
        print(f"lr {result.config['lr']:<7g} val_accuracy {result.metrics['val_accuracy']:.4f}")
    best = results.get_best_result()
    print(f"best config: lr={best.config['lr']} (val_accuracy {best.metrics['val_accuracy']:.4f})")
    ray.shutdown()


if __name__ == "__main__":
    main()
