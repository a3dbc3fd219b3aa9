"""The native engine with ranks as threads of one process (loopback transport)."""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from hora import _native

Kind = _native.RequestKind
F32 = _native.DataType.FLOAT32
SUM = _native.ReduceOp.SUM


def engines(size: int, cycle_time_ms: float | None = None) -> list[_native.Engine]:
    """``size`` engines over one loopback group; a long ``cycle_time_ms`` starts cycles only when a caller waits."""
    group = _native.LoopbackGroup(size, 10.0)
    options = _native.EngineOptions()
    options.shutdown_timeout_seconds = 5.0
    if cycle_time_ms is not None:
        options.cycle_time_ms = cycle_time_ms
    return [_native.Engine(group.transport(r), options) for r in range(size)]


def submit(engine: _native.Engine, name: str, array: np.ndarray) -> int:
    (handle,) = engine.submit([_native.Request(Kind.ALLREDUCE, name, array)])
    return handle


def wait(engine: _native.Engine, handle: int) -> _native.Result:
    (result,) = engine.wait([handle])
    return result


def on_threads(size: int, body: Callable[[int], None], timeout: float = 20.0) -> None:
    """Runs body(rank) for every rank at once, each on a thread of its own, and joins them."""
    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), f"a rank was still running after {timeout} s"


def on_threads_checked(size: int, body: Callable[[int], None], timeout: float) -> None:
    """on_threads(), then raises the first failure of any rank's body (an assertion on a thread fails nothing)."""
    failures: list[BaseException] = []

    def checked(rank: int) -> None:
        try:
            body(rank)
        except BaseException as failure:  # reported by the main thread
            failures.append(failure)

    on_threads(size, checked, timeout)
    assert not failures, failures


