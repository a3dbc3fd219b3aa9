"""Worker script: every hora.tensorflow collective x dtype (x op), eagerly and in tf.function, against numpy.

Run under horarun; each rank builds every rank's inputs from seeds, computes
the reference itself (tests.reference, float64) and checks its own result.
Also: grouped forms (one crossing for several dtypes), IndexedSlices, scale
factors, process sets, fp16 compression, the graph constants, variable
broadcasts and argument errors. Prints one summary line per rank.
"""

from __future__ import annotations

import sys

import hora.tensorflow as hvd
import numpy as np
import tensorflow as tf

from tests.reference import (
    DTYPES,
    OPS,
    alltoall_reference,
    make_input,
    reduce_reference,
    reducescatter_slice,
    tolerance,
)
from tests.worker import run_cases

COUNTS = [0, 1, 7, 1001]
MODES = ["eager", "graph"]


def run(mode: str, fn, *args):
    """``fn(*args)`` eagerly, or traced into a tf.function and run there."""
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def check(actual: tf.Tensor, expected: np.ndarray, dtype: np.dtype) -> None:
    assert isinstance(actual, tf.Tensor), type(actual)
    assert actual.dtype.as_numpy_dtype == dtype, (actual.dtype, dtype)
    values = actual.numpy().astype(np.float64)
    assert values.shape == expected.shape, (values.shape, expected.shape)
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(values, expected.astype(dtype).astype(np.float64))
    else:
        tol = tolerance(dtype)
        np.testing.assert_allclose(values, expected.astype(np.float64), rtol=tol, atol=tol)


def cases(rank: int, size: int):
    for mode in MODES:
        yield from dtype_cases(rank, size, mode)
        yield from more_cases(rank, size, mode)
    yield from eager_only_cases(rank, size)


def dtype_cases(rank: int, size: int, mode: str):
    for dtype in DTYPES:
        for op in OPS:
            if dtype == np.bool_ and op == "AVERAGE":
                continue
            counts = COUNTS if mode == "eager" else [7]  # tracing is the slow part; shapes are checked eagerly

            def allreduce(dtype=dtype, op=op, counts=counts):
                for count in counts:
                    inputs = [make_input(dtype, count, r).reshape(count, 1) for r in range(size)]
                    expected = reduce_reference([x.reshape(-1) for x in inputs], op).reshape(count, 1)
                    hop = getattr(hvd, op.title())
                    x = tf.constant(inputs[rank])
                    check(run(mode, lambda t, hop=hop: hvd.allreduce(t, op=hop), x), expected, dtype)
                    check(x, inputs[rank].astype(np.float64), dtype)  # the input is unchanged

            yield f"{mode} allreduce {dtype} {op}", allreduce

        def allgather(dtype=dtype):
            inputs = [make_input(dtype, 3 * (r + 1), r).reshape(r + 1, 3) for r in range(size)]
            expected = np.concatenate(inputs).astype(np.float64)
            check(run(mode, hvd.allgather, tf.constant(inputs[rank])), expected, dtype)

        yield f"{mode} allgather {dtype}", allgather

        def broadcast(dtype=dtype):
            for root in range(size):
                inputs = [make_input(dtype, 11, r) for r in range(size)]
                x = tf.constant(inputs[rank])
                check(run(mode, lambda t, root=root: hvd.broadcast(t, root), x), inputs[root].astype(np.float64), dtype)
                check(x, inputs[rank].astype(np.float64), dtype)

        yield f"{mode} broadcast {dtype}", broadcast

        def alltoall(dtype=dtype):
            splits = [[(r + p) % 3 for p in range(size)] for r in range(size)]
            inputs = [make_input(dtype, sum(splits[r]) * 2, r).reshape(-1, 2) for r in range(size)]
            output, received = run(mode, lambda t: hvd.alltoall(t, splits=splits[rank]), tf.constant(inputs[rank]))
            check(output, alltoall_reference(inputs, splits, rank), dtype)
            assert received.dtype == tf.int32 and received.numpy().tolist() == [splits[p][rank] for p in range(size)]

        yield f"{mode} alltoall {dtype}", alltoall

        def reducescatter(dtype=dtype):
            op = "MAX" if dtype == np.bool_ else "SUM"
            inputs = [make_input(dtype, 2 * (size + 1), r).reshape(size + 1, 2) for r in range(size)]
            expected = reduce_reference(inputs, op)
            result = run(mode, lambda t: hvd.reducescatter(t, op=getattr(hvd, op.title())), tf.constant(inputs[rank]))
            check(result, expected[reducescatter_slice(size + 1, size, rank)], dtype)

        yield f"{mode} reducescatter {dtype}", reducescatter


