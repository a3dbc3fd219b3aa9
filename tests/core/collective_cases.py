"""Worker script: every collective x dtype x op between processes, checked against numpy.

Run under horarun; each rank builds every rank's inputs from seeds, computes
the reference itself and checks its own result. Prints a summary line and
exits non-zero if any case failed.
"""

from __future__ import annotations

import sys

import hora
import numpy as np

from tests.pages import on_pages
from tests.reference import (
    DTYPES,
    OPS,
    alltoall_reference,
    make_input,
    reduce_reference,
    reducescatter_slice,
    tolerance,
)
from tests.worker import checked_calls, run_cases

COUNTS = [0, 1, 7, 1001]


def check(actual: np.ndarray, expected: np.ndarray, dtype: np.dtype) -> None:
    assert actual.dtype == dtype, (actual.dtype, dtype)
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(actual.astype(np.float64), expected.astype(dtype).astype(np.float64))
    else:
        np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=tolerance(dtype), atol=tolerance(dtype))


def cases(rank: int, size: int):
    for dtype in DTYPES:
        for op in OPS:
            if dtype == np.bool_ and op == "AVERAGE":
                continue
            for count in COUNTS:

                def allreduce(dtype=dtype, op=op, count=count):
                    inputs = [make_input(dtype, count, r).reshape(count, 1) for r in range(size)]
                    result = hora.allreduce(inputs[rank], op=getattr(hora, op.title()))
                    check(result.reshape(-1), reduce_reference([x.reshape(-1) for x in inputs], op), dtype)

                yield f"allreduce {dtype} {op} {count}", allreduce

        def allgather(dtype=dtype):
            inputs = [make_input(dtype, 3 * (r + 1), r).reshape(r + 1, 3) for r in range(size)]
            check(hora.allgather(inputs[rank]), np.concatenate(inputs).astype(np.float64), dtype)

        yield f"allgather {dtype}", allgather

        def broadcast(dtype=dtype):
            for root in range(size):
                inputs = [make_input(dtype, 11, r) for r in range(size)]
                check(hora.broadcast(inputs[rank], root_rank=root), inputs[root].astype(np.float64), dtype)

        yield f"broadcast {dtype}", broadcast

        def alltoall(dtype=dtype):
            splits = [[(r + p) % 3 for p in range(size)] for r in range(size)]
            inputs = [make_input(dtype, sum(splits[r]) * 2, r).reshape(-1, 2) for r in range(size)]
            output, received = hora.alltoall(inputs[rank], splits=splits[rank])
            check(output, alltoall_reference(inputs, splits, rank), dtype)
            assert received.tolist() == [splits[p][rank] for p in range(size)]

        yield f"alltoall {dtype}", alltoall

        def reducescatter(dtype=dtype):
            op = "MAX" if dtype == np.bool_ else "SUM"
            inputs = [make_input(dtype, 2 * (size + 1), r).reshape(size + 1, 2) for r in range(size)]
            expected = reduce_reference(inputs, op)
            result = hora.reducescatter(inputs[rank], op=getattr(hora, op.title()))
            check(result, expected[reducescatter_slice(size + 1, size, rank)], dtype)

        yield f"reducescatter {dtype}", reducescatter

    def scale_factors():
        x = np.full(5, rank + 1.0)
        result = hora.allreduce(x, op=hora.Average, prescale_factor=2.0, postscale_factor=3.0)
        np.testing.assert_allclose(result, np.full(5, 6.0 * (size + 1) / 2))

    yield "scale factors", scale_factors

    def fast_and_checked_paths_together():
        # Odd ranks pass arguments the one-call path takes, even ranks ones only the checked path takes (numpy
        # scalar factors, a bytearray): the two must make the same requests, names included, or the ranks would not
        # match.
        fast = rank % 2 == 1
        with checked_calls() as checked:
            x = np.full(6, rank + 1.0)
            factor = 2 if fast else np.float32(2)  # both paths convert an int; only call converts a numpy scalar
            assert hora.allreduce_(x, op=hora.Sum, prescale_factor=factor, name="paths") is x
            np.testing.assert_array_equal(x, np.full(6, size * (size + 1.0)))
            y = np.full(4, rank, np.uint8) if fast else bytearray([rank] * 4)
            hora.broadcast_(y, root_rank=size - 1)
            assert list(y) == [size - 1] * 4
            z = np.full(3, rank + 1, dtype=np.int32)
            maximum = hora.allreduce(z, op=hora.Max, postscale_factor=1.0 if fast else np.float32(1))
            np.testing.assert_array_equal(maximum, np.full(3, size))
            np.testing.assert_array_equal(z, np.full(3, rank + 1))  # the copy form leaves its input as it was
        assert checked == ([] if fast else ["allreduce", "broadcast", "allreduce"]), checked

    yield "one-call and checked paths together", fast_and_checked_paths_together

    def ten_million():
        x = on_pages(np.full(10_000_000, rank + 1, dtype=np.float32), huge=True)  # its messages may pass by reference
        np.testing.assert_array_equal(hora.allreduce(x, op=hora.Sum), np.full(10_000_000, size * (size + 1) / 2))

    yield "allreduce 10M float32", ten_million

    def large_and_odd():
        # Messages far larger than a shared-memory ring, of sizes that are
        # no multiple of anything, with 2-byte elements: wrap-around and
        # message alignment in the rings.
        x = make_input(np.float16, 3_000_001, rank)
        expected = reduce_reference([make_input(np.float16, 3_000_001, r) for r in range(size)], "MAX")
        check(hora.allreduce(x, op=hora.Max), expected, np.dtype(np.float16))
        inputs = [make_input(np.int8, 700_001 * (r + 1), r) for r in range(size)]
        check(hora.allgather(inputs[rank]), np.concatenate(inputs).astype(np.float64), np.dtype(np.int8))
        check(hora.broadcast(inputs[rank][:700_001], root_rank=size - 1), inputs[size - 1][:700_001], np.dtype(np.int8))

    yield "large odd-sized messages", large_and_odd

    def objects():
        assert hora.broadcast_object({"from": rank}, root_rank=size - 1) == {"from": size - 1}
        assert hora.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
        hora.barrier()

    yield "objects and barrier", objects

    def mismatch():
        try:
            hora.allreduce(np.zeros(rank + 1))
        except ValueError as exc:
            assert "rank 0 has shape (1,) but rank 1 has shape (2,)" in str(exc), exc
        else:
            assert size == 1, "a shape mismatch was not detected"
        assert hora.allreduce(np.ones(3), op=hora.Sum).tolist() == [size] * 3  # the job goes on

    yield "shape mismatch", mismatch

    def references():
        transport = hora.basics.current_job().transport
        counts = transport.sent_by_reference() if isinstance(transport, hora._native.MeshTransport) else [0]
        print(f"rank {rank} sent by reference: {','.join(map(str, counts))}", flush=True)

    yield "messages passed by reference (reported)", references


def report_links(rank: int) -> None:
    job = hora.basics.current_job()
    print(f"rank {rank} links: {','.join(job.transport_links())}", flush=True)
    single_copy = job.transport.single_copy() if isinstance(job.transport, hora._native.MeshTransport) else [False]
    print(f"rank {rank} single copy: {','.join(str(int(flag)) for flag in single_copy)}", flush=True)
    print(f"rank {rank} hierarchical: {job.engine.hierarchical_allreduce}", flush=True)


if __name__ == "__main__":
    sys.exit(run_cases(cases, before=report_links))