@pytest.mark.timeout(30)
def test_a_wait_can_be_interrupted_and_resumed() -> None:
    first, second = engines(2)
    mine, theirs = np.ones(3, np.float32), np.full(3, 2.0, np.float32)
    handle = submit(first, "x", mine)
    threading.Timer(0.3, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        wait(first, handle)  # rank 1 has not submitted "x": only the interrupt ends this wait
    assert not first.poll(handle)
    wait(second, submit(second, "x", theirs))
    wait(first, handle)
    np.testing.assert_array_equal(mine, np.full(3, 3.0))
    np.testing.assert_array_equal(theirs, np.full(3, 3.0))
    for engine in (first, second):
        engine.shutdown()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("grouped", [False, True])
def test_an_interrupted_run_leaves_its_requests_to_complete_without_it(grouped: bool) -> None:
    """run() and run_all() hold no handle the caller could wait on again: interrupted, they release their requests,
    which complete when the other ranks come (writing their buffers), then free their names and their handles."""
    first, second = engines(2)
    names = ["g.0", "g.1"] if grouped else ["x"]

    def requests(value: float) -> tuple[list[_native.Request], list[np.ndarray]]:
        arrays = [np.full(3, value, np.float32) for _ in names]
        return [_native.Request(Kind.ALLREDUCE, n, a) for n, a in zip(names, arrays, strict=True)], arrays

    def run(engine: _native.Engine, made: list[_native.Request]) -> None:
        if grouped:
            engine.run_all(made, "g")
        else:
            engine.run(made[0])

    try:
        interrupted, mine = requests(1.0)
        threading.Timer(0.3, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            run(first, interrupted)  # rank 1 has not submitted yet: only the interrupt ends this call
        assert first.open_handles == len(names)
        with pytest.raises(ValueError, match="already in flight"):
            run(first, requests(1.0)[0])
        theirs, their_arrays = requests(2.0)
        run(second, theirs)  # and rank 0's background thread completes its released requests
        deadline = time.monotonic() + 10
        while first.open_handles and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first.open_handles == 0  # released, completed, forgotten
        for array in mine + their_arrays:
            np.testing.assert_array_equal(array, np.full(3, 3.0))
        again, arrays = requests(1.0)
        later = threading.Thread(target=run, args=(second, requests(1.0)[0]))
        later.start()
        run(first, again)  # the names are free again
        later.join(10)
        for array in arrays:
            np.testing.assert_array_equal(array, np.full(3, 2.0))
    finally:
        for engine in (first, second):
            engine.shutdown()


@pytest.mark.timeout(30)
def test_threads_as_ranks_with_different_orders() -> None:
    size, count = 3, 40
    ranks = engines(size)
    arrays = [[np.full(i + 1, r * 100 + i, np.float32) for i in range(count)] for r in range(size)]

    def run(rank: int) -> None:
        order = np.random.default_rng(rank).permutation(count)
        handles = [submit(ranks[rank], f"t{i}", arrays[rank][i]) for i in order]
        for handle in handles:
            wait(ranks[rank], handle)

    on_threads(size, run)
    for r in range(size):
        for i in range(count):
            np.testing.assert_array_equal(arrays[r][i], np.full(i + 1, sum(k * 100 + i for k in range(size))))
    for engine in ranks:
        engine.shutdown()


@pytest.mark.timeout(30)
def test_a_group_is_queued_whole_or_not_at_all() -> None:
    first, second = engines(2)
    busy = np.ones(2, np.float32)
    handle = submit(first, "g.1", busy)  # in flight: rank 1 has not submitted it

    def group(*names: str) -> list[_native.Request]:
        return [_native.Request(Kind.ALLREDUCE, name, np.ones(2, np.float32)) for name in names]

    with pytest.raises(ValueError, match=r"A request named 'g\.1' is already in flight on rank 0"):
        first.submit(group("g.0", "g.1"), "g")
    with pytest.raises(ValueError, match=r"'g\.0' is already in flight"):  # a repeated name within the group
        first.submit(group("g.0", "g.0"), "h")
    # Nothing of either group was queued: "g.0" is free, and the pair completes normally.
    solo = np.ones(2, np.float32)
    pending = [submit(first, "g.0", solo)]
    partner = [submit(second, "g.0", np.ones(2, np.float32)), submit(second, "g.1", np.ones(2, np.float32))]
    for h in [*pending, handle]:
        wait(first, h)
    for h in partner:
        wait(second, h)
    np.testing.assert_array_equal(solo, [2.0, 2.0])
    np.testing.assert_array_equal(busy, [2.0, 2.0])
    for engine in (first, second):
        engine.shutdown()


def test_engine_options_quote_bad_values() -> None:
    options = _native.EngineOptions()
    with pytest.raises(ValueError, match=r"stall_warning_seconds must be >= 0 seconds \(0 turns it off\), got -1"):
        options.stall_warning_seconds = -1.0
    with pytest.raises(ValueError, match=r"cycle_time_ms must be >= 0, got -2"):
        options.cycle_time_ms = -2.0
    with pytest.raises(ValueError, match=r"autotune_steps_per_sample must be at least 1, got 0"):
        options.autotune_steps_per_sample = 0
    with pytest.raises(ValueError, match=r"autotune_fixed: unknown parameter 'speed'"):
        options.autotune_fixed = ["speed"]
    options.hosts = [0, 0]
    with pytest.raises(ValueError, match=r"hosts must give the host of every rank: got 2 entries for 1 ranks"):
        _native.Engine(_native.LoopbackGroup(1, 1.0).transport(0), options)


@pytest.mark.parametrize(
    ("cycle_time_ms", "caller_away_ms", "spare_cores", "patience_ms"),
    [
        (1.0, 10.0, True, 1.0),  # a spare core: back after a cycle time, whatever the caller does
        (0.01, 0.0, True, 0.1),  # never sooner than 100 us
        (1.0, 10.0, False, 20.0),  # no spare core: twice the caller's time away
        (1.0, 0.2, False, 1.0),  # but never less than a cycle time
        (1.0, 100.0, False, 200.0),  # a CPU training step of 100 ms
        (1.0, 300.0, False, 250.0),  # but at most 250 ms, so that the other ranks' cycles wait no longer
        (300.0, 600.0, False, 300.0),  # a longer cycle time still counts
    ],
)
def test_the_background_thread_waits_out_the_callers_time_away_only_without_a_spare_core(
    cycle_time_ms: float, caller_away_ms: float, spare_cores: bool, patience_ms: float
) -> None:
    assert _native.background_patience(cycle_time_ms, caller_away_ms, spare_cores) == pytest.approx(patience_ms)


@pytest.mark.timeout(30)
def test_run_submits_and_waits_in_one_call() -> None:
    ranks = engines(2)
    arrays = [np.full(4, r + 1.0, np.float32) for r in range(2)]
    outputs: list[object] = [None, None]

    def call(rank: int) -> None:
        outputs[rank] = ranks[rank].run(_native.Request(Kind.ALLREDUCE, "x", arrays[rank]))

    on_threads(2, call)
    for rank in range(2):
        np.testing.assert_array_equal(arrays[rank], np.full(4, 3.0))
        result = outputs[rank]
        assert isinstance(result, _native.Result)
        assert (result.output, result.shape, result.received_splits, result.value) == (None, [], [], -1)  # in place
    with pytest.raises(ValueError, match="Average is not defined for bool"):  # errors come back from run
        ranks[0].run(_native.Request(Kind.ALLREDUCE, "b", np.ones(2, np.bool_), op=_native.ReduceOp.AVERAGE))
    for engine in ranks:
        engine.shutdown()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("leaving", ["this rank", "the other rank"])
def test_shutdown_while_another_thread_drives_the_engine(leaving: str) -> None:
    first, second = engines(2)
    handle = submit(first, "never", np.ones(2, np.float32))  # rank 1 never submits it
    failure: list[BaseException] = []

    def waiter() -> None:
        try:
            wait(first, handle)  # this thread runs rank 0's cycles while it waits
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()
    # Either way the shutdown is agreed in a cycle of rank 0 that the waiting thread runs.
    (first if leaving == "this rank" else second).shutdown()
    thread.join(10)
    assert not thread.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], _native.HoraError), failure
    assert "shut down" in str(failure[0])
    first.shutdown()


