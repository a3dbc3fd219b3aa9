"""``model.fit`` throughput with hora.keras on each Keras backend, against one process and the no-exchange ceiling.

For each backend (tensorflow, jax, torch) and model (a 784-1024-1024-10 MLP
and a small CNN), batch 64 per rank, one thread per process, samples/s of
``model.fit`` over synthetic data:

- 1 process, no distribution;
- 2 processes with Hora (``hora.keras.DistributedOptimizer``, through horarun);
- 2 processes that exchange no gradients at all (the ceiling of this machine);
- 2 processes that exchange no gradients but wait for each other after
  every step (``hora.barrier`` in a callback): what synchronous training
  costs before any byte moves;
- Hora and no exchange again with every rank bound to its own core
  (``horarun --bind-cores``, and the same share of the cores for the
  processes that exchange nothing): JAX's runtime keeps thread pools sized
  by the cores a process may use, which otherwise spread over the other
  rank's core.

Every way is timed after WARMUP steps: a 2-rank job's first steps are slow
while the machine warms the gradients' fresh buffers (measured here, JAX's
MLP with Hora: its first 30 to 40 steps took 12 to 24 ms against about 12
after, while the ways without an exchange ran at their settled speed from
the first step; see the large-buffer warm-up in docs/performance.md).

Keras 3 has no multi-process data parallelism of its own for the
TensorFlow and torch backends (``keras.distribution`` is JAX-only and
single-process here), so the peer is the ceiling. Scaling efficiency =
samples/s / (2 x one process's). With ``--repeat N`` every way runs N
times, the ways in turn, and each ratio is the median of the repeats'
ratios (range in brackets): see ``_peers.alternate``.

    python bench/keras_training.py [--quick] [--repeat N] [--backends tensorflow,jax,torch]
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
WARMUP = 40  # steps before the timed ones (see above)


def _worker(way: str, model_name: str, steps: int, rounds: int) -> None:
    if way == "none" and os.environ.get("HORA_BIND_CORES") == "1":  # as horarun --bind-cores binds Hora's ranks
        from hora.runner.guard import share_of_cores

        rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        os.sched_setaffinity(0, share_of_cores(list(os.sched_getaffinity(0)), rank, size))
    import keras
    import numpy as np

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    elif backend == "torch":
        import torch

        torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    keras.utils.set_random_seed(0)
    if model_name == "mlp":
        layers = [keras.layers.Flatten(), keras.layers.Dense(1024, activation="relu")]
        layers += [keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)]
        shape = (28, 28, 1)
    else:
        layers = [keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2)]
        layers += [keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2)]
        layers += [keras.layers.Flatten(), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
        shape = (32, 32, 3)
    model = keras.Sequential([keras.Input(shape), *layers])
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
    callbacks = []
    if way == "hora":
        import hora.keras as hvd

        hvd.init()
        rank = hvd.rank()
        optimizer = hvd.DistributedOptimizer(optimizer)
    elif way == "barrier":
        import hora

        hora.init()
        rank = hora.rank()
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: hora.barrier()))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(rank)
    warmup = WARMUP
    x = rng.random((BATCH * (warmup + steps * rounds), *shape), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    ends: list[float] = []  # when each batch ended: one fit, so fit's own start-up is not timed
    timer = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[*callbacks, timer])
    rates = []
    for r in range(rounds):
        first, last = warmup - 1 + r * steps, warmup - 1 + (r + 1) * steps
        rates.append(BATCH * steps / (ends[last] - ends[first]))
    if rank == 0:
        print("RESULT " + json.dumps(sorted(rates)[len(rates) // 2]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (a few minutes)")
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--repeat", type=int, default=1, help="run every way this many times, in turn (default 1)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps, rounds = (20, 3) if args.quick else (50, 5)
    if args.worker:
        _worker(args.worker[0], args.worker[1], args.steps, args.rounds)
        return
    started = time.monotonic()
    print(f"batch {BATCH} per rank, 1 thread per process, {os.cpu_count()} cores; load average before: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))  # fmt: skip
    print()
    print("| backend | model | way | processes | samples/s | scaling efficiency | share of the ceiling |")
    print("|---|---|---|---|---|---|---|")
    for backend in args.backends.split(","):
        env = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
        for model in MODELS:

            def run(way: str, ranks: int, kind: str, model: str = model, env: dict = env, bind: bool = False) -> float:
                argv = [sys.executable, os.path.abspath(__file__), "--worker", way, model, "--steps", str(steps),
                        "--rounds", str(rounds)]  # fmt: skip
                return float(run_peer(kind, ranks, argv, env=dict(env, HORA_BIND_CORES="1" if bind else "0")))

            ways = {
                "one process": lambda run=run: run("none", 1, "gloo"),
                "hora": lambda run=run: 2 * run("hora", 2, "hora"),
                "no exchange": lambda run=run: 2 * run("none", 2, "gloo"),
                "barrier only": lambda run=run: 2 * run("barrier", 2, "hora"),
                "hora, --bind-cores": lambda run=run: 2 * run("hora", 2, "hora", bind=True),
                "no exchange, bound": lambda run=run: 2 * run("none", 2, "gloo", bind=True),
            }
            results = alternate(ways, args.repeat)
            processes = {way: 1 if way == "one process" else 2 for way in ways}
            for cells in training_rows(results, "one process", "no exchange", processes):
                print("| " + " | ".join([backend, model, *cells]) + " |", flush=True)
    print()
    print(
        f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; took {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
