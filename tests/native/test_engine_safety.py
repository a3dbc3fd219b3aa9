"""The engine owns what it works on, accumulates narrow averages widely, and refuses bad factors up front.

Ranks are threads of one process over the loopback transport. Under AddressSanitizer (``make test-asan``) a
buffer freed while the engine still uses it fails these tests instead of corrupting the heap silently.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from hora import _native

Kind = _native.RequestKind
Op = _native.ReduceOp
DType = _native.DataType

DTYPES = {
    np.dtype(np.int8): DType.INT8,
    np.dtype(np.uint8): DType.UINT8,
    np.dtype(np.int16): DType.INT16,
    np.dtype(np.float16): DType.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): DType.BFLOAT16,
    np.dtype(np.float32): DType.FLOAT32,
}


def engines(size: int, **settings: object) -> list[_native.Engine]:
    group = _native.LoopbackGroup(size, 10.0)
    options = _native.EngineOptions()
    options.shutdown_timeout_seconds = 5.0
    for name, value in settings.items():
        setattr(options, name, value)
    return [_native.Engine(group.transport(r), options) for r in range(size)]


def raw(array: np.ndarray) -> np.ndarray:
    """The buffer as the engine takes it: bfloat16 has no buffer format, so its bits."""
    return array.view(np.uint16) if array.dtype == ml_dtypes.bfloat16 else array


def on_every_rank(size: int, body: Callable[[int], None], timeout: float = 20.0) -> None:
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            body(rank)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a rank did not finish"
    if errors:
        raise errors[0]


def allreduce(engine: _native.Engine, name: str, array: np.ndarray, op: _native.ReduceOp, **kw: float) -> None:
    request = _native.Request(Kind.ALLREDUCE, name, raw(array), DTYPES[array.dtype], op, kw.get("pre", 1.0),
                              kw.get("post", 1.0))  # fmt: skip
    engine.wait(engine.submit([request]))


def expected_average(inputs: list[np.ndarray], postscale: float = 1.0) -> np.ndarray:
    """Average in float64, then narrowed the way the engine narrows: truncated for integers, rounded for floats."""
    mean = np.mean([x.astype(np.float64) for x in inputs], axis=0)
    dtype = inputs[0].dtype
    if np.issubdtype(dtype, np.integer):
        total = np.sum([x.astype(np.int64) for x in inputs], axis=0)
        return (np.trunc(total / len(inputs)) * postscale).astype(dtype)
    return (mean * postscale).astype(np.float32).astype(dtype)


NARROW_CASES = {
    "int8": [np.array([100, -100, 3, 127, -128], np.int8), np.array([100, -100, 4, 127, -128], np.int8)],
    "uint8": [np.array([200, 255, 1], np.uint8), np.array([250, 255, 2], np.uint8)],
    "int16": [np.array([32767, -32768, 7], np.int16), np.array([32767, -32768, 8], np.int16)],
    "float16": [np.array([65504, -65504, 0.5], np.float16), np.array([65504, -65504, 1.5], np.float16)],
    "bfloat16": [
        np.array([3.0e38, 1.0, 1.0], ml_dtypes.bfloat16),
        np.array([3.0e38, 1.0 + 2**-7, 1.0 + 2**-6], ml_dtypes.bfloat16),
    ],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("case", list(NARROW_CASES))
def test_average_of_narrow_types_does_not_overflow(case: str, size: int) -> None:
    base = NARROW_CASES[case]
    inputs = [base[r % 2].copy() for r in range(size)]
    ranks = engines(size)
    expected = expected_average(inputs)

    def body(rank: int) -> None:
        allreduce(ranks[rank], "narrow", inputs[rank], Op.AVERAGE)
        ranks[rank].shutdown()

    on_every_rank(size, body)
    for rank in range(size):
        np.testing.assert_array_equal(inputs[rank], expected, err_msg=f"rank {rank}")


@pytest.mark.timeout(60)
def test_fused_narrow_averages_with_postscale_and_sum_wraps_around() -> None:
    """Narrow tensors fused with others are averaged widely too; Sum keeps the tensor's type and wraps, as numpy."""
    size = 2
    ranks = engines(size, cycle_time_ms=50.0)  # the three requests of a rank meet in one cycle and are fused
    averaged = [np.array([120, -120, 5], np.int8) for _ in range(size)]
    halves = [np.array([60000, 1], np.float16) for _ in range(size)]
    summed = [np.array([100, -100], np.int8) for _ in range(size)]

    def body(rank: int) -> None:
        engine = ranks[rank]
        requests = [
            _native.Request(Kind.ALLREDUCE, "a", averaged[rank], DType.INT8, Op.AVERAGE, 1.0, 0.5),
            _native.Request(Kind.ALLREDUCE, "h", halves[rank], DType.FLOAT16, Op.AVERAGE),
            _native.Request(Kind.ALLREDUCE, "s", summed[rank], DType.INT8, Op.SUM),
        ]
        engine.wait([engine.submit([r])[0] for r in requests])
        engine.shutdown()

    on_every_rank(size, body)
    for rank in range(size):
        np.testing.assert_array_equal(averaged[rank], np.array([60, -60, 2], np.int8))
        np.testing.assert_array_equal(halves[rank], np.array([60000, 1], np.float16))
        np.testing.assert_array_equal(summed[rank], np.array([100 + 100 - 256, -100 - 100 + 256], np.int8))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [np.int8, np.float16])
