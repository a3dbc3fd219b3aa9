"""Elastic training of the digits classifier: workers come and go, training goes on.

    horarun -np 1 --min-np 1 --max-np 2 --host-discovery-script examples/elastic/discover_hosts.sh \\
        python examples/elastic/digits.py [--epochs 100]

``discover_hosts.sh`` offers this machine with 2 slots and with 1 slot in
turn, so the job grows to two workers and shrinks back to one while it
trains. Every few batches the state (model, optimizer, sampler, epoch) is
committed; when a worker is added or leaves, the job re-forms at the next
commit, the new worker gets rank 0's state, and the ElasticSampler splits
what is left of the epoch among the workers there are now. Were a worker to
die, the others would go back to the last commit and go on without it.
Rank 0 prints each epoch's loss and accuracy with the number of workers it
ran on, and the test accuracy at the end.
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
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 4 * 4, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.002, help="for one worker; scaled by the number of workers")
    parser.add_argument("--batches-per-commit", type=int, default=5)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x_train, x_test, y_train, y_test = load(0)
    net = model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(net.parameters(), lr=args.lr * hvd.size()), named_parameters=net.named_parameters()
    )
    sampler = hvd.elastic.ElasticSampler(range(len(x_train)), shuffle=True, seed=0)
    state = hvd.elastic.TorchState(net, optimizer, sampler=sampler, epoch=0, history=[])

    def scale_learning_rate() -> None:  # after every reset: as many workers, as large a step
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([scale_learning_rate])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            mine = list(state.sampler)  # what is left of the epoch, this worker's share
            totals = torch.zeros(3)  # loss sum, correct, rows
            for batch, start in enumerate(range(0, len(mine), args.batch_size)):
                rows = mine[start : start + args.batch_size]
                optimizer.zero_grad()
                logits = net(x_train[rows])
                loss = torch.nn.functional.cross_entropy(logits, y_train[rows])
                loss.backward()
                optimizer.step()
                totals += torch.tensor([loss.item() * len(rows), (logits.argmax(1) == y_train[rows]).sum(), len(rows)])
                state.sampler.record_batch(batch, args.batch_size)
                if batch % args.batches_per_commit == args.batches_per_commit - 1:
                    state.commit()
            totals = hvd.allreduce(totals, op=hvd.Sum, name="epoch.metrics")
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1:3d}  workers {hvd.size()}  loss {totals[0] / totals[2]:.4f}  "
                      f"accuracy {totals[1] / totals[2]:.4f}", flush=True)  # fmt: skip
            state.history = [*state.history, hvd.size()]
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    net.eval()
    with torch.no_grad():
        mine = torch.arange(hvd.rank(), len(x_test), hvd.size())
        correct = (net(x_test[mine]).argmax(1) == y_test[mine]).sum()
    counts = hvd.allreduce(torch.tensor([correct.item(), len(mine)], dtype=torch.float64), op=hvd.Sum)
    if hvd.rank() == 0:
        print(f"epochs on 1 worker: {state.history.count(1)}, on 2 workers: {state.history.count(2)}", flush=True)
        print(f"test accuracy {counts[0] / counts[1]:.4f} on {int(counts[1])} images", flush=True)


if __name__ == "__main__":
    main()