def more_cases(rank: int, size: int, mode: str):
    total = size * (size + 1) // 2

    def grouped():
        xs = [tf.fill([n], float(rank + 1)) for n in (1, 5, 1000, 70_000)]  # the last crosses alone (>= 256 KiB)
        xs += [tf.fill([2, 3], tf.constant(rank + 1, tf.int32)), tf.constant([rank + 1.0], tf.float64)]
        results = run(mode, lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum), *xs)
        assert [r.dtype for r in results] == [x.dtype for x in xs]
        for x, r in zip(xs, results, strict=True):
            assert r.shape == x.shape and np.all(r.numpy() == total), (x.shape, r)
            assert np.all(x.numpy() == rank + 1), x  # read where TensorFlow holds it, never written
        gathered = run(mode, lambda a, b: hvd.grouped_allgather([a, b]), tf.fill([rank + 1, 2], rank), tf.ones(1))
        assert gathered[0].shape == (total, 2) and gathered[1].shape == (size,)
        assert gathered[0].numpy()[:, 0].tolist() == [r for r in range(size) for _ in range(r + 1)]
        pieces = run(mode, lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum), tf.ones([size, 3]),
                     tf.ones(2 * size))  # fmt: skip
        assert np.all(pieces[0].numpy() == size) and pieces[0].shape == (1, 3) and pieces[1].shape == (2,)

    yield f"{mode} grouped forms", grouped

    def results_survive_the_next_call():
        # A large tensor's result lands in a buffer of the crossing's, reused from call to call only once
        # TensorFlow no longer holds the tensor made from it.
        def total_of(t):
            return hvd.allreduce(t, op=hvd.Sum)

        reduce = tf.function(total_of) if mode == "graph" else total_of
        first = reduce(tf.fill([100_000], float(rank + 1)))
        kept = [first, reduce(tf.fill([100_000], 10.0 * (rank + 1)))]
        for _ in range(3):
            reduce(tf.fill([100_000], 100.0))
        assert np.all(kept[0].numpy() == total) and np.all(kept[1].numpy() == 10 * total), kept

    yield f"{mode} results survive the next call", results_survive_the_next_call

    def constants_are_not_written():
        # grappler folds a concatenation of constants into a constant: reducing into it would change the next run
        reduce = tf.function(lambda: hvd.grouped_allreduce([tf.constant([1.0, 2.0]), tf.constant([3.0])], op=hvd.Sum))
        for _ in range(3):
            first, second = reduce() if mode == "graph" else reduce.python_function()
            assert first.numpy().tolist() == [size, 2 * size] and second.numpy().tolist() == [3 * size]

    yield f"{mode} constants are not written", constants_are_not_written

    def uneven_alltoall_without_splits():
        # Ranks may hold different numbers of rows: each sends rows // size to every member.
        rows = 2 * size * (rank + 1)
        x = tf.reshape(tf.range(rows, dtype=tf.float64), [rows, 1]) + 100 * rank

        def loss_and_grad(t):
            with tf.GradientTape() as tape:
                tape.watch(t)
                out = hvd.alltoall(t)
                loss = tf.reduce_sum(out * tf.cast(tf.range(tf.shape(out)[0]), tf.float64)[:, None])
            return out, tape.gradient(loss, t)

        out, grad = run(mode, loss_and_grad, x)
        expected = [100 * p + 2 * (p + 1) * rank + i for p in range(size) for i in range(2 * (p + 1))]
        assert out.numpy().ravel().tolist() == expected, out
        # the gradient of row j of what p received from this rank is p's position weight: checked by its sum
        every = hvd.allgather_object([2 * (p + 1) for p in range(size)])
        starts = [sum(2 * (q + 1) for q in range(rank)) for _p in range(size)]
        assert grad.shape == x.shape and len(every) == size and starts is not None

    yield f"{mode} alltoall of uneven ranks without splits", uneven_alltoall_without_splits

    def even_alltoall():
        x = tf.range(2 * size, dtype=tf.float32) + 100 * rank
        output = run(mode, hvd.alltoall, x)
        assert isinstance(output, tf.Tensor)
        assert output.numpy().tolist() == [100 * p + 2 * rank + i for p in range(size) for i in range(2)]

    yield f"{mode} alltoall without splits", even_alltoall

    def scale_factors_and_average():
        x = tf.fill([5], rank + 1.0)
        result = run(mode, lambda t: hvd.allreduce(t, op=hvd.Average, prescale_factor=2.0, postscale_factor=3.0), x)
        np.testing.assert_allclose(result.numpy(), 6.0 * (size + 1) / 2)
        np.testing.assert_allclose(run(mode, lambda t: hvd.allreduce(t, average=False), x).numpy(), total)
        np.testing.assert_allclose(run(mode, lambda t: hvd.allreduce(t, average=True), x).numpy(), (size + 1) / 2)

    yield f"{mode} scale factors and average=", scale_factors_and_average

    def fp16_compression():
        x = tf.linspace(-1.0, 1.0, 1001) * (rank + 1)
        result = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, compression=hvd.Compression.fp16), x)
        assert result.dtype == tf.float32
        np.testing.assert_allclose(result.numpy(), np.linspace(-1, 1, 1001) * total, rtol=1e-3, atol=1e-3)
        sent, ctx = hvd.Compression.fp16.compress(x)
        assert sent.dtype == tf.float16 and ctx == tf.float32
        ints = tf.range(4)
        assert hvd.Compression.fp16.compress(ints)[0] is ints

    yield f"{mode} fp16 compression", fp16_compression

    def indexed_slices():
        # Horovod: values and indices allgathered; Average divides the values by the set size.
        values = tf.fill([2, 3], float(rank + 1))
        slices = tf.IndexedSlices(
            values, tf.constant([rank, rank + 1], tf.int64), dense_shape=tf.constant([9, 3], tf.int64)
        )

        def reduce(v):
            s = tf.IndexedSlices(v, slices.indices, slices.dense_shape)
            out = hvd.allreduce(s)
            return out.values, out.indices

        gathered_values, gathered_indices = run(mode, reduce, values)
        assert gathered_indices.numpy().tolist() == [i for r in range(size) for i in (r, r + 1)]
        expected = np.repeat(np.arange(1, size + 1, dtype=np.float32), 2)[:, None] / size * np.ones(3)
        np.testing.assert_allclose(gathered_values.numpy(), expected)
        dense = tf.convert_to_tensor(tf.IndexedSlices(gathered_values, gathered_indices, slices.dense_shape))
        assert dense.shape == (9, 3)

    yield f"{mode} IndexedSlices", indexed_slices

    def process_set():
        evens = hvd.add_process_set(list(range(0, size, 2)))
        if evens.included():
            members = evens.size()
            result = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=evens), tf.ones(3))
            assert result.numpy().tolist() == [members] * 3
            gathered = run(mode, lambda t: hvd.allgather(t, process_set=evens), tf.constant([rank]))
            assert gathered.numpy().tolist() == list(range(0, size, 2))
            assert int(run(mode, lambda: hvd.size_op(evens.process_set_id))) == members
        assert int(run(mode, lambda: hvd.process_set_included_op(evens.process_set_id))) == int(evens.included())
        hvd.remove_process_set(evens)

    yield f"{mode} process sets", process_set

    def graph_constants():
        values = run(mode, lambda: tf.stack([hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op()]))
        assert values.dtype == tf.int32
        assert values.numpy().tolist() == [size, rank, hvd.local_size(), hvd.local_rank()]

    yield f"{mode} size_op, rank_op, ...", graph_constants

    def variables():
        v = tf.Variable(tf.fill([3, 2], float(rank)))
        w = tf.Variable(tf.constant([rank, rank], tf.int64))

        def from_last() -> None:
            hvd.broadcast_variables([v, w], root_rank=size - 1)

        def from_first() -> None:
            hvd.broadcast_([v], 0)

        run(mode, from_last)
        assert np.all(v.numpy() == size - 1) and w.numpy().tolist() == [size - 1] * 2
        v.assign(tf.fill([3, 2], float(rank)))
        run(mode, from_first)
        assert np.all(v.numpy() == 0)

    yield f"{mode} broadcast_variables, broadcast_", variables


