"""Train a digit classifier on scikit-learn's bundled digits (8x8 images, no download) with Hora and TensorFlow.

    horarun -np 2 python examples/tensorflow/digits.py [--epochs 30] [--batch-size 32]

Horovod's TensorFlow 2 recipe: each rank trains on its shard of the training
set in a ``tf.function`` step; ``DistributedGradientTape`` averages the
gradients (one crossing to the engine per step), so after the initial
``broadcast_variables`` the ranks stay identical. Rank 0 prints the
per-epoch loss and accuracy (averaged over ranks) and the test accuracy.
"""

from __future__ import annotations

import argparse

import hora.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def load(seed: int) -> tuple[np.ndarray, ...]:
    digits = load_digits()
    x = (digits.images[..., None] / 16.0).astype(np.float32)  # N x 8 x 8 x 1, in [0, 1]
    return tuple(train_test_split(x, digits.target, test_size=0.25, random_state=seed, stratify=digits.target))


def model() -> keras.Model:
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank; scaled by the number of ranks")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(args.seed + hvd.rank())  # different on purpose: the broadcast makes them equal
    x_train, x_test, y_train, y_test = load(args.seed)
    shard = np.arange(hvd.rank(), len(x_train), hvd.size())  # this rank's rows
    steps = len(x_train) // hvd.size() // args.batch_size  # the same number of steps on every rank

    net = model()
    optimizer = keras.optimizers.Adam(learning_rate=args.lr * hvd.size())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(net.trainable_variables)
    hvd.broadcast_variables(net.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables, root_rank=0)

    @tf.function
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = net(images, training=True)
            loss = loss_fn(labels, logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, net.trainable_variables)
        optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == tf.cast(labels, tf.int64), tf.float32))
        return loss, correct

    rng = np.random.default_rng(args.seed + hvd.rank())
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(shard)
        totals = np.zeros(3)  # loss sum, correct, rows
        for step in range(steps):
            rows = order[step * args.batch_size : (step + 1) * args.batch_size]
            loss, correct = train_step(x_train[rows], y_train[rows])
            totals += [float(loss) * len(rows), float(correct), len(rows)]
        totals = hvd.allreduce(tf.constant(totals), op=hvd.Sum, name="epoch.metrics").numpy()
        if hvd.rank() == 0:
            print(
                f"epoch {epoch:3d}  loss {totals[0] / totals[2]:.4f}  accuracy {totals[1] / totals[2]:.4f}", flush=True
            )

    mine = np.arange(hvd.rank(), len(x_test), hvd.size())
    correct = float(np.sum(np.argmax(net(x_test[mine], training=False), 1) == y_test[mine]))
    counts = hvd.allreduce(tf.constant([correct, len(mine)], tf.float64), op=hvd.Sum).numpy()
    if hvd.rank() == 0:
        print(f"test accuracy {counts[0] / counts[1]:.4f} on {int(counts[1])} images", flush=True)


if __name__ == "__main__":
    main()