@pytest.mark.timeout(30)
def test_an_allreduce_request_with_an_output_leaves_its_tensor_alone() -> None:
    """Alone (the ring reads the tensor where it lies), widened (float16 Average accumulates in float32), fused with
    others (the fusion buffer is filled from the tensors): each result lands in its output, bit for bit the
    in-place result, and no tensor changes."""
    ranks = engines(2)
    average = _native.ReduceOp.AVERAGE
    specs = [
        ("alone", np.float32, 300_003, SUM),
        ("widened", np.float16, 300_003, average),
        ("small", np.float64, 1000, average),
    ] + [(f"fused.{i}", np.float32, 50 + i, SUM) for i in range(3)]
    inputs = [
        [np.random.default_rng(r * 10 + i).standard_normal(n).astype(t) for i, (_, t, n, _) in enumerate(specs)]
        for r in range(2)
    ]
    results: list[object] = [None, None]

    def call(rank: int) -> None:
        engine = ranks[rank]
        in_place = [x.copy() for x in inputs[rank]]
        tensors = [x.copy() for x in inputs[rank]]
        outputs = [np.zeros_like(x) for x in tensors]
        for suffix, arrays, outs in (("in", in_place, [None] * len(specs)), ("out", tensors, outputs)):
            requests = [
                _native.Request(Kind.ALLREDUCE, f"{name}.{suffix}", x, op=op, output=out)
                for (name, _, _, op), x, out in zip(specs, arrays, outs, strict=True)
            ]
            handles = [engine.submit([request])[0] for request in requests[:3]]
            handles += engine.submit(requests[3:], f"fused.{suffix}")  # a group: one fused response
            engine.wait(handles)
        results[rank] = (in_place, tensors, outputs)

    on_threads(2, call)
    for rank in range(2):
        in_place, tensors, outputs = results[rank]
        for original, expected, tensor, output in zip(inputs[rank], in_place, tensors, outputs, strict=True):
            np.testing.assert_array_equal(output.view(np.uint8), expected.view(np.uint8))
            np.testing.assert_array_equal(tensor.view(np.uint8), original.view(np.uint8))
    engine = ranks[0]
    bad = [
        (np.ones(4, np.float32), np.ones(5, np.float32), Kind.ALLREDUCE, "has 5 items of 4 bytes"),
        (np.ones(4, np.float32), np.ones(4, np.float64), Kind.ALLREDUCE, "has 4 items of 8 bytes"),
        (np.ones(4, np.float32), np.ones(4, np.int32), Kind.ALLREDUCE, "buffer format 'i'; its tensor's are float32"),
        (np.ones(4, np.float32), np.ones(4, np.float32), Kind.BROADCAST, "Only an allreduce takes an output"),
    ]
    for tensor, output, kind, message in bad:
        with pytest.raises(ValueError, match=message):
            engine.submit([_native.Request(kind, "bad", tensor, root=0, output=output)])
    shared = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="overlaps its tensor"):
        engine.submit([_native.Request(Kind.ALLREDUCE, "bad", shared[:6], output=shared[2:])])
    for engine in ranks:
        engine.shutdown()


