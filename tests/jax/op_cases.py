"""Worker script: hora.jax's collectives x dtype, eagerly and under jit, against numpy; their gradients; training.

Run under horarun; each rank builds every rank's inputs from seeds and
checks its own result against the reference (tests.reference, float64).
"""

from __future__ import annotations

import itertools
import re
import sys

import hora.jax as hvd
import jax
import jax.numpy as jnp
import numpy as np

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

MODES = ["eager", "jit"]


def run(mode: str, fn, *args):
    return fn(*args) if mode == "eager" else jax.jit(fn)(*args)


def check(actual: jax.Array, expected: np.ndarray, dtype: np.dtype) -> None:
    assert isinstance(actual, jax.Array), type(actual)
    assert np.dtype(actual.dtype) == dtype, (actual.dtype, dtype)
    values = np.asarray(actual).astype(np.float64)
    assert values.shape == expected.shape, (values.shape, expected.shape)
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(values, expected.astype(dtype).astype(np.float64))
    else:
        tol = tolerance(dtype)
        np.testing.assert_allclose(values, expected.astype(np.float64), rtol=tol, atol=tol)


def cases(rank: int, size: int):
    for mode in MODES:
        yield from dtype_cases(rank, size, mode)
        yield from gradient_cases(rank, size, mode)
    yield from training_cases(rank, size)


def dtype_cases(rank: int, size: int, mode: str):
    for dtype in DTYPES:
        if dtype == np.int64 or dtype == np.float64:
            continue  # JAX runs 32-bit unless jax_enable_x64: those are tested in the x64 run below
        for op in OPS:
            if dtype == np.bool_ and op == "AVERAGE":
                continue

            def allreduce(dtype=dtype, op=op):
                inputs = [make_input(dtype, 7, r).reshape(7, 1) for r in range(size)]
                expected = reduce_reference([x.reshape(-1) for x in inputs], op).reshape(7, 1)
                hop = getattr(hvd, op.title())
                check(
                    run(mode, lambda t, hop=hop: hvd.allreduce(t, op=hop), jnp.asarray(inputs[rank])), expected, dtype
                )

            yield f"{mode} allreduce {dtype} {op}", allreduce

        def allgather(dtype=dtype):
            inputs = [make_input(dtype, 3 * (r + 1), r).reshape(r + 1, 3) for r in range(size)]
            check(run(mode, hvd.allgather, jnp.asarray(inputs[rank])), np.concatenate(inputs).astype(np.float64), dtype)

        yield f"{mode} allgather {dtype}", allgather

        def broadcast(dtype=dtype):
            inputs = [make_input(dtype, 11, r) for r in range(size)]
            for root in range(size):
                result = run(mode, lambda t, root=root: hvd.broadcast(t, root), jnp.asarray(inputs[rank]))
                check(result, inputs[root].astype(np.float64), dtype)

        yield f"{mode} broadcast {dtype}", broadcast

        def reducescatter(dtype=dtype):
            op = "MAX" if dtype == np.bool_ else "SUM"
            inputs = [make_input(dtype, 2 * (size + 1), r).reshape(size + 1, 2) for r in range(size)]
            expected = reduce_reference(inputs, op)[reducescatter_slice(size + 1, size, rank)]
            result = run(mode, lambda t: hvd.reducescatter(t, op=getattr(hvd, op.title())), jnp.asarray(inputs[rank]))
            check(result, expected, dtype)

        yield f"{mode} reducescatter {dtype}", reducescatter

    def grouped():
        xs = [jnp.full((n,), float(rank + 1)) for n in (1, 5, 1000, 70_000)]  # the last crosses alone
        xs.append(jnp.full((2, 3), rank + 1, jnp.int32))
        results = run(mode, lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum), *xs)
        total = size * (size + 1) // 2
        for x, r in zip(xs, results, strict=True):
            assert r.shape == x.shape and r.dtype == x.dtype and np.all(np.asarray(r) == total), (x.shape, r)
        gathered = run(mode, lambda a, b: hvd.grouped_allgather([a, b]), jnp.full((rank + 1, 2), rank), jnp.ones(1))
        assert gathered[0].shape == (total, 2) and gathered[1].shape == (size,)

    yield f"{mode} grouped forms", grouped

    def alltoall():
        splits = [[(r + p) % 3 for p in range(size)] for r in range(size)]
        inputs = [np.arange(sum(splits[r]) * 2, dtype=np.float32).reshape(-1, 2) + 100 * r for r in range(size)]
        output, received = run(mode, lambda t: hvd.alltoall(t, splits=splits[rank]), jnp.asarray(inputs[rank]))
        check(output, alltoall_reference(inputs, splits, rank), np.dtype(np.float32))
        assert received.dtype == jnp.int32 and np.asarray(received).tolist() == [s[rank] for s in splits]
        even = run(mode, hvd.alltoall, jnp.arange(2.0 * size) + 100 * rank)
        assert np.asarray(even).tolist() == [100 * p + 2 * rank + i for p in range(size) for i in range(2)]
        # the gradient sends each row's cotangent back where the row came from
        w = np.arange(float(sum(s[rank] for s in splits) * 2)).reshape(-1, 2) * (rank + 1)
        grad = run(mode, jax.grad(lambda t: jnp.sum(hvd.alltoall(t, splits=splits[rank])[0] * w)),
                   jnp.asarray(inputs[rank]))  # fmt: skip
        every_w = hvd.allgather_object(w)
        expected = []
        for p in range(size):  # the rows this rank sent to p, in the order p received them
            start = sum(splits[q][p] for q in range(rank))
            expected.append(every_w[p][start : start + splits[rank][p]])
        np.testing.assert_allclose(np.asarray(grad), np.concatenate(expected))

    yield f"{mode} alltoall", alltoall


