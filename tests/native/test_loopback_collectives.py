"""The collective algorithms over the in-process loopback transport (ranks as threads)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from hora import _native

from tests.reference import DTYPES, OPS, make_input, reduce_reference, tolerance

WORLDS = [1, 2, 3, 4]
COUNTS = [0, 1, 7, 1001, 300_003]
NATIVE_DTYPE = {
    "uint8": _native.DataType.UINT8,
    "int8": _native.DataType.INT8,
    "int16": _native.DataType.INT16,
    "int32": _native.DataType.INT32,
    "int64": _native.DataType.INT64,
    "float16": _native.DataType.FLOAT16,
    "bfloat16": _native.DataType.BFLOAT16,
    "float32": _native.DataType.FLOAT32,
    "float64": _native.DataType.FLOAT64,
    "bool": _native.DataType.BOOL,
}


def run_ranks(size: int, fn: Callable[[_native.Transport, int], object]) -> list[object]:
    group = _native.LoopbackGroup(size, 20.0)
    results: list[object] = [None] * size
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(group.transport(rank), rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def raw(array: np.ndarray) -> np.ndarray:
    """ml_dtypes.bfloat16 has no buffer-protocol format; pass its bits as uint16."""
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def check_close(actual: np.ndarray, expected: np.ndarray, dtype: np.dtype) -> None:
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(actual.astype(np.float64), expected.astype(dtype).astype(np.float64))
    else:
        np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=tolerance(dtype), atol=tolerance(dtype))


ALLREDUCE_CASES = [(dtype, op) for dtype in DTYPES for op in OPS if not (dtype == np.bool_ and op == "AVERAGE")]


@pytest.mark.parametrize("size", WORLDS)
@pytest.mark.parametrize(("dtype", "op"), ALLREDUCE_CASES, ids=str)
@pytest.mark.parametrize("count", COUNTS)
def test_allreduce(size: int, dtype: np.dtype, op: str, count: int) -> None:
    inputs = [make_input(dtype, count, r) for r in range(size)]
    buffers = [x.copy() for x in inputs]
    run_ranks(
        size,
        lambda t, r: _native.allreduce(t, raw(buffers[r]), NATIVE_DTYPE[dtype.name], getattr(_native.ReduceOp, op)),
    )
    expected = reduce_reference(inputs, op)
    for buffer in buffers:
        check_close(buffer, expected, dtype)


@pytest.mark.parametrize("size", WORLDS)
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)], ids=str)
def test_allreduce_scale_factors(size: int, dtype: np.dtype) -> None:
    inputs = [make_input(dtype, 1001, r) for r in range(size)]
    buffers = [x.copy() for x in inputs]
    run_ranks(
        size,
        lambda t, r: _native.allreduce(t, raw(buffers[r]), NATIVE_DTYPE[dtype.name], _native.ReduceOp.SUM, 2.0, 0.5),
    )
    for buffer in buffers:
        check_close(buffer, reduce_reference(inputs, "SUM", 2.0, 0.5), dtype)


@pytest.mark.parametrize("size", WORLDS)
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize(("op", "postscale"), [("AVERAGE", 1.0), ("AVERAGE", 0.3), ("SUM", 0.3), ("MAX", -2.5)])
def test_the_ring_finishes_while_reducing_with_the_bits_of_a_pass_of_its_own(
    size: int, dtype: np.dtype, op: str, postscale: float
) -> None:
    """The ring's last reduction of each element applies Average's division and the postscale factor in the same
    pass: the result is exactly the plain reduction times the factor, rounded once (as numpy multiplies)."""
    inputs = [make_input(dtype, 300_003, r) for r in range(size)]
    plain, finished = [x.copy() for x in inputs], [x.copy() for x in inputs]
    native = NATIVE_DTYPE[dtype.name]
    plain_op = getattr(_native.ReduceOp, "SUM" if op == "AVERAGE" else op)
    run_ranks(size, lambda t, r: _native.allreduce(t, plain[r], native, plain_op))
    run_ranks(
        size, lambda t, r: _native.allreduce(t, finished[r], native, getattr(_native.ReduceOp, op), 1.0, postscale)
    )
    factor = postscale / size if op == "AVERAGE" else postscale
    # float16 is scaled in float32 (reduce.cc), then rounded back.
    wide = np.float32 if dtype == np.float16 else dtype.type
    expected = plain[0].astype(wide) * wide(factor)
    for buffer in finished:
        np.testing.assert_array_equal(buffer.view(np.uint8), expected.astype(dtype).view(np.uint8))


def test_the_ring_allreduce_sends_each_finished_segment_before_its_block_is_complete() -> None:
    """The ring's two phases are one pipeline (ring.cc): rank 0 sends the first finished segment of its own block to
    the right while the rest of that block is still to come. Rank 1 is scripted through the group's queues and holds
    back its contribution to the rest of rank 0's block until that segment has arrived; a ring that waits for the
    whole block before its allgather never sends it, and the scripted receive times out."""
    segment = 256 * 1024 // 4  # float32s in one pipeline segment (segments.h)
    half = 3 * segment  # each rank's block: three segments
    group = _native.LoopbackGroup(2, 5.0)
    mine = np.arange(2 * half, dtype=np.float32)
    theirs = np.linspace(-1.0, 1.0, 2 * half, dtype=np.float32)
    expected = mine + theirs
    result = mine.copy()
    failures: list[BaseException] = []

    def rank0() -> None:
        try:
            _native.allreduce(group.transport(0), result, _native.DataType.FLOAT32, _native.ReduceOp.SUM)
        except BaseException as failure:  # reported by the main thread
            failures.append(failure)

    def pop_floats() -> np.ndarray:
        return np.frombuffer(group.pop(0, 1), np.float32)

    def segments(array: np.ndarray, start: int) -> list[np.ndarray]:
        return [array[start + k * segment : start + (k + 1) * segment] for k in range(3)]

    thread = threading.Thread(target=rank0)
    thread.start()
    try:
        # Rank 0 opens with its contribution to rank 1's block, in segments.
        for sent in segments(mine, half):
            np.testing.assert_array_equal(pop_floats(), sent)
        theirs_for_0 = segments(theirs, 0)
        group.push(1, 0, theirs_for_0[0])
        # Only the first segment of block 0 is complete, and rank 0 sends it on at once.
        np.testing.assert_array_equal(pop_floats(), segments(expected, 0)[0])
        for k in (1, 2):
            group.push(1, 0, theirs_for_0[k])
            np.testing.assert_array_equal(pop_floats(), segments(expected, 0)[k])
        for finished in segments(expected, half):  # rank 1's block, as rank 1 finishes it
            group.push(1, 0, finished)
    finally:
        thread.join(30)
    assert not thread.is_alive(), "rank 0 was still running after 30 s"
    assert not failures, failures
    np.testing.assert_array_equal(result, expected)


def test_a_scripted_peer_names_ranks_of_the_group() -> None:
    group = _native.LoopbackGroup(2, 1.0)
    with pytest.raises(ValueError, match="Rank 2 is not in this loopback group of size 2"):
        group.push(0, 2, np.ones(1, np.float32))
    with pytest.raises(ValueError, match="Rank -1 is not in this loopback group of size 2"):
        group.pop(-1, 0)


@pytest.mark.parametrize("size", [5, 6, 7, 8])
@pytest.mark.parametrize("op", ["SUM", "MIN", "PRODUCT"])
def test_allreduce_small_buffers_on_larger_worlds(size: int, op: str) -> None:
    """Recursive doubling with 1, 2 and 3 ranks beyond a power of two (they pair up first), and without."""
    inputs = [make_input(np.dtype(np.float64), 513, r) for r in range(size)]
    buffers = [x.copy() for x in inputs]
    run_ranks(
        size, lambda t, r: _native.allreduce(t, buffers[r], _native.DataType.FLOAT64, getattr(_native.ReduceOp, op))
    )
    for buffer in buffers:
        np.testing.assert_array_equal(buffer, reduce_reference(inputs, op))


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("op", ["SUM", "MIN", "MAX"])
@pytest.mark.parametrize("count", [1000, 100_000], ids=["recursive-doubling", "ring"])
def test_allreduce_gives_every_rank_the_same_bits(size: int, op: str, count: int) -> None:
    """Inexact float sums, NaN and signed zeros: min(0.0, -0.0) and min(x, nan) depend on the operand
    order, so every rank must combine the partial results in the same order."""
    rng = np.random.default_rng(size)
    inputs = [(rng.standard_normal(count) * 10.0 ** rng.integers(-8, 8, count)).astype(np.float32) for _ in range(size)]
    for r, x in enumerate(inputs):
        x[r::7] = np.nan if r % 2 else -0.0
        x[(r + 3) :: 11] = 0.0
    buffers = [x.copy() for x in inputs]
    run_ranks(
        size, lambda t, r: _native.allreduce(t, buffers[r], _native.DataType.FLOAT32, getattr(_native.ReduceOp, op))
    )
    for buffer in buffers[1:]:
        np.testing.assert_array_equal(buffer.view(np.uint32), buffers[0].view(np.uint32))


@pytest.mark.parametrize("size", [2, 3])
def test_allreduce_ten_million_elements(size: int) -> None:
    count = 10_000_001
    buffers = [np.full(count, r + 1, dtype=np.float32) for r in range(size)]
    buffers[0][::1000] = 7
    run_ranks(size, lambda t, r: _native.allreduce(t, buffers[r], _native.DataType.FLOAT32, _native.ReduceOp.SUM))
    expected = np.full(count, size * (size + 1) / 2, dtype=np.float32)
    expected[::1000] += 6
    for buffer in buffers:
        np.testing.assert_array_equal(buffer, expected)


def test_bool_average_is_rejected() -> None:
    with pytest.raises(ValueError, match="Average is not defined for bool"):
        run_ranks(
            1, lambda t, r: _native.allreduce(t, np.zeros(3, bool), _native.DataType.BOOL, _native.ReduceOp.AVERAGE)
        )


@pytest.mark.parametrize("size", WORLDS)
@pytest.mark.parametrize(("dtype", "op"), ALLREDUCE_CASES, ids=str)
@pytest.mark.parametrize("rows", [0, 1, 5, 9])
def test_reducescatter(size: int, dtype: np.dtype, op: str, rows: int) -> None:
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    inputs = [make_input(dtype, rows, r) for r in range(size)]
    buffers = [x.copy() for x in inputs]
    run_ranks(
        size,
        lambda t, r: _native.reducescatter(
            t, raw(buffers[r]), counts, NATIVE_DTYPE[dtype.name], getattr(_native.ReduceOp, op)
        ),
    )
    expected = reduce_reference(inputs, op)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for r, buffer in enumerate(buffers):
        check_close(buffer[offsets[r] : offsets[r + 1]], expected[offsets[r] : offsets[r + 1]], dtype)


@pytest.mark.parametrize("size", WORLDS)
@pytest.mark.parametrize("per_rank", [[0, 0, 0, 0], [1, 2, 3, 4], [5, 0, 700_001, 3]])
def test_allgather_variable_blocks(size: int, per_rank: list[int]) -> None:
    counts = per_rank[:size]
    inputs = [np.arange(counts[r], dtype=np.float64) + 1000 * r for r in range(size)]
    outputs = [np.empty(sum(counts), dtype=np.float64) for _ in range(size)]
    run_ranks(size, lambda t, r: _native.allgather(t, inputs[r], outputs[r], [c * 8 for c in counts]))
    expected = np.concatenate(inputs)
    for output in outputs:
        np.testing.assert_array_equal(output, expected)


@pytest.mark.parametrize("size", WORLDS)
@pytest.mark.parametrize("count", [0, 1, 13, 1_000_003])
def test_broadcast_from_every_root(size: int, count: int) -> None:
    for root in range(size):
        buffers = [np.full(count, r, dtype=np.int32) for r in range(size)]
        run_ranks(size, lambda t, r, root=root, buffers=buffers: _native.broadcast(t, buffers[r], root))
        for buffer in buffers:
            np.testing.assert_array_equal(buffer, np.full(count, root, dtype=np.int32))


def test_broadcast_bad_root() -> None:
    with pytest.raises(ValueError, match="root rank 5 is outside"):
        run_ranks(1, lambda t, r: _native.broadcast(t, np.zeros(2), 5))


@pytest.mark.parametrize("size", WORLDS)
def test_alltoall_with_splits(size: int) -> None:
    # Rank r sends (r + p) % 3 elements, each valued 100 * r + p, to rank p.
    send = [[(r + p) % 3 for p in range(size)] for r in range(size)]
    inputs = [np.concatenate([np.full(send[r][p], 100 * r + p, np.int64) for p in range(size)]) for r in range(size)]
    recv = [[send[p][r] for p in range(size)] for r in range(size)]
    outputs = [np.empty(sum(recv[r]), np.int64) for r in range(size)]
    run_ranks(
        size,
        lambda t, r: _native.alltoall(t, inputs[r], [8 * c for c in send[r]], outputs[r], [8 * c for c in recv[r]]),
    )
    for r in range(size):
        expected = np.concatenate([np.full(send[p][r], 100 * p + r, np.int64) for p in range(size)])
        np.testing.assert_array_equal(outputs[r], expected)


@pytest.mark.parametrize("size", WORLDS)
def test_barrier_waits_for_the_last_rank(size: int) -> None:
    # The last rank enters 0.2 s late; nobody may leave before it entered.
    def body(transport: _native.Transport, rank: int) -> tuple[float, float]:
        if rank == size - 1:
            time.sleep(0.2)
        entered = time.monotonic()
        _native.barrier(transport)
        return entered, time.monotonic()

    times = run_ranks(size, body)
    last_entry = times[-1][0]
    assert all(left >= last_entry for _, left in times), times


def test_missing_peer_times_out_with_internal_error() -> None:
    group = _native.LoopbackGroup(2, 0.3)
    with pytest.raises(_native.HoraInternalError, match="timed out"):
        _native.allreduce(group.transport(0), np.ones(10, np.float32), _native.DataType.FLOAT32, _native.ReduceOp.SUM)


OUT_OF_PLACE_CASES = [
    (np.dtype(dtype), op, prescale, postscale)
    for dtype in (np.float32, np.float64, np.float16, np.int32, np.bool_)
    for op, prescale, postscale in [
        ("SUM", 1.0, 1.0),
        ("AVERAGE", 1.0, 0.3),
        ("MIN", 1.0, 1.0),
        ("MAX", 1.0, 1.0),
        ("SUM", 2.0, 0.5),
    ]
    if not (dtype == np.bool_ and op == "AVERAGE") and (prescale == 1.0 or dtype not in (np.bool_, np.int32))
]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize(("dtype", "op", "prescale", "postscale"), OUT_OF_PLACE_CASES, ids=str)
@pytest.mark.parametrize("count", [1000, 300_003], ids=["recursive-doubling", "ring"])
def test_allreduce_into_an_output_gives_the_in_place_bits_and_leaves_the_input(
    size: int, dtype: np.dtype, op: str, prescale: float, postscale: float, count: int
) -> None:
    """Out of place, the ring reduces each rank's input straight from its buffer (reduce.h's left operand) instead of
    from a copy: the same bits as in place, and the input is never written. Signed zeros and NaN make min and max
    depend on the operand order, which must be the in-place one."""
    rng = np.random.default_rng(size * 100 + count)
    inputs = [(rng.standard_normal(count) * 4).astype(dtype) for _ in range(size)]
    if dtype.kind == "f":
        for r, x in enumerate(inputs):
            x[r::7] = np.nan if r % 2 else -0.0
            x[(r + 3) :: 11] = 0.0
    in_place = [x.copy() for x in inputs]
    sources = [x.copy() for x in inputs]
    outputs = [np.full_like(x, 7) for x in inputs]
    native, reduce_op = NATIVE_DTYPE[dtype.name], getattr(_native.ReduceOp, op)
    run_ranks(size, lambda t, r: _native.allreduce(t, in_place[r], native, reduce_op, prescale, postscale))
    run_ranks(
        size,
        lambda t, r: _native.allreduce(t, sources[r], native, reduce_op, prescale, postscale, output=outputs[r]),
    )
    for source, original, output, expected in zip(sources, inputs, outputs, in_place, strict=True):
        np.testing.assert_array_equal(output.view(np.uint8), expected.view(np.uint8))
        np.testing.assert_array_equal(source.view(np.uint8), original.view(np.uint8))


def test_allreduce_output_must_match_the_buffer() -> None:
    def body(transport: _native.Transport, rank: int) -> None:
        f32, add = _native.DataType.FLOAT32, _native.ReduceOp.SUM
        with pytest.raises(ValueError, match="output has 5 items; the buffer has 4"):
            _native.allreduce(transport, np.ones(4, np.float32), f32, add, output=np.ones(5, np.float32))
        shared = np.ones(8, np.float32)
        with pytest.raises(ValueError, match="output overlaps the buffer"):
            _native.allreduce(transport, shared[:6], f32, add, output=shared[2:])

    run_ranks(2, body)
