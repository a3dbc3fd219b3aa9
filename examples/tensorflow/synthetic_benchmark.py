"""Synthetic training throughput with Hora and TensorFlow, like Horovod's tensorflow2_synthetic_benchmark.py.

    horarun -np 2 python examples/tensorflow/synthetic_benchmark.py --model cnn --batch-size 32 --num-iters 5

Random images and labels, no data loading: the time is the model's forward,
backward and update in a ``tf.function`` plus the gradient exchange of
``DistributedGradientTape``. Prints images/s per rank (mean +- 1.96 std
over iterations) and for all ranks together. ``--model`` also takes any
``keras.applications`` name (``ResNet50``, ...), built with random weights.
"""

from __future__ import annotations

import argparse
import timeit

import hora.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf


def build(name: str) -> tuple[keras.Model, tuple[int, ...]]:
    """The model called ``name`` and its input shape (without the batch)."""
    if name == "mlp":
        layers = [keras.layers.Flatten(), keras.layers.Dense(1024, activation="relu")]
        layers += [keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)]
        return keras.Sequential([keras.Input((28, 28, 1)), *layers]), (28, 28, 1)
    if name == "cnn":
        layers = [keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2)]
        layers += [keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2)]
        layers += [keras.layers.Flatten(), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
        return keras.Sequential([keras.Input((32, 32, 3)), *layers]), (32, 32, 3)
    application = getattr(keras.applications, name, None)
    if application is None:
        raise SystemExit(f"--model {name!r}: expected mlp, cnn or a keras.applications model such as ResNet50.")
    return application(weights=None, classes=10), (224, 224, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", help="mlp, cnn or a keras.applications name")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow threads per process")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    model, shape = build(args.model)
    optimizer = keras.optimizers.SGD(learning_rate=0.01 * hvd.size())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    data = tf.random.uniform([args.batch_size, *shape])
    target = tf.random.uniform([args.batch_size], maxval=10, dtype=tf.int64)

    @tf.function
    def benchmark_step() -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    benchmark_step()  # builds the optimizer's variables, so that they can be broadcast too
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables, root_rank=0)

    log(f"Model: {args.model}, batch size {args.batch_size} per rank, {hvd.size()} ranks")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)
    mean, spread = float(np.mean(rates)), 1.96 * float(np.std(rates))
    log(f"Img/sec per rank: {mean:.1f} +-{spread:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} +-{hvd.size() * spread:.1f}")


if __name__ == "__main__":
    main()
