"""Worker script: every hora.torch collective x dtype (x op) between processes, against numpy.

Run under horarun; each rank builds every rank's inputs from seeds, computes
the reference itself (tests.reference, float64) and checks its own result.
Also: the async, in-place and grouped forms, non-contiguous inputs, scale
factors, process sets, fp16 compression and argument errors. Prints one
summary line per rank and exits non-zero if a case failed.
"""

from __future__ import annotations

import gc
import sys

import hora.torch as hvd
import ml_dtypes
import numpy as np
import torch

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


def to_torch(array: np.ndarray) -> torch.Tensor:
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


def check(actual: torch.Tensor, expected: np.ndarray, dtype: np.dtype) -> None:
    assert isinstance(actual, torch.Tensor), type(actual)
    assert actual.dtype == to_torch(np.zeros(1, dtype)).dtype, (actual.dtype, dtype)
    values = actual.float().numpy().astype(np.float64) if dtype.name == "bfloat16" else actual.numpy()
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(values.astype(np.float64), expected.astype(dtype).astype(np.float64))
    else:
        tol = tolerance(dtype)
        np.testing.assert_allclose(values.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


def cases(rank: int, size: int):
    for dtype in DTYPES:
        for op in OPS:
            if dtype == np.bool_ and op == "AVERAGE":
                continue
            for count in COUNTS:

                def allreduce(dtype=dtype, op=op, count=count):
                    inputs = [make_input(dtype, count, r).reshape(count, 1) for r in range(size)]
                    expected = reduce_reference([x.reshape(-1) for x in inputs], op).reshape(count, 1)
                    hop = getattr(hvd, op.title())
                    x = to_torch(inputs[rank])
                    before = x.clone()
                    check(hvd.allreduce(x, op=hop), expected, dtype)
                    assert torch.equal(x, before), "allreduce changed its input"
                    check(hvd.synchronize(hvd.allreduce_async(x, op=hop)), expected, dtype)
                    assert hvd.allreduce_(x, op=hop) is x
                    check(x, expected, dtype)

                yield f"allreduce {dtype} {op} {count}", allreduce

        def allgather(dtype=dtype):
            inputs = [make_input(dtype, 3 * (r + 1), r).reshape(r + 1, 3) for r in range(size)]
            expected = np.concatenate(inputs).astype(np.float64)
            check(hvd.allgather(to_torch(inputs[rank])), expected, dtype)
            check(hvd.synchronize(hvd.allgather_async(to_torch(inputs[rank]))), expected, dtype)

        yield f"allgather {dtype}", allgather

        def broadcast(dtype=dtype):
            for root in range(size):
                inputs = [make_input(dtype, 11, r) for r in range(size)]
                x = to_torch(inputs[rank])
                check(hvd.broadcast(x, root_rank=root), inputs[root].astype(np.float64), dtype)
                check(x, inputs[rank].astype(np.float64), dtype)  # unchanged
                assert hvd.broadcast_(x, root_rank=root) is x
                check(x, inputs[root].astype(np.float64), dtype)

        yield f"broadcast {dtype}", broadcast

        def alltoall(dtype=dtype):
            splits = [[(r + p) % 3 for p in range(size)] for r in range(size)]
            inputs = [make_input(dtype, sum(splits[r]) * 2, r).reshape(-1, 2) for r in range(size)]
            output, received = hvd.alltoall(to_torch(inputs[rank]), splits=torch.tensor(splits[rank]))
            check(output, alltoall_reference(inputs, splits, rank), dtype)
            assert received.tolist() == [splits[p][rank] for p in range(size)]

        yield f"alltoall {dtype}", alltoall

        def reducescatter(dtype=dtype):
            op = "MAX" if dtype == np.bool_ else "SUM"
            inputs = [make_input(dtype, 2 * (size + 1), r).reshape(size + 1, 2) for r in range(size)]
            expected = reduce_reference(inputs, op)
            result = hvd.reducescatter(to_torch(inputs[rank]), op=getattr(hvd, op.title()))
            check(result, expected[reducescatter_slice(size + 1, size, rank)], dtype)

        yield f"reducescatter {dtype}", reducescatter

    yield from more_cases(rank, size)


def more_cases(rank: int, size: int):
    def even_alltoall_returns_a_tensor():
        x = torch.arange(2 * size, dtype=torch.float32) + 100 * rank
        output = hvd.alltoall(x)
        assert isinstance(output, torch.Tensor)
        expected = [100 * p + 2 * rank + i for p in range(size) for i in range(2)]
        assert output.tolist() == expected, output

    yield "alltoall without splits", even_alltoall_returns_a_tensor

    def grouped():
        xs = [torch.full((n,), float(rank + 1)) for n in (1, 5, 1000)]
        total = size * (size + 1) / 2
        for result in hvd.grouped_allreduce(xs, op=hvd.Sum):
            assert torch.all(result == total)
        assert all(torch.all(x == rank + 1) for x in xs)
        assert hvd.grouped_allreduce_(xs, op=hvd.Average) is not None
        assert all(torch.allclose(x, torch.tensor(total / size)) for x in xs)
        gathered = hvd.grouped_allgather([torch.full((rank + 1, 2), rank), torch.ones(1)])
        assert gathered[0].shape == (size * (size + 1) // 2, 2) and gathered[1].shape == (size,)
        pieces = hvd.grouped_reducescatter([torch.ones(size, 3), torch.ones(2 * size)], op=hvd.Sum)
        assert torch.all(pieces[0] == size) and pieces[0].shape == (1, 3) and pieces[1].shape == (2,)
        handle = hvd.grouped_allreduce_async_([torch.ones(3)], op=hvd.Sum)
        assert hvd.synchronize(handle)[0].tolist() == [size] * 3

    yield "grouped forms", grouped

    def non_contiguous_in_place():
        base = torch.arange(12, dtype=torch.float64).reshape(3, 4) * (rank + 1)
        view = base.t()  # not contiguous: staged through a copy and written back
        hvd.allreduce_(view, op=hvd.Sum)
        expected = torch.arange(12, dtype=torch.float64).reshape(3, 4) * (size * (size + 1) / 2)
        assert torch.equal(base, expected), base
        column = torch.zeros(4, 3)
        column[:, 1] = rank + 5
        hvd.broadcast_(column[:, 1], root_rank=size - 1)
        assert torch.all(column[:, 1] == size + 4) and torch.all(column[:, 0] == 0)

    yield "non-contiguous in place", non_contiguous_in_place

    def scale_factors_and_average():
        x = torch.full((5,), rank + 1.0)
        result = hvd.allreduce(x, op=hvd.Average, prescale_factor=2.0, postscale_factor=3.0)
        assert torch.allclose(result, torch.full((5,), 6.0 * (size + 1) / 2))
        assert torch.allclose(hvd.allreduce(x, average=False), torch.full((5,), size * (size + 1) / 2))
        assert torch.allclose(hvd.allreduce(x, average=True), torch.full((5,), (size + 1) / 2))

    yield "scale factors and average=", scale_factors_and_average

    def one_call_and_checked_paths_together():
        # Odd ranks pass plain CPU tensors (one native call each), even ranks tensors only the checked path
        # takes (non-contiguous, or recorded by autograd): the two must make the same requests.
        fast = rank % 2 == 1
        with checked_calls() as checked:
            x = torch.full((2, 2), rank + 1.0)
            version = x._version
            target = x if fast else x.t()
            assert hvd.allreduce_(target, op=hvd.Sum, name="paths.in_place") is target
            assert torch.all(x == size * (size + 1) / 2) and x._version > version
            y = torch.full((4,), rank + 1.0, requires_grad=not fast)
            result = hvd.allreduce(y, name="paths.copy")
            assert torch.allclose(result, torch.full((4,), (size + 1) / 2)) and result.requires_grad != fast
            z = torch.full((10,), rank, dtype=torch.int32)
            target = z[:5] if fast else z[::2]
            assert hvd.broadcast_(target, root_rank=0) is target and torch.all(target == 0)
            w = torch.full((2,), float(rank), requires_grad=not fast)
            assert torch.all(hvd.broadcast(w, root_rank=size - 1) == size - 1)
        assert checked == ([] if fast else ["allreduce", "allreduce", "broadcast", "broadcast"]), checked

    yield "one-call and checked paths together", one_call_and_checked_paths_together

    def fp16_compression():
        x = torch.linspace(-1, 1, 1001, dtype=torch.float32) * (rank + 1)
        result = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
        assert result.dtype == torch.float32
        expected = torch.linspace(-1, 1, 1001) * (size * (size + 1) / 2)
        assert torch.allclose(result, expected, rtol=1e-3, atol=1e-3)
        sent, ctx = hvd.Compression.fp16.compress(x)
        assert sent.dtype == torch.float16 and ctx == torch.float32
        ints = torch.arange(4)
        assert hvd.Compression.fp16.compress(ints)[0] is ints  # only floating point is compressed
        array, np_ctx = hvd.Compression.fp16.compress(np.ones(3))
        assert array.dtype == np.float16 and hvd.Compression.fp16.decompress(array, np_ctx).dtype == np.float64

    yield "fp16 compression", fp16_compression

    def process_set():
        evens = hvd.add_process_set(list(range(0, size, 2)))
        if evens.included():
            members = evens.size()
            result = hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=evens)
            assert result.tolist() == [members] * 3
            assert hvd.allgather(torch.tensor([rank]), process_set=evens).tolist() == list(range(0, size, 2))
        hvd.remove_process_set(evens)

    yield "process sets", process_set

    def objects_poll_join_barrier():
        assert hvd.broadcast_object({"from": rank}, root_rank=size - 1) == {"from": size - 1}
        assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
        handle = hvd.allreduce_async(torch.ones(2), name="polled")
        hvd.synchronize(handle)
        assert hvd.poll(handle)
        hvd.barrier()
        for _ in range(rank + 1):  # ranks run out of batches at different times
            hvd.allreduce(torch.ones(1), name="uneven")
        assert hvd.join() == size - 1

    yield "objects, poll, barrier, join", objects_poll_join_barrier

    def dropped_handles():
        # Issue 16: handles dropped without synchronize, with their tensors, corrupted the heap.
        for i in range(20):
            hvd.allreduce_async(torch.ones(17, 17, 17), name=f"dropped.{i}")
        hvd.allreduce_async_(torch.ones(10, 10).t(), name="dropped.in_place")
        hvd.allgather_async(torch.ones(rank + 1, 50), name="dropped.gather")
        hvd.grouped_allreduce_async([torch.ones(9), torch.ones(3, 3)], name="dropped.group")
        gc.collect()
        hvd.barrier()
        assert hvd.allreduce(torch.full((4,), float(rank)), op=hvd.Sum).tolist() == [size * (size - 1) / 2] * 4

    yield "dropped handles", dropped_handles

    def errors():
        for call, text in [
            (lambda: hvd.allreduce(np.ones(3)), "expects a torch.Tensor, got ndarray"),
            (lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)), "does not support dtype torch.complex64"),
            (lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum, average=True), "not both"),
            (lambda: hvd.broadcast(torch.ones(2), root_rank=size), f"root_rank={size} is not a rank"),
            (lambda: hvd.alltoall(torch.ones(3), splits=[3] + [1] * (size - 1)), "must hold"),
            (lambda: hvd.allgather(torch.tensor(1.0)), "at least one dimension"),
        ]:
            try:
                call()
            except (TypeError, ValueError) as exc:
                assert text in str(exc), (text, str(exc))
            else:
                raise AssertionError(f"no error for {text!r}")
        try:
            hvd.allreduce(torch.zeros(rank + 1), name="mismatched")
        except ValueError as exc:
            assert "rank 0 has shape (1,) but rank 1 has shape (2,)" in str(exc), exc
        else:
            assert size == 1, "a shape mismatch was not detected"
        assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [size] * 3  # the job goes on

    yield "errors", errors


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(run_cases(cases))