def gradient_cases(rank: int, size: int, mode: str):
    every = [np.arange(12.0).reshape(4, 3) * (r + 1) for r in range(size)]
    mean = sum(every) / size
    x = jnp.ones((4, 3)) * (rank + 1)

    def gradient(forward, value):
        return np.asarray(run(mode, jax.grad(lambda t: jnp.sum(forward(t))), value))

    def allreduce():
        for op, factor in ((hvd.Sum, size), (hvd.Average, 1)):
            grad = gradient(lambda t, op=op: hvd.allreduce(t, op=op, prescale_factor=0.5) * every[rank], x)
            np.testing.assert_allclose(grad, mean * factor * 0.5, rtol=1e-6)

    yield f"{mode} gradient of allreduce", allreduce

    def allgather():
        total = size * (size + 1) // 2
        weights = [np.arange(total * 3.0).reshape(total, 3) * (r + 1) for r in range(size)]
        grad = gradient(lambda t: hvd.allgather(t) * weights[rank], jnp.ones((rank + 1, 3)))
        start = rank * (rank + 1) // 2
        np.testing.assert_allclose(grad, (sum(weights) / size)[start : start + rank + 1], rtol=1e-6)

    yield f"{mode} gradient of allgather", allgather

    def broadcast():
        grad = gradient(lambda t: hvd.broadcast(t, size - 1) * every[rank], x)
        np.testing.assert_allclose(grad, mean if rank == size - 1 else 0 * mean, rtol=1e-6)

    yield f"{mode} gradient of broadcast", broadcast

    def reducescatter():
        grad = gradient(lambda t: hvd.reducescatter(t, op=hvd.Sum) * (rank + 1), jnp.ones((size, 3)))
        np.testing.assert_allclose(grad, np.repeat(np.arange(1.0, size + 1), 3).reshape(size, 3) * size)

    yield f"{mode} gradient of reducescatter", reducescatter


