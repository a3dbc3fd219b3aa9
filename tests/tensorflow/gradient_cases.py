"""Worker script: the gradients of hora.tensorflow's collectives, eagerly and in tf.function, against Horovod's rules.

Each case differentiates ``sum(collective(x) * weights)`` where the weights
differ per rank, so the expected gradient (computed here in numpy from every
rank's weights) tells an averaged gradient from a summed or a local one.
"""

from __future__ import annotations

import sys

import hora.tensorflow as hvd
import numpy as np
import tensorflow as tf

from tests.tensorflow.op_cases import run
from tests.worker import run_cases


def gradient(mode: str, forward, x: tf.Tensor) -> np.ndarray:
    """d sum(forward(x)) / dx, eagerly or in a tf.function."""

    def compute(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = forward(t)
        return tape.gradient(loss, t)

    return run(mode, compute, x).numpy()


def weights(rank: int, shape) -> np.ndarray:
    return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1) * (rank + 1)


def cases(rank: int, size: int):
    every = [weights(r, (4, 3)) for r in range(size)]
    mean = sum(every) / size
    x = tf.constant(np.ones((4, 3)) * (rank + 1))
    for mode in ("eager", "graph"):

        def allreduce(mode=mode):
            for op, factor in ((hvd.Sum, size), (hvd.Average, 1)):
                for pre, post in ((1.0, 1.0), (0.5, 3.0)):

                    def forward(t, op=op, pre=pre, post=post):
                        reduced = hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post)
                        return tf.reduce_sum(reduced * every[rank])

                    # Horovod: the gradient is allreduced with the same op and factors.
                    expected = mean * factor * pre * post
                    np.testing.assert_allclose(gradient(mode, forward, x), expected)

        yield f"{mode} allreduce", allreduce

        def grouped_allreduce(mode=mode):
            def forward(t):
                a, b = hvd.grouped_allreduce([t, t * 2.0], op=hvd.Sum)
                return tf.reduce_sum(a * every[rank]) + tf.reduce_sum(b)

            np.testing.assert_allclose(gradient(mode, forward, x), mean * size + 2.0 * size)

        yield f"{mode} grouped_allreduce", grouped_allreduce

        def allgather(mode=mode):
            rows = rank + 1  # uneven first dimensions
            t = tf.constant(np.ones((rows, 3)))
            total = size * (size + 1) // 2
            gathered_weights = [weights(r, (total, 3)) for r in range(size)]

            def forward(u):
                return tf.reduce_sum(hvd.allgather(u) * gathered_weights[rank])

            start = rank * (rank + 1) // 2  # this rank's rows of the averaged gradient
            expected = (sum(gathered_weights) / size)[start : start + rows]
            np.testing.assert_allclose(gradient(mode, forward, t), expected)

        yield f"{mode} allgather", allgather

        def broadcast(mode=mode):
            root = size - 1

            def forward(t):
                return tf.reduce_sum(hvd.broadcast(t, root) * every[rank])

            expected = mean if rank == root else np.zeros_like(mean)
            np.testing.assert_allclose(gradient(mode, forward, x), expected)

        yield f"{mode} broadcast", broadcast

        def alltoall(mode=mode):
            t = tf.constant(np.ones((2 * size, 3)))
            w = weights(rank, (2 * size, 3))

            def forward(u):
                return tf.reduce_sum(hvd.alltoall(u) * w)

            # Rows 2p, 2p+1 went to rank p, which weighted them with its rows 2*rank, 2*rank+1.
            expected = np.concatenate([weights(p, (2 * size, 3))[2 * rank : 2 * rank + 2] for p in range(size)])
            np.testing.assert_allclose(gradient(mode, forward, t), expected)

        yield f"{mode} alltoall", alltoall

        def reducescatter(mode=mode):
            t = tf.constant(np.ones((size, 3)))
            for op, factor in ((hvd.Sum, size), (hvd.Average, 1)):

                def forward(u, op=op):
                    return tf.reduce_sum(hvd.reducescatter(u, op=op) * weights(rank, (1, 3)))

                # Horovod: the output gradient times size (Sum) or 1 (Average), gathered.
                expected = np.concatenate([weights(r, (1, 3)) for r in range(size)]) * factor
                np.testing.assert_allclose(gradient(mode, forward, t), expected)

        yield f"{mode} reducescatter", reducescatter

        def no_gradient_for_min(mode=mode):
            try:
                gradient(mode, lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Min)), x)
            except (RuntimeError, tf.errors.OpError) as exc:
                assert "only Sum and Average are differentiable" in str(exc), exc
            else:
                raise AssertionError("Min had a gradient")

        yield f"{mode} Min has no gradient", no_gradient_for_min

        def tape(mode=mode):
            v = tf.Variable(np.ones(3) * (rank + 1))
            local = tf.Variable(np.ones(2))

            def compute():
                with tf.GradientTape() as t:
                    loss = tf.reduce_sum(v * v * (rank + 1)) + tf.reduce_sum(local * (rank + 1))
                distributed = hvd.DistributedGradientTape(t)
                distributed.register_local_source(local)
                return distributed.gradient(loss, [v, local])

            grad_v, grad_local = run(mode, compute)
            # d/dv = 2 v (rank+1) = 2 (rank+1)^2, averaged; the local source is divided by the size, not averaged.
            np.testing.assert_allclose(grad_v.numpy(), sum(2.0 * (r + 1) ** 2 for r in range(size)) / size)
            np.testing.assert_allclose(grad_local.numpy(), (rank + 1) / size)

        yield f"{mode} DistributedGradientTape, local sources", tape

        def partial_tape(mode=mode):
            import keras

            shared, local = keras.layers.Dense(2, dtype="float64"), keras.layers.Dense(2, dtype="float64")
            inputs = tf.constant(np.ones((1, 3)) * (rank + 1))
            shared.build((None, 3))
            local.build((None, 3))

            def compute():
                with tf.GradientTape() as t:
                    loss = tf.reduce_sum(shared(inputs)) + tf.reduce_sum(local(inputs))
                partial = hvd.PartialDistributedGradientTape(t, local_layers=[local])
                return partial.gradient(loss, [shared.kernel, local.kernel])

            grad_shared, grad_local = run(mode, compute)
            # dense kernel gradient = inputs^T . ones: (rank + 1) everywhere; averaged, or local / size
            np.testing.assert_allclose(grad_shared.numpy(), (size + 1) / 2)
            np.testing.assert_allclose(grad_local.numpy(), (rank + 1) / size)

        yield f"{mode} PartialDistributedGradientTape", partial_tape

        def tape_sparse(mode=mode):
            table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
            ids = tf.constant([rank, rank + 1])

            def compute(sparse_as_dense):
                with tf.GradientTape() as t:
                    loss = tf.reduce_sum(tf.gather(table, ids) * (rank + 1))
                return hvd.DistributedGradientTape(t, sparse_as_dense=sparse_as_dense).gradient(loss, [table])[0]

            expected = np.zeros((6, 2), np.float32)
            for r in range(size):
                expected[[r, r + 1]] += (r + 1) / size
            sparse = run(mode, lambda: compute(False))
            assert isinstance(sparse, tf.IndexedSlices), type(sparse)
            np.testing.assert_allclose(tf.convert_to_tensor(sparse).numpy(), expected)
            dense = run(mode, lambda: compute(True))
            assert isinstance(dense, tf.Tensor)
            np.testing.assert_allclose(dense.numpy(), expected)

        yield f"{mode} DistributedGradientTape, IndexedSlices", tape_sparse

        def tape_groups_and_predivide(mode=mode):
            vs = [tf.Variable(np.ones(n) * (rank + 1), dtype=tf.float32) for n in (1, 2, 3, 4)]
            expected = [np.full(n, (size + 1) / 2) for n in (1, 2, 3, 4)]
            for kwargs in ({"num_groups": 3}, {"groups": [[vs[3], vs[0]]]}, {"gradient_predivide_factor": 2.0},
                           {"compression": hvd.Compression.fp16}):  # fmt: skip

                def compute(kwargs=kwargs):
                    with tf.GradientTape() as t:
                        loss = tf.add_n([tf.reduce_sum(v) * (rank + 1) for v in vs])
                    return hvd.DistributedGradientTape(t, **kwargs).gradient(loss, vs)

                for g, e in zip(run(mode, compute), expected, strict=True):
                    np.testing.assert_allclose(g.numpy(), e, rtol=1e-3)

        yield f"{mode} DistributedGradientTape, groups, predivide, fp16", tape_groups_and_predivide

        def tape_process_set(mode=mode):
            first = hvd.add_process_set([0])
            v = tf.Variable(np.ones(2) * (rank + 1))

            def compute():
                with tf.GradientTape() as t:
                    loss = tf.reduce_sum(v * (rank + 1))
                return hvd.DistributedGradientTape(t, process_set=first).gradient(loss, [v])[0]

            # A one-rank set, and ranks outside a set, keep their own gradient (as in Horovod).
            np.testing.assert_allclose(run(mode, compute).numpy(), rank + 1.0)
            hvd.remove_process_set(first)

        yield f"{mode} DistributedGradientTape, process set", tape_process_set


if __name__ == "__main__":
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sys.exit(run_cases(cases))