@pytest.mark.timeout(30)
def test_a_wait_on_several_handles_returns_every_result_or_raises_the_first_failure() -> None:
    first, second = engines(2)
    good = [np.full(2, r + 1.0, np.float32) for r in range(2)]
    bad = [np.ones(2 + r, np.float32) for r in range(2)]  # the ranks disagree on the shape
    mine = [submit(first, "good", good[0]), submit(first, "bad", bad[0])]
    theirs = [submit(second, "good", good[1]), submit(second, "bad", bad[1])]
    with pytest.raises(ValueError, match=rf"Handle {mine[0]} appears twice in one wait"):
        first.wait([mine[0], mine[0]])  # refused before anything is consumed: the handle stays usable
    for engine, handles in ((first, mine), (second, theirs)):
        with pytest.raises(_native.RequestError, match=r"ranks disagree on the shape"):
            engine.wait(handles)
        for handle in handles:  # all were consumed, the good one included
            with pytest.raises(ValueError, match=f"Unknown handle {handle}"):
                engine.poll(handle)
    np.testing.assert_array_equal(good[0], [3.0, 3.0])
    for engine in (first, second):
        engine.shutdown()


@pytest.mark.parametrize(
    ("array", "accepted"),
    [
        (np.ones(2, "<i8"), True),
        (np.ones(2, "=i4"), True),
        (np.ones(2, np.bool_), True),
        (np.ones(2, np.float16), True),
        (np.ones(2, ">f4"), False),  # big-endian
        (np.ones(2, np.uint32), False),  # no unsigned 32-bit type
    ],
    ids=["<i8", "=i4", "bool", "float16", ">f4", "uint32"],
)
def test_the_element_type_is_read_from_the_buffer(array: np.ndarray, accepted: bool) -> None:
    (engine,) = engines(1)
    request = _native.Request(Kind.ALLREDUCE, "x", array)
    if accepted:
        expected = array.copy()
        engine.run(request)  # one rank: the sum is the input
        np.testing.assert_array_equal(array, expected)
    else:
        with pytest.raises(ValueError, match=r"buffer format '.+' \(4 bytes\), which Hora does not reduce"):
            engine.run(request)
    engine.shutdown()