def training_cases(rank: int, size: int):
    def sgd_equals_global_batch():
        rng = np.random.default_rng(5)
        xs, ys = rng.normal(size=(4, size * 8, 5)).astype(np.float32), rng.normal(size=(4, size * 8)).astype(np.float32)
        params = {"w": jnp.asarray(rng.normal(size=5).astype(np.float32) * (rank + 1)), "b": jnp.zeros(())}
        params = hvd.broadcast_variables(params, root_rank=0)
        reference = jax.tree_util.tree_map(jnp.array, params)
        transform = hvd.allreduce_gradients()
        state = transform.init(params)

        def loss(p, x, y):
            return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

        @jax.jit
        def step(p, s, x, y):
            updates, s = transform.update(jax.grad(loss)(p, x, y), s, p)
            return jax.tree_util.tree_map(lambda a, u: a - 0.1 * u, p, updates), s

        @jax.jit
        def reference_step(p, x, y):
            return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p, x, y))

        mine = slice(rank * 8, (rank + 1) * 8)
        for x, y in zip(xs, ys, strict=True):
            params, state = step(params, state, x[mine], y[mine])
            reference = reference_step(reference, x, y)
        for name in ("w", "b"):
            np.testing.assert_allclose(np.asarray(params[name]), np.asarray(reference[name]), rtol=1e-5, atol=1e-6)
        for other in hvd.allgather_object(np.asarray(params["w"])):
            np.testing.assert_array_equal(other, np.asarray(params["w"]))

    yield f"{size} ranks x 8 rows == 1 x {size * 8} rows (jit, allreduce_gradients)", sgd_equals_global_batch

    def x64():
        with jax.enable_x64(True):
            for dtype in (np.int64, np.float64):
                inputs = [make_input(np.dtype(dtype), 5, r) for r in range(size)]
                expected = reduce_reference(inputs, "SUM")
                check(jax.jit(lambda t: hvd.allreduce(t, op=hvd.Sum))(jnp.asarray(inputs[rank])), expected,
                      np.dtype(dtype))  # fmt: skip

    yield "int64 and float64 under jax_enable_x64", x64

    def fp16_compression_under_jit():
        transform = hvd.allreduce_gradients(op=hvd.Sum, compression=hvd.Compression.fp16)
        grads = {"w": jnp.linspace(-1.0, 1.0, 101) * (rank + 1)}
        updates, _ = jax.jit(transform.update)(grads, transform.init(grads))
        assert updates["w"].dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(updates["w"]), np.linspace(-1, 1, 101) * size * (size + 1) / 2,
                                   rtol=1e-3, atol=1e-3)  # fmt: skip

    yield "fp16 compression under jit", fp16_compression_under_jit

    def program_order_under_jit():
        # Twelve independent allreduces in one jit, behind chains whose lengths differ by rank, so the programs
        # differ. XLA may run independent side-effecting callbacks in any order (measured, one output each:
        # [0..5, 11..6]); each crossing takes the one before's marker, so the order is the program's everywhere.
        from hora.jax import collectives

        @jax.jit
        def step(xs):
            outs = []
            for k, x in enumerate(xs):
                busy = x
                for _ in range(3 * (12 - k if rank % 2 == 0 else k + 1)):
                    busy = jnp.sin(busy) * 1.01
                x = x + (busy * 0).astype(x.dtype)  # the chain's length, not its value, reaches x
                outs.append(hvd.allreduce(x, op=hvd.Sum))  # unnamed: the k-th of every rank are paired
            return outs

        xs = [jnp.full(4, k + 100 * rank, jnp.float32 if k % 2 else jnp.int32) for k in range(12)]
        text = step.lower(xs).as_text()
        calls = re.findall(r"(%\w+):(\d+) = stablehlo.custom_call @xla_buffer_python_cpu_callback\(([^)]*)\)", text)
        assert len(calls) == 12, text
        for (before, results, _), (_, _, operands) in itertools.pairwise(calls):
            assert operands.split(", ")[-1] == f"{before}#{int(results) - 1}", (before, operands)

        order: list[int] = []
        host_group = collectives.host_group

        def logged(collective, inputs, **kwargs):
            order.append(int(np.asarray(inputs[0]).flat[0]) - 100 * rank)
            return host_group(collective, inputs, **kwargs)

        collectives.host_group = logged
        try:
            results = step(xs)
        finally:
            collectives.host_group = host_group
        assert order == list(range(12)), order
        for k, result in enumerate(results):
            assert np.asarray(result).tolist() == [k * size + 100 * sum(range(size))] * 4, (k, result)

    yield "independent collectives of one jit run in program order", program_order_under_jit

    def in_place_under_jit_keeps_the_programs_values():
        # Under jit an allreduce works in its input's own buffer (hora.jax.crossing): where the input is read
        # again afterwards or is a constant, XLA copies it there first (a jit argument: the case below).
        from hora.jax import collectives

        n = 70_000  # crosses alone, not packed
        x = jnp.arange(n, dtype=jnp.float32) + rank
        kept = np.asarray(x).copy()
        constant = np.full(n, float(rank + 1), np.float32)

        @jax.jit
        def step(t):
            g = jnp.sin(t)
            return hvd.allreduce(g, op=hvd.Sum) + g, hvd.allreduce(jnp.asarray(constant), op=hvd.Sum)

        in_place: list[bool] = []
        host_group = collectives.host_group

        def logged(collective, inputs, **kwargs):
            in_place.append(inputs is kwargs.get("outputs"))
            return host_group(collective, inputs, **kwargs)

        sines = sum(np.sin(np.arange(n, dtype=np.float32) + r) for r in range(size))
        collectives.host_group = logged
        try:
            for _ in range(2):  # a constant the first run changed would show in the second
                summed, of_constant = step(x)
                np.testing.assert_allclose(np.asarray(summed), sines + np.sin(kept), rtol=1e-5, atol=1e-5)
                np.testing.assert_array_equal(np.asarray(of_constant), np.full(n, size * (size + 1) / 2))
        finally:
            collectives.host_group = host_group
        assert in_place == [True] * 4, in_place

    yield "allreduce in place under jit, the program's values kept", in_place_under_jit_keeps_the_programs_values

    def inputs_left_as_they_were_under_jit():
        # The crossing works on XLA's own buffers; a jit argument must come back unchanged from every collective.
        x = jnp.arange(6.0) + rank
        summed, root, gathered = jax.jit(lambda t: [hvd.allreduce(t, op=hvd.Sum), hvd.broadcast(t, 0),
                                                    hvd.allgather(t)])(x)  # fmt: skip
        assert np.asarray(x).tolist() == (np.arange(6.0) + rank).tolist()
        assert np.asarray(summed).tolist() == (np.arange(6.0) * size + sum(range(size))).tolist()
        assert np.asarray(root).tolist() == np.arange(6.0).tolist()
        assert np.asarray(gathered).tolist() == np.concatenate([np.arange(6.0) + r for r in range(size)]).tolist()

    yield "inputs left as they were under jit", inputs_left_as_they_were_under_jit

    def broadcast_variables_of_every_dtype():
        tree = {"w": jnp.full(3, float(rank)), "seed": jnp.array([rank, 7], dtype=jnp.uint32), "n": jnp.int32(rank)}
        got = hvd.broadcast_variables(tree, root_rank=size - 1)
        assert got["seed"].dtype == jnp.uint32 and np.asarray(got["seed"]).tolist() == [size - 1, 7]
        assert np.asarray(got["w"]).tolist() == [size - 1.0] * 3 and int(got["n"]) == size - 1

    yield "broadcast_variables of every dtype (uint32 seeds too)", broadcast_variables_of_every_dtype

    def errors():
        for call, kind, text in [
            (lambda: hvd.allreduce(jnp.ones(2, jnp.complex64)), TypeError, "does not support dtype complex64"),
            (lambda: hvd.allreduce(jnp.ones(2), op=hvd.Sum, average=True), ValueError, "not both"),
            (lambda: hvd.broadcast(jnp.ones(2), root_rank=size), ValueError, f"root_rank={size} is not a rank"),
            (lambda: hvd.allgather(jnp.ones(())), ValueError, "at least one dimension"),
            (lambda: hvd.grouped_allreduce(jnp.ones(2)), TypeError, "expects a list of arrays"),
            (lambda: jax.grad(lambda t: jnp.sum(hvd.allreduce(t, op=hvd.Max)))(jnp.ones(2)), RuntimeError,
             "only Sum and Average are differentiable"),
        ]:  # fmt: skip
            try:
                call()
            except kind as exc:
                assert text in str(exc), (text, str(exc))
            else:
                raise AssertionError(f"no error for {text!r}")

    yield "argument errors", errors


if __name__ == "__main__":
    sys.exit(run_cases(cases))
