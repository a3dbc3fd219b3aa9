"""Train a digit classifier on scikit-learn's bundled digits (8x8 images, no download) with Hora.

    horarun -np 2 python examples/torch/digits.py [--epochs 30] [--batch-size 32]

Each rank trains on its shard of the training set; DistributedOptimizer
averages the gradients, so the ranks stay identical. Rank 0 prints the
per-epoch loss and accuracy (averaged over ranks) and the test accuracy.
"""

from __future__ import annotations

import argparse

import hora.torch as hvd
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def load(seed: int) -> tuple[torch.Tensor, ...]:
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # N x 1 x 8 x 8, in [0, 1]
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_train, x_test, y_train, y_test


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank; scaled by the number of ranks")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: the broadcast makes them equal
    torch.set_num_threads(1)
    x_train, x_test, y_train, y_test = load(args.seed)
    # This rank's shard; every rank takes the same number of batches per epoch.
    shard = torch.arange(hvd.rank(), len(x_train), hvd.size())
    steps = len(x_train) // hvd.size() // args.batch_size

    net = model()
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    for epoch in range(1, args.epochs + 1):
        net.train()
        order = shard[torch.randperm(len(shard), generator=generator)]
        totals = torch.zeros(3)  # loss sum, correct, rows
        for step in range(steps):
            rows = order[step * args.batch_size : (step + 1) * args.batch_size]
            optimizer.zero_grad()
            logits = net(x_train[rows])
            loss = torch.nn.functional.cross_entropy(logits, y_train[rows])
            loss.backward()
            optimizer.step()
            totals += torch.tensor(
                [loss.item() * len(rows), (logits.argmax(1) == y_train[rows]).sum().item(), len(rows)]
            )
        totals = hvd.allreduce(totals, op=hvd.Sum, name="epoch.metrics")
        if hvd.rank() == 0:
            print(
                f"epoch {epoch:3d}  loss {totals[0] / totals[2]:.4f}  accuracy {totals[1] / totals[2]:.4f}", flush=True
            )

    net.eval()
    with torch.no_grad():
        mine = torch.arange(hvd.rank(), len(x_test), hvd.size())
        correct = (net(x_test[mine]).argmax(1) == y_test[mine]).sum()
    counts = hvd.allreduce(torch.tensor([correct.item(), len(mine)], dtype=torch.float64), op=hvd.Sum)
    if hvd.rank() == 0:
        print(f"test accuracy {counts[0] / counts[1]:.4f} on {int(counts[1])} images", flush=True)


if __name__ == "__main__":
    main()