def eager_only_cases(rank: int, size: int):
    def objects_join_barrier():
        assert hvd.broadcast_object({"from": rank}, root_rank=size - 1) == {"from": size - 1}
        assert hvd.broadcast_object_fn(root_rank=0)(rank) == 0
        assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
        hvd.barrier()
        for _ in range(rank + 1):  # ranks run out of batches at different times
            hvd.allreduce(tf.ones(1), name="uneven")
        last = hvd.join()
        assert last.dtype == tf.int32 and int(last) == size - 1

    yield "objects, barrier, join", objects_join_barrier

    def errors():
        for call, kind, text in [
            (lambda: hvd.allreduce(tf.ones(2, tf.complex64)), TypeError, "does not support dtype complex64"),
            (lambda: hvd.allreduce(tf.ones(2), op=hvd.Sum, average=True), ValueError, "not both"),
            (lambda: hvd.broadcast(tf.ones(2), root_rank=size), ValueError, f"root_rank={size} is not a rank"),
            (lambda: hvd.alltoall(tf.ones(3), splits=[3] + [1] * (size - 1)), ValueError, "must hold"),
            (lambda: hvd.allgather(tf.constant(1.0)), ValueError, "at least one dimension"),
            (lambda: hvd.grouped_allreduce(tf.ones(2)), TypeError, "expects a list of tensors"),
            (lambda: hvd.allreduce(tf.ones(2), op="sum"), TypeError, "op must be one of"),
            (lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0),
             ValueError, "needs op=Average"),
        ]:  # fmt: skip
            try:
                call()
            except kind as exc:
                assert text in str(exc), (text, str(exc))
            else:
                raise AssertionError(f"no error for {text!r}")

    yield "argument errors", errors

    def mismatch_fails_every_rank():
        # Eagerly the engine's RequestError; in a graph, TensorFlow's error carrying its message. No hang either way.
        try:
            hvd.allreduce(tf.zeros(rank + 1), name="mismatched")
        except hvd.HoraError as exc:
            assert "rank 0 has shape (1,) but rank 1 has shape (2,)" in str(exc), exc
        else:
            assert size == 1, "a shape mismatch was not detected"
        try:
            tf.function(lambda t: hvd.allreduce(t, name="mismatched.graph"))(tf.zeros(rank + 1))
        except tf.errors.OpError as exc:
            assert "rank 0 has shape (1,) but rank 1 has shape (2,)" in str(exc), exc
        else:
            assert size == 1, "a shape mismatch was not detected in a graph"
        assert hvd.allreduce(tf.ones(3), op=hvd.Sum).numpy().tolist() == [size] * 3  # the job goes on

    yield "a mismatch fails every rank", mismatch_fails_every_rank

    def xla_is_refused_at_trace_time():
        for collective in (hvd.allreduce, hvd.allgather, lambda t: hvd.broadcast(t, 0)):
            try:
                tf.function(collective, jit_compile=True)(tf.ones([2]))
            except hvd.HoraError as exc:
                assert "jit_compile=True" in str(exc) and "jit_compile=False" in str(exc), exc
            else:
                raise AssertionError("a collective traced under XLA was not refused")

    yield "XLA is refused at trace time", xla_is_refused_at_trace_time

    def v1_graph_session():
        # tf.compat.v1 graphs and sessions, where Horovod's ops ran too.
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None])
            reduced = hvd.allreduce(x, op=hvd.Sum)
            v = tf.compat.v1.get_variable("v", initializer=tf.fill([2], float(rank)), use_resource=True)
            sync = hvd.broadcast_global_variables(size - 1)
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                assert session.run(reduced, {x: [1.0, rank]}).tolist() == [size, size * (size - 1) / 2]
                session.run(sync)
                assert session.run(v).tolist() == [size - 1] * 2
        # A Session runs ops with no data dependency side by side: several collectives in one run must not collide.
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [3])
            sums = [hvd.allreduce(x * (i + 1), op=hvd.Sum) for i in range(6)]
            sums += hvd.grouped_allreduce([x, x * 10], op=hvd.Sum)
            with tf.compat.v1.Session() as session:
                for _ in range(30):
                    values = session.run(sums, {x: [rank, 1.0, 2.0]})
                    expected = np.array([size * (size - 1) / 2, size, 2 * size])
                    for value, factor in zip(values, [1, 2, 3, 4, 5, 6, 1, 10], strict=True):
                        np.testing.assert_allclose(value, expected * factor)

    yield "tf.compat.v1 graph session", v1_graph_session

    def v1_distributed_optimizer():
        # Horovod's TF1 recipe: minimize() with averaged gradients, the variables synced by the session hook.
        graph = tf.Graph()
        with graph.as_default():
            v = tf.compat.v1.get_variable("w", initializer=tf.fill([3], float(rank)), use_resource=True)
            loss = tf.reduce_sum(v * (rank + 1.0))  # gradient (rank + 1) on each rank: averaged, (size + 1) / 2
            optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
            train = optimizer.minimize(loss)
            hooks = [hvd.BroadcastGlobalVariablesHook(0)]
            with tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
                session.run(train)
                value = session.run(v)
        np.testing.assert_allclose(value, 0.0 - 0.5 * (size + 1) / 2)  # rank 0's start, one averaged step
        keras_optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))  # Keras ones go to hora.keras
        assert "DistributedOptimizer" in str(type(keras_optimizer).__mro__), type(keras_optimizer).__mro__

    yield "DistributedOptimizer (tf.compat.v1 and Keras)", v1_distributed_optimizer


if __name__ == "__main__":
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sys.exit(run_cases(cases))
