"""Worker script: training with hora.tensorflow equals training on one process with the whole batch.

Every rank builds the same data; rank r trains on its slice of each global
batch with DistributedGradientTape, while a reference model (same initial
weights, float64) trains on the whole global batch in the same process with
no exchange at all. After several steps of SGD and of Adam the two must
agree: averaging the ranks' gradients is exactly the gradient of the global
batch. Also: broadcast_variables makes the ranks identical, and
SyncBatchNormalization over 2 x b rows equals BatchNormalization over 2b.
"""

from __future__ import annotations

import sys

import hora.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from tests.worker import run_cases

BATCH = 8  # rows per rank per step
STEPS = 5


def model() -> keras.Model:
    keras.utils.set_random_seed(1000 + hvd.rank())  # different on every rank until broadcast
    layers = [keras.layers.Dense(16, activation="tanh", dtype="float64"), keras.layers.Dense(3, dtype="float64")]
    net = keras.Sequential([keras.Input((5,), dtype="float64"), *layers])
    return net


def data(size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.normal(size=(STEPS, size * BATCH, 5)), rng.normal(size=(STEPS, size * BATCH, 3))


def train(net: keras.Model, optimizer, xs, ys, distributed: bool) -> None:
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(x) - y))
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, net.trainable_variables)
        optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))

    for x, y in zip(xs, ys, strict=True):
        step(tf.constant(x), tf.constant(y))


def cases(rank: int, size: int):
    def broadcast_makes_ranks_identical():
        net = model()
        hvd.broadcast_variables(net.variables, root_rank=0)
        weights = np.concatenate([v.numpy().ravel() for v in net.variables])
        gathered = hvd.allgather_object(weights)
        for other in gathered:
            np.testing.assert_array_equal(other, gathered[0])

    yield "broadcast_variables makes ranks identical", broadcast_makes_ranks_identical

    for name in ("SGD", "Adam"):

        def tape_equals_global_batch(name=name):
            xs, ys = data(size)
            mine = slice(rank * BATCH, (rank + 1) * BATCH)
            net, reference = model(), model()
            hvd.broadcast_variables(net.variables, root_rank=0)
            reference.set_weights(net.get_weights())
            make = getattr(keras.optimizers, name)
            train(net, make(learning_rate=0.05), xs[:, mine], ys[:, mine], distributed=True)
            train(reference, make(learning_rate=0.05), xs, ys, distributed=False)
            for trained, expected in zip(net.get_weights(), reference.get_weights(), strict=True):
                np.testing.assert_allclose(trained, expected, rtol=1e-9, atol=1e-12)
            assert not np.allclose(net.get_weights()[0], model().get_weights()[0])  # it trained

        yield f"{size} ranks x {BATCH} rows == 1 x {size * BATCH} rows ({name})", tape_equals_global_batch

    def sync_batch_norm_equals_global_batch():
        rng = np.random.default_rng(3)
        x = rng.normal(size=(size * 6, 4, 3)) * 2.0 + 1.0
        mine = tf.constant(x[rank * 6 : (rank + 1) * 6])
        sync = hvd.SyncBatchNormalization(dtype="float64", momentum=0.5)
        plain = keras.layers.BatchNormalization(dtype="float64", momentum=0.5)
        sync.build(mine.shape)
        plain.build(x.shape)
        weights = rng.normal(size=(size * 6, 4, 3))

        @tf.function
        def forward(layer, inputs, w):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                out = layer(inputs, training=True)
                loss = tf.reduce_sum(out * w)
            return out, tape.gradient(loss, [inputs, layer.gamma])

        out, (d_input, d_gamma) = forward(sync, mine, tf.constant(weights[rank * 6 : (rank + 1) * 6]))
        ref_out, (ref_d_input, ref_d_gamma) = forward(plain, tf.constant(x), tf.constant(weights))
        np.testing.assert_allclose(out.numpy(), ref_out.numpy()[rank * 6 : (rank + 1) * 6], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(d_input.numpy(), ref_d_input.numpy()[rank * 6 : (rank + 1) * 6], atol=1e-9)
        # gamma's gradient on one rank covers its rows only; summed over ranks it is the global one
        np.testing.assert_allclose(hvd.allreduce(d_gamma, op=hvd.Sum).numpy(), ref_d_gamma.numpy(), atol=1e-9)
        np.testing.assert_allclose(sync.moving_variance.numpy(), plain.moving_variance.numpy(), rtol=1e-9)

    yield "SyncBatchNormalization over the global batch", sync_batch_norm_equals_global_batch


if __name__ == "__main__":
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sys.exit(run_cases(cases))