@pytest.mark.timeout(60)
def test_tensors_every_rank_announces_from_the_response_cache_complete_as_the_table_completes_them() -> None:
    # From the second step on every rank announces these tensors by their cache slot in the same cycle (every rank
    # has submitted them before any waits, and no cycle starts before a wait: the cycle time is long), and the cached
    # responses are taken as agreed, singles and a group alike; a step where one rank's tensor no longer matches its
    # slot goes through the table, which reports the mismatch on every rank; the cache then serves the tensors again.
    size = 3
    ranks = engines(size, cycle_time_ms=5000.0)
    steps = 5
    mismatch_step = 3
    errors: list[list[str]] = [[] for _ in range(size)]
    submitted = threading.Barrier(size, timeout=10.0)

    def run(rank: int) -> None:
        engine = ranks[rank]
        for step in range(steps):
            value = rank + 10 * step
            length = 5 if step == mismatch_step and rank == 2 else 4
            a = np.full(length, value, np.float32)
            b = np.full(3, value, np.int32)
            pair = [np.full(2, value, np.float64), np.full(6, value, np.float32)]
            handles = engine.submit([_native.Request(Kind.ALLREDUCE, "a", a), _native.Request(Kind.ALLREDUCE, "b", b)])
            handles += engine.submit([_native.Request(Kind.ALLREDUCE, f"g.{i}", t) for i, t in enumerate(pair)], "g")
            submitted.wait()
            expected = sum(r + 10 * step for r in range(size))
            for handle in handles[1:]:
                engine.wait([handle])
            for tensor in (b, *pair):
                np.testing.assert_array_equal(tensor, np.full(tensor.shape, expected, tensor.dtype))
            if step != mismatch_step:
                engine.wait([handles[0]])
                np.testing.assert_array_equal(a, np.full(4, expected, np.float32))
                continue
            with pytest.raises(_native.RequestError) as raised:
                engine.wait([handles[0]])
            errors[rank].append(str(raised.value))

    on_threads_checked(size, run, timeout=15.0)
    for rank in range(size):
        assert len(errors[rank]) == 1, f"rank {rank} saw no error for the mismatched step"
        assert "ranks disagree on the shape" in errors[rank][0] and "(5,)" in errors[rank][0], errors[rank][0]
    # 4 tensors a step from the second step on, but for the mismatched tensor: every rank decided alike.
    assert [engine.agreed_from_cache for engine in ranks] == [4 * (steps - 1) - 1] * size
    on_threads(size, lambda rank: ranks[rank].shutdown())  # together: a parked engine answers no one for 5 s


@pytest.mark.timeout(60)
def test_cycles_of_many_cached_tensors_then_fewer_are_agreed_and_reduced_right() -> None:
    # 150 tensors take cache slots 0-149, so a cycle's bit vector spans three 64-bit words; the next steps announce
    # all of them, then a subset, then all again, in one cycle each (the cycle time is long and every rank has
    # submitted before any waits): the buffers an engine reuses from cycle to cycle hold no trace of the last one.
    size = 2
    ranks = engines(size, cycle_time_ms=5000.0)
    counts = [150, 150, 70, 150]
    submitted = threading.Barrier(size, timeout=10.0)

    def run(rank: int) -> None:
        engine = ranks[rank]
        for step, count in enumerate(counts):
            tensors = [np.full(i % 5 + 1, rank + step + i, np.float32) for i in range(count)]
            handles = engine.submit([_native.Request(Kind.ALLREDUCE, f"t{i}", t) for i, t in enumerate(tensors)])
            submitted.wait()
            engine.wait(handles)
            for i, tensor in enumerate(tensors):
                expected = sum(r + step + i for r in range(size))
                np.testing.assert_array_equal(tensor, np.full(i % 5 + 1, expected, np.float32))

    on_threads_checked(size, run, timeout=30.0)
    # Every tensor after the first step came from the cache, agreed by every rank without the table.
    assert [engine.agreed_from_cache for engine in ranks] == [sum(counts[1:])] * size
    on_threads(size, lambda rank: ranks[rank].shutdown())
