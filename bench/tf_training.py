"""Training throughput with Hora's DistributedGradientTape against TensorFlow's MultiWorkerMirroredStrategy.

For each model (a 784-1024-1024-10 MLP and a small CNN, Keras 3 layers),
batch 64 per rank, one TensorFlow thread per process, a ``tf.function``
training step (forward, backward, SGD update), samples/s of:

- 1 process, no distribution;
- 2 processes with Hora (``DistributedGradientTape``, through horarun);
- 2 processes with ``tf.distribute.MultiWorkerMirroredStrategy`` (RING
  collectives over gRPC on 127.0.0.1, ``TF_CONFIG`` per worker): the peer a
  TensorFlow user picks. Its replica context all-reduces (mean) the
  gradients inside ``strategy.run``, as its own training loops do;
- 2 processes that exchange no gradients at all (the ceiling of this machine);
- 2 processes that exchange no gradients but wait for each other after
  every step (``hora.barrier``): what synchronous training costs before any
  byte moves.

Scaling efficiency = samples/s / (2 x one process's); the last column is
each way's share of the no-exchange ceiling. With ``--repeat N`` every way
runs N times, the ways in turn, and each ratio is the median of the
repeats' ratios (range in brackets): see ``_peers.alternate``.

    python bench/tf_training.py [--quick] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _peers import alternate, free_port, run_peer, training_rows

BATCH = 64
MODELS = ("mlp", "cnn")


def build(name: str):
    import keras

    if name == "mlp":
        layers = [keras.layers.Flatten(), keras.layers.Dense(1024, activation="relu")]
        layers += [keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)]
        return keras.Sequential([keras.Input((28, 28, 1)), *layers]), (28, 28, 1)
    layers = [keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2)]
    layers += [keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2)]
    layers += [keras.layers.Flatten(), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
    return keras.Sequential([keras.Input((32, 32, 3)), *layers]), (32, 32, 3)


def _worker(way: str, model_name: str, steps: int, rounds: int) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = None
    rank = int(os.environ.get("RANK", "0"))
    if way == "mwms":
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    import keras

    keras.utils.set_random_seed(0)
    model, shape = build(model_name)
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.uniform([BATCH, *shape])
    target = tf.random.uniform([BATCH], maxval=10, dtype=tf.int64)

    def gradients() -> list:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        if way == "hora":
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        if way == "mwms":
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        return grads

    if way == "hora":
        import hora.tensorflow as hvd

        hvd.init()
        rank = hvd.rank()
    elif way == "barrier":
        import hora

        hora.init()
        rank = hora.rank()

    @tf.function
    def step() -> None:
        # Under the strategy, one replica per worker: its local result is this worker's averaged gradients.
        grads = gradients() if strategy is None else strategy.experimental_local_results(strategy.run(gradients))[0]
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    def train_step() -> None:
        step()
        if way == "barrier":
            hora.barrier()

    for _ in range(5):
        train_step()
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            train_step()
        rates.append(BATCH * steps / (time.perf_counter() - start))
    if rank == 0:
        print("RESULT " + json.dumps(sorted(rates)[len(rates) // 2]), flush=True)


def run_mwms(ranks: int, argv: list[str]) -> float:
    """Runs ``argv`` as ``ranks`` MultiWorkerMirroredStrategy workers on 127.0.0.1; returns worker 0's RESULT."""
    workers = [f"127.0.0.1:{free_port()}" for _ in range(ranks)]
    procs = []
    for index in range(ranks):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="2", OPENBLAS_NUM_THREADS="1")
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    out = "".join(p.communicate(timeout=1800)[0] for p in procs)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"MultiWorkerMirroredStrategy workers failed: {[p.returncode for p in procs]}")
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return float(json.loads(line.split("RESULT ", 1)[1]))
    raise RuntimeError(f"MultiWorkerMirroredStrategy produced no result:\n{out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (a few minutes)")
    parser.add_argument("--repeat", type=int, default=1, help="run every way this many times, in turn (default 1)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps, rounds = (10, 3) if args.quick else (30, 5)
    if args.worker:
        _worker(args.worker[0], args.worker[1], args.steps, args.rounds)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.monotonic()
    print(f"batch {BATCH} per rank, 1 TensorFlow thread per process, {os.cpu_count()} cores; load average before: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))  # fmt: skip
    print()
    print("| model | way | processes | samples/s | scaling efficiency | share of the ceiling |")
    print("|---|---|---|---|---|---|")
    for model in MODELS:
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "{way}", model, "--steps", str(steps),
                "--rounds", str(rounds)]  # fmt: skip

        def command(way: str, argv: list[str] = argv) -> list[str]:
            return [a.replace("{way}", way) for a in argv]

        ways = {
            "one process": lambda command=command: float(run_peer("gloo", 1, command("none"))),
            "hora (DistributedGradientTape)": lambda command=command: 2 * float(run_peer("hora", 2, command("hora"))),
            "MultiWorkerMirroredStrategy (RING)": lambda command=command: 2 * run_mwms(2, command("mwms")),
            "no exchange": lambda command=command: 2 * float(run_peer("gloo", 2, command("none"))),
            "barrier only": lambda command=command: 2 * float(run_peer("hora", 2, command("barrier"))),
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
