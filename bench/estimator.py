"""TorchEstimator.fit against the same training written by hand on TorchDistributor + DDP, same session, same run.

100,000 rows (a 32-float feature vector and a regression label), an MLP
32-64-64-1, batch 64 per rank, 3 epochs, 2 processes on local Spark. The
estimator's time is its whole ``fit`` (Parquet written to the store,
training, model returned). The hand-written job reads the Parquet files the
estimator wrote (each rank every other file) with pyarrow and trains a DDP
model over gloo in ``TorchDistributor(num_processes=2, local_mode=False)``.

    python bench/estimator.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from _peers import local_spark

ROWS = 100_000
FEATURES = 32
EPOCHS = 3
BATCH = 64


def mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    )


def hand_written(train_dir: str) -> float:
    """One rank of the hand-written job: DDP over gloo, this rank's files, returns the last epoch's mean loss."""
    import glob

    import numpy as np
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(train_dir, "*.parquet")))[rank::size]
    table = pq.read_table(files)
    x = torch.from_numpy(np.stack(table.column("features").to_numpy(zero_copy_only=False)).astype(np.float32))
    y = torch.from_numpy(table.column("label").to_numpy().astype(np.float32)).reshape(-1, 1)
    steps = len(x) // BATCH
    counts = torch.tensor([steps])
    dist.all_reduce(counts, op=dist.ReduceOp.MIN)  # equal steps on every rank
    steps = int(counts[0])
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(EPOCHS):
        order = torch.randperm(len(x))
        total = 0.0
        for step in range(steps):
            rows = order[step * BATCH : (step + 1) * BATCH]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
    dist.destroy_process_group()
    return total / steps


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import numpy as np
    import torch
    from hora.estimators import TorchEstimator
    from hora.spark import Store
    from pyspark.ml.linalg import Vectors
    from pyspark.ml.torch.distributor import TorchDistributor

    spark = local_spark()
    print(f"{os.cpu_count()} cores; load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    rng = np.random.default_rng(0)
    features = rng.standard_normal((ROWS, FEATURES))
    labels = features @ rng.standard_normal(FEATURES)
    frame = spark.createDataFrame([(Vectors.dense(f), float(t)) for f, t in zip(features, labels, strict=True)],
                                  ["features", "label"]).cache()  # fmt: skip
    frame.count()
    with tempfile.TemporaryDirectory() as directory:
        store = Store.create(directory)
        net = mlp()
        estimator = TorchEstimator(
            numProc=2, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01),
            loss=torch.nn.functional.mse_loss, featureCols=["features"], labelCols=["label"], batchSize=BATCH,
            epochs=EPOCHS, store=store, runId="bench", shuffleBufferSize=0, verbose=0,
        )  # fmt: skip
        started = time.perf_counter()
        model = estimator.fit(frame)
        fit_seconds = time.perf_counter() - started
        train_dir = store.train_data_path("bench")
        started = time.perf_counter()
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(hand_written, train_dir)
        hand_seconds = time.perf_counter() - started
        started = time.perf_counter()
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(hand_written, train_dir)
        hand_again = time.perf_counter() - started
    hand = min(hand_seconds, hand_again)
    print(f"\n| {ROWS} rows, MLP {FEATURES}-64-64-1, batch {BATCH}, {EPOCHS} epochs, 2 processes | seconds | vs hand |")
    print("|---|---|---|")
    print(f"| TorchEstimator.fit (writes the Parquet, trains, returns the model) | {fit_seconds:.1f} | "
          f"{fit_seconds / hand:.2f}x |")  # fmt: skip
    print(f"| TorchDistributor + DDP by hand (reads the same Parquet; best of 2) | {hand:.1f} | 1.00x |")
    print(f"\nestimator's last-epoch loss {model.history[-1]['loss']:.4f}; overhead over the hand-written job "
          f"{100 * (fit_seconds / hand - 1):+.0f}%")  # fmt: skip
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    spark.stop()


if __name__ == "__main__":
    main()