def test_reducescatter_average_of_narrow_types_does_not_overflow(dtype: type) -> None:
    size = 2
    top = np.iinfo(dtype).max if np.issubdtype(dtype, np.integer) else np.finfo(dtype).max
    inputs = [np.full((4, 3), top, dtype) for _ in range(size)]
    ranks = engines(size)
    outputs: list[np.ndarray] = [np.empty(0)] * size

    def body(rank: int) -> None:
        engine = ranks[rank]
        request = _native.Request(Kind.REDUCESCATTER, "rs", inputs[rank], DTYPES[np.dtype(dtype)], Op.AVERAGE)
        (result,) = engine.wait(engine.submit([request]))
        outputs[rank] = result.output.view(dtype).reshape(result.shape)
        engine.shutdown()

    on_every_rank(size, body)
    for rank in range(size):
        np.testing.assert_array_equal(outputs[rank], np.full((2, 3), top, dtype))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("factor", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("which", ["prescale", "postscale"])
def test_non_finite_scale_factors_are_refused_up_front(which: str, factor: float) -> None:
    (engine,) = engines(1)
    pre, post = (factor, 1.0) if which == "prescale" else (1.0, factor)
    array = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=rf"{which}_factor must be a finite number, got -?(nan|inf) for tensor 'x'"):
        engine.submit([_native.Request(Kind.ALLREDUCE, "x", array, DType.FLOAT32, Op.SUM, pre, post)])
    engine.shutdown()


@pytest.mark.timeout(60)
def test_dropped_handles_keep_their_buffers_until_the_engine_is_done() -> None:
    """Requests whose arrays and handles are dropped at once still complete, on memory the engine owns."""
    size, count = 2, 30
    ranks = engines(size)
    checks: list[np.ndarray] = [np.empty(0)] * size

    def body(rank: int) -> None:
        engine = ranks[rank]
        ids = []
        for i in range(count):
            # The only reference to the array is the engine's: it is gone from Python as soon as submit returns.
            ids += engine.submit(
                [_native.Request(Kind.ALLREDUCE, f"d{i}", np.full((17, 17, 17), rank + i, np.float32))]
            )
            engine.release(ids[-1])
        gc.collect()
        # The one request this rank keeps comes after the dropped ones, in the same cycles.
        check = np.full(4, rank, np.float64)
        engine.wait(engine.submit([_native.Request(Kind.ALLREDUCE, "check", check)]))
        checks[rank] = check
        for handle in ids:  # released: their states were forgotten once they completed
            with pytest.raises(ValueError, match=f"Unknown handle {handle}"):
                engine.poll(handle)
        engine.shutdown()

    on_every_rank(size, body)
    for rank in range(size):
        np.testing.assert_array_equal(checks[rank], np.full(4, sum(range(size)), np.float64))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_submit_drop_synchronize_and_shutdown(seed: int) -> None:
    """Every rank submits the same named requests; each is kept or dropped at random, per rank, and the ranks shut
    down (or one leaves early) with requests still in flight. Kept results must be right; nothing may crash."""
    size = 3
    rng = np.random.default_rng(seed)
    steps = 60
    lengths = rng.integers(0, 5000, steps)
    keep = rng.random((size, steps)) < 0.5
    leaver = int(rng.integers(0, size))
    leave_at = int(rng.integers(steps // 2, steps))
    ranks = engines(size)
    failures: list[str] = []

    def body(rank: int) -> None:
        engine = ranks[rank]
        local = np.random.default_rng(seed * 10 + rank)
        kept: list[tuple[int, np.ndarray, int]] = []
        try:
            for step in range(steps):
                if rank == leaver and step == leave_at:
                    break
                array = np.full(int(lengths[step]), rank + step, np.float32)
                (handle,) = engine.submit([_native.Request(Kind.ALLREDUCE, f"t{step}", array)])
                if keep[rank, step]:
                    kept.append((handle, array, step))
                else:
                    engine.release(handle)
                del array
                if step % 7 == rank:
                    gc.collect()
                if kept and local.random() < 0.3:
                    handle, array, at = kept.pop(0)
                    engine.wait([handle])
                    expected = sum(r + at for r in range(size))
                    if not np.all(array == expected):
                        failures.append(f"rank {rank} step {at}: {array[:3]} != {expected}")
        except _native.HoraError as error:  # another rank left: the job is over for this rank, and says why
            if "Hora shut down" not in str(error):  # the leaver, or a rank that stopped because of it
                failures.append(f"rank {rank}: unexpected {error!r}")
        finally:
            engine.shutdown()
        for handle, _, _ in kept:  # whatever is left completed or fails with the shutdown; neither crashes
            try:
                engine.wait([handle])
            except _native.HoraError as error:
                if "shut down" not in str(error):
                    failures.append(f"rank {rank}: unexpected {error!r}")

    on_every_rank(size, body, timeout=60)
    assert not failures, failures
