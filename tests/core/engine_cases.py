"""Worker script: one engine scenario, named in argv[1], run under horarun.

Each rank computes the expected values itself (inputs are derived from the
rank) and asserts; a failure exits non-zero with the traceback. Scenarios
that need the launcher to look at something (stall warnings, timeline files)
print or write it, and the test checks.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import threading
import time

import hora
import numpy as np

SCENARIOS = {}
INITS_ITSELF = set()


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def initializing_scenario(fn):
    """A scenario that calls hora.init itself."""
    INITS_ITSELF.add(fn.__name__)
    return scenario(fn)


def value(rank: int, index: int) -> float:
    return float(rank * 1000 + index)


@scenario
def shuffled_orders() -> None:
    """Named tensors of mixed sizes and dtypes, submitted in a different order on every rank."""
    rank, size = hora.rank(), hora.size()
    dtypes = [np.float32, np.float64, np.int32, np.int64]
    names = [f"grad.{i}" for i in range(120)]
    inputs = {
        name: np.full((i % 7) * 13 + 1, value(rank, i), dtype=dtypes[i % len(dtypes)]) for i, name in enumerate(names)
    }
    for step in range(3):
        order = np.random.default_rng(rank * 100 + step).permutation(len(names))
        handles = {names[i]: hora.allreduce_async(inputs[names[i]], name=names[i], op=hora.Sum) for i in order}
        for i, name in enumerate(names):
            result = hora.synchronize(handles[name])
            expected = sum(value(r, i) for r in range(size))
            assert result.dtype == inputs[name].dtype, (name, result.dtype)
            np.testing.assert_array_equal(result, np.full_like(inputs[name], expected), err_msg=name)
    # Unnamed requests are matched by call order, which is the same everywhere.
    handles = [hora.allgather_async(np.full((rank + 1, 2), rank)) for _ in range(5)]
    expected = np.concatenate([np.full((r + 1, 2), r) for r in range(size)])
    for handle in handles:
        np.testing.assert_array_equal(hora.synchronize(handle), expected)


@scenario
def mismatches() -> None:
    """Every kind of disagreement fails that request on every rank; the job goes on."""
    rank, size = hora.rank(), hora.size()
    odd = rank == size - 1
    cases = [
        (lambda: hora.allreduce(np.zeros(3 + odd), name="w"), "shape", "(3,)", "(4,)"),
        (
            lambda: hora.allreduce(np.zeros(3, np.float32 if odd else np.float64), name="d"),
            "dtype",
            "float64",
            "float32",
        ),
        (lambda: hora.allreduce(np.zeros(3), name="o", op=hora.Max if odd else hora.Sum), "reduction", "Sum", "Max"),
        (lambda: hora.broadcast(np.zeros(3), root_rank=int(odd), name="b"), "root rank", "0", "1"),
        (lambda: hora.allreduce(np.zeros(3), name="p", prescale_factor=2.0 if odd else 1.0), "prescale", "1", "2"),
        (
            lambda: hora.allgather(np.zeros((2, 3 + odd)), name="g"),
            "shape after the first dimension",
            "(2, 3)",
            "(2, 4)",
        ),
    ]
    for call, field, mine, theirs in cases:
        try:
            call()
        except RuntimeError as exc:  # as Horovod raises it; and a ValueError for code written for Hora
            assert isinstance(exc, ValueError) and isinstance(exc, hora.RequestError), type(exc)
            text = str(exc)
            assert f"disagree on the {field}" in text, text
            assert "rank 0 has" in text and f"rank {size - 1} has" in text, text
            assert mine in text and theirs in text, text
            assert "tensor '" in text, text
        else:
            raise AssertionError(f"a {field} mismatch was not detected")
        np.testing.assert_array_equal(hora.allreduce(np.ones(3), op=hora.Sum), np.full(3, size))
    print(f"rank {rank}: mismatches ok", flush=True)


@scenario
def uneven_join() -> None:
    """Rank r runs r + 1 steps, then joins. As in Horovod, joined ranks contribute the identity to an allreduce
    (an Average still divides by the whole size), and the collectives that move rows fail while any rank has joined."""
    rank, size = hora.rank(), hora.size()
    for step in range(rank + 1):
        active = [r for r in range(size) if r + 1 > step]
        joined = [r for r in range(size) if r not in active]
        total = hora.allreduce(np.full(4, rank + 1.0), name=f"s{step}", op=hora.Sum)
        np.testing.assert_array_equal(total, np.full(4, sum(r + 1.0 for r in active)))
        mean = hora.allreduce(np.full(4, rank + 1.0), name=f"m{step}", op=hora.Average)
        np.testing.assert_allclose(mean, np.full(4, sum(r + 1.0 for r in active) / size))
        integers = hora.allreduce(np.full(3, 10 * (rank + 1), np.int32), name=f"i{step}", op=hora.Average)
        np.testing.assert_array_equal(integers, np.full(3, sum(10 * (r + 1) for r in active) // size, np.int32))
        low = hora.allreduce(np.full(2, rank + 5), name=f"min{step}", op=hora.Min)
        np.testing.assert_array_equal(low, np.full(2, min(active) + 5))
        rows_calls = {
            "allgather": lambda step=step: hora.allgather(np.full((1, 2), rank), name=f"g{step}"),
            "broadcast": lambda step=step: hora.broadcast(np.zeros(2), root_rank=size - 1, name=f"b{step}"),
            "reducescatter": lambda step=step: hora.reducescatter(np.ones((size, 2)), name=f"r{step}"),
            "alltoall": lambda step=step: hora.alltoall(np.ones((size, 2)), name=f"a{step}"),
        }
        for kind, call in rows_calls.items():
            if not joined:
                call()
                continue
            try:
                call()
            except RuntimeError as exc:  # Horovod's users catch it as a RuntimeError ...
                assert isinstance(exc, ValueError) and isinstance(exc, hora.RequestError), type(exc)  # ... ours too
                text = str(exc)
                assert f"{kind} is not supported while ranks have joined" in text, text
                assert f"rank {', '.join(map(str, joined))} called hora.join()" in text, text
            else:
                raise AssertionError(f"{kind} ran while ranks {joined} had joined")
    last = hora.join()
    assert last == size - 1, last
    # After everyone joined, the job works as before.
    np.testing.assert_array_equal(hora.allreduce(np.ones(2), op=hora.Sum), np.full(2, size))
    np.testing.assert_array_equal(hora.allgather(np.full((1, 2), rank))[:, 0], np.arange(size))
    print(f"rank {rank}: join returned {last}", flush=True)


@scenario
def process_sets() -> None:
    """{0, 1} and {2, 3} run their own collectives at the same time, then everyone together."""
    rank = hora.rank()
    low, high = hora.ProcessSet([0, 1]), hora.ProcessSet([2, 3])
    hora.add_process_set(low)
    hora.add_process_set(high)
    mine = low if rank < 2 else high
    assert mine.included() and mine.size() == 2 and mine.rank() == rank % 2
    assert low.process_set_id != high.process_set_id and 0 not in (low.process_set_id, high.process_set_id)
    base = 0 if rank < 2 else 2
    # The two sets submit different numbers of requests under the same names.
    steps = 40 if rank < 2 else 25
    for step in range(steps):
        handles = [
            hora.allreduce_async(np.full(100, rank + step + i, np.float32), name=f"t{i}", op=hora.Sum, process_set=mine)
            for i in range(4)
        ]
        for i, handle in enumerate(handles):
            expected = (base + step + i) + (base + 1 + step + i)
            np.testing.assert_array_equal(hora.synchronize(handle), np.full(100, expected, np.float32))
    gathered = hora.allgather(np.array([rank]), process_set=mine)
    np.testing.assert_array_equal(gathered, [base, base + 1])
    root = base + 1
    np.testing.assert_array_equal(hora.broadcast(np.array([rank]), root_rank=root, process_set=mine), [root])
    np.testing.assert_array_equal(
        hora.reducescatter(np.arange(4.0) + rank, op=hora.Sum, process_set=mine),
        (np.arange(4.0) * 2 + 2 * base + 1)[2 * (rank % 2) : 2 * (rank % 2) + 2],
    )
    hora.barrier(process_set=mine)
    try:
        hora.allreduce(np.ones(1), process_set=high if rank < 2 else low)
    except ValueError as exc:
        assert "is not a member of process set" in str(exc), exc
    else:
        raise AssertionError("a non-member ran a collective on a process set")
    np.testing.assert_array_equal(hora.allreduce(np.ones(2), op=hora.Sum), np.full(2, 4))
    assert hora.remove_process_set(low) and hora.remove_process_set(high)
    assert low.process_set_id is None
    print(f"rank {rank}: process sets ok", flush=True)


@scenario
def grouped() -> None:
    """Grouped calls complete as one unit and produce the same values as single calls."""
    rank, size = hora.rank(), hora.size()
    tensors = [np.full((r + 2, 3), rank + r, np.float32) for r in range(5)]
    results = hora.grouped_allreduce(tensors, op=hora.Sum)
    for r, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full((r + 2, 3), sum(k + r for k in range(size)), np.float32))
    parts = hora.grouped_allgather([np.full((rank + 1, 2), rank), np.full((2 * rank, 1), -rank, np.int64)])
    np.testing.assert_array_equal(parts[0], np.concatenate([np.full((r + 1, 2), r) for r in range(size)]))
    np.testing.assert_array_equal(parts[1], np.concatenate([np.full((2 * r, 1), -r) for r in range(size)]))
    inputs = [np.arange(size * 2 + 1, dtype=np.float64) + rank, np.arange(size, dtype=np.float64) * (rank + 1)]
    scattered = hora.grouped_reducescatter(inputs, op=hora.Sum)
    for x, part in zip(inputs, scattered, strict=True):
        total = sum(
            np.arange(x.size, dtype=np.float64) + r if x.size != size else np.arange(size) * (r + 1.0)
            for r in range(size)
        )
        rows = [x.size // size + (1 if k < x.size % size else 0) for k in range(size)]
        start = sum(rows[:rank])
        np.testing.assert_allclose(part, total[start : start + rows[rank]])
    in_place = [np.ones(3), np.ones(5)]
    assert all(a is b for a, b in zip(hora.grouped_allreduce_(in_place, op=hora.Sum), in_place, strict=True))
    np.testing.assert_array_equal(in_place[1], np.full(5, size))
    print(f"rank {rank}: grouped ok", flush=True)


@scenario
def timeline() -> None:
    """The timeline file holds the named tensor's negotiation, fusion copy and collective.

    A large tensor submitted in the same burst runs alone, in place: no fusion copy; in a group too.
    """
    path = sys.argv[2]
    hora.start_timeline(path, mark_cycles=True)
    for _step in range(3):
        handles = [hora.allreduce_async(np.ones(50), name=f"layer{i}.weight") for i in range(4)]
        handles.append(hora.allreduce_async(np.ones(64 * 1024), name="large.weight"))  # 512 KiB
        handles += [hora.allreduce_async(np.ones(50), name=f"layer{i}.weight") for i in range(4, 8)]
        for handle in handles:
            hora.synchronize(handle)
        hora.grouped_allreduce([np.ones(50), np.ones(64 * 1024), np.ones(50)], name="mixed")  # the same in a group
    hora.broadcast(np.ones(3), root_rank=0, name="bcast.me")
    refused = False
    try:  # a refused request's negotiation ends too: the next request of that name is not nested in it
        hora.allreduce(np.ones(2 + hora.rank()), name="mismatched")
    except hora.RequestError:
        refused = True
    assert refused
    hora.allreduce(np.ones(2), name="mismatched")
    hora.stop_timeline()
    if hora.rank() == 0:
        with open(path) as handle:
            events = json.load(handle)
        names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert "layer3.weight" in names, names
        print(f"timeline events: {len(events)}", flush=True)


@scenario
def stall_logged() -> None:
    """The stall warnings of the native core reach Python's logging, on the "hora" logger."""
    import logging

    logging.basicConfig(stream=sys.stdout, format="LOGGED %(name)s %(levelname)s %(message)s")
    rank = hora.rank()
    if rank == 1:
        time.sleep(2.5)
    hora.allreduce(np.ones(2), name="late.tensor", op=hora.Sum)
    print(f"rank {rank}: stall resolved", flush=True)


@scenario
def autotune() -> None:
    """Under --autotune rank 0 tries parameters while the job runs: results stay right throughout, and every rank
    ends with the same parameters."""
    rank, size = hora.rank(), hora.size()
    engine = hora.basics.current_job().engine
    for step in range(int(sys.argv[2])):
        handles = [
            hora.allreduce_async(np.full(100 * (i + 1), rank + step, np.float32), name=f"t{i}", op=hora.Sum)
            for i in range(6)
        ]
        for i, handle in enumerate(handles):
            expected = np.full(100 * (i + 1), sum(r + step for r in range(size)), np.float32)
            np.testing.assert_array_equal(hora.synchronize(handle), expected)
    hora.barrier()
    tuned = engine.parameters
    mine = np.array([[tuned.fusion_threshold_bytes, tuned.cycle_time_ms, tuned.cache_enabled]], np.float64)
    everyone = hora.allgather(mine)
    assert (everyone == everyone[0]).all(), everyone
    print(f"rank {rank}: autotune ok {json.dumps(mine[0].tolist())}", flush=True)


@scenario
def stall() -> None:
    """Rank 0 submits a tensor that rank 1 submits only much later: both log the stall."""
    rank = hora.rank()
    if rank == 1:
        time.sleep(3.5)
    result = hora.allreduce(np.ones(2), name="late.tensor", op=hora.Sum)
    np.testing.assert_array_equal(result, np.full(2, hora.size()))
    print(f"rank {rank}: stall resolved", flush=True)


@scenario
def stall_shutdown() -> None:
    """A tensor that a rank never submits fails the job after the stall shutdown time."""
    rank = hora.rank()
    start = time.monotonic()
    try:
        if rank == 0:
            hora.allreduce(np.ones(2), name="never.matched")
        else:
            time.sleep(1.0)
            hora.barrier()  # fails too: the job is stopped
    except hora.HoraError as exc:
        print(f"rank {rank}: HoraError after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        return
    raise AssertionError("the stall did not fail the job")


@scenario
def killed_with_pending() -> None:
    """The last rank SIGKILLs itself while the others have requests in flight."""
    import os
    import signal

    rank, size = hora.rank(), hora.size()
    hora.allreduce(np.ones(2))
    if rank == size - 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    # horarun stops the survivors as soon as it sees the killed rank; ignoring its SIGTERM keeps
    # the report from racing that stop (it kills for good after its grace period).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handles = [hora.allreduce_async(np.ones(1000), name=f"pending{i}") for i in range(10)]
    start = time.monotonic()
    failed = 0
    for handle in handles:
        try:
            hora.synchronize(handle)
        except hora.HoraInternalError:
            failed += 1
    try:
        hora.allreduce(np.ones(2), name="later")
    except hora.HoraInternalError as exc:
        print(f"rank {rank}: {failed} pending failed after {time.monotonic() - start:.1f} s; later: {exc}", flush=True)


@scenario
def handles() -> None:
    """poll, synchronize twice, duplicate in-flight names: through the request layer, and through the in-place
    forms' one native call (a named array), where the engine itself refuses the duplicate."""
    rank, size = hora.rank(), hora.size()
    for form, name in ((hora.allreduce_async, "dup"), (hora.allreduce_async_, "dup.inplace")):
        hora.barrier()
        if rank == 1:
            time.sleep(0.3)
        mine = np.full(3, rank + 1.0)
        handle = form(mine, name=name, op=hora.Sum)
        if rank == 0:
            assert not hora.poll(handle)  # rank 1 has not submitted yet
            try:
                form(np.ones(3), name=name)
            except ValueError as exc:
                assert f"'{name}' is already in flight" in str(exc), exc
            else:
                raise AssertionError(f"{form.__name__} accepted a duplicate in-flight name")
        first = hora.synchronize(handle)
        assert hora.poll(handle) and hora.synchronize(handle) is first
        np.testing.assert_array_equal(first, np.full(3, sum(range(1, size + 1))))
        # The name is free again once the request completed.
        np.testing.assert_array_equal(hora.allreduce(np.ones(3), name=name, op=hora.Sum), np.full(3, size))
    assert first is mine  # the in-place form's result is its array
    theirs = np.full(3, rank, np.int32)
    assert hora.synchronize(hora.broadcast_async_(theirs, 1, name="from.one")) is theirs
    np.testing.assert_array_equal(theirs, np.ones(3, np.int32))
    print(f"rank {rank}: handles ok", flush=True)


@scenario
def cache_eviction() -> None:
    """More distinct tensors per step than cache slots: results stay right step after step."""
    rank, size = hora.rank(), hora.size()
    for step in range(6):
        handles = [
            hora.allreduce_async(np.full(i + 1, rank + step, np.float32), name=f"c{i}", op=hora.Sum) for i in range(12)
        ]
        for i, handle in enumerate(handles):
            expected = sum(r + step for r in range(size))
            np.testing.assert_array_equal(hora.synchronize(handle), np.full(i + 1, expected, np.float32))
        # The same names with a new shape: the cached response must not be reused.
        np.testing.assert_array_equal(
            hora.allreduce(np.ones(step + 2), name="c0", op=hora.Sum), np.full(step + 2, size)
        )
        # Cached members of a group answer only that group: the same names alone, or in a group of another size,
        # must not be taken for it (a wrong answer would mix up the units that execute together, or hang).
        three = hora.grouped_allreduce([np.full(2, rank + i, np.float32) for i in range(3)], name="grp", op=hora.Sum)
        alone = hora.allreduce(np.full(2, rank, np.float32), name="grp.0", op=hora.Sum)
        two = hora.grouped_allreduce([np.full(2, rank * i, np.float32) for i in range(2)], name="grp", op=hora.Sum)
        for i in range(3):
            np.testing.assert_array_equal(three[i], np.full(2, sum(r + i for r in range(size))))
        np.testing.assert_array_equal(alone, np.full(2, sum(range(size))))
        np.testing.assert_array_equal(two[1], np.full(2, sum(range(size))))
    print(f"rank {rank}: cache ok", flush=True)


def poll_until_done(handle: int, timeout: float = 10.0) -> None:
    """Polls ``handle`` without waiting on it, so that only the background thread can complete it."""
    deadline = time.monotonic() + timeout
    while not hora.poll(handle):
        assert time.monotonic() < deadline, f"an asynchronous request made no progress without a waiter in {timeout} s"
        time.sleep(0.001)


@scenario
def caller_driven() -> None:
    """Synchronous calls run the engine on the calling thread; the background thread still serves
    asynchronous work, other threads' waits, and cycles this rank takes no part in."""
    rank, size = hora.rank(), hora.size()
    total = sum(range(1, size + 1))
    # Back-to-back synchronous calls: one automatic name, reused (from the second call on a cache hit).
    for step in range(300):
        result = hora.allreduce(np.full(5, (rank + 1) * step, np.float32), op=hora.Sum)
        np.testing.assert_array_equal(result, np.full(5, total * step, np.float32))
    # Asynchronous work that nobody waits for, right after synchronous calls: the background thread,
    # parked while this thread drove, takes it on by itself.
    handle = hora.allreduce_async(np.full(3, rank + 1.0), name="nobody.waits", op=hora.Sum)
    poll_until_done(handle)
    np.testing.assert_array_equal(hora.synchronize(handle), np.full(3, total))
    # Several threads wait at once: one drives, the others are served by it or take over.
    errors: list[BaseException] = []

    def worker(thread: int) -> None:
        try:
            for step in range(40):
                value = np.full(thread + 1, rank * 10.0 + step)
                hora.allreduce_(value, name=f"thread{thread}", op=hora.Sum)
                np.testing.assert_array_equal(value, np.full(thread + 1, 10.0 * sum(range(size)) + size * step))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads), "a waiting thread hung"
    # The last rank sits out a process set whose members call synchronously while it does nothing:
    # every cycle involves every rank, so its parked background thread must answer them.
    members = hora.add_process_set(list(range(size - 1)))
    if rank < size - 1:
        for step in range(100):
            result = hora.allreduce(np.full(2, float(step)), op=hora.Sum, process_set=members)
            np.testing.assert_array_equal(result, np.full(2, step * (size - 1.0)))
    else:
        time.sleep(0.5)
    hora.barrier()
    # A caller that computes between synchronous calls (a training step), on a host whose ranks have no spare
    # core: asynchronous work submitted during its computation waits for it (the background thread stays parked
    # through twice its usual time away, here 2 x 30 ms), and still completes when nobody waits.
    for _ in range(4):
        time.sleep(0.03)
        hora.allreduce(np.ones(1), name="step", op=hora.Sum)
    handle = hora.allreduce_async(np.full(3, rank + 1.0), name="during.compute", op=hora.Sum)
    time.sleep(0.01)
    spare_cores = len(os.sched_getaffinity(0)) >= 2 * hora.local_size()
    assert spare_cores or not hora.poll(handle), "the background thread ran a collective while the caller computed"
    poll_until_done(handle)
    np.testing.assert_array_equal(hora.synchronize(handle), np.full(3, total))
    hora.barrier()
    # Idle after all that: no thread of this rank may keep a core busy (spinning is brief, then it blocks).
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(1.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    busy = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert busy < 0.25, f"an idle rank used {busy:.2f} s of CPU in 1 s"
    print(f"rank {rank}: caller driven ok", flush=True)


@scenario
def dropped_handles() -> None:
    """Handles dropped without synchronize (fire-and-forget, or an exception in between), of every collective and of
    groups, with their inputs gone from Python too; then results that must still be right, and a shutdown with
    dropped requests still in flight on some ranks."""
    rank, size = hora.rank(), hora.size()
    for step in range(3):
        for i in range(20):
            hora.allreduce_async(np.ones((17, 17, 17), np.float32), name=f"d{step}.{i}")
        hora.allreduce_async_(np.ones(1000), name=f"inplace{step}")
        hora.allgather_async(np.full((rank + 1, 300), rank), name=f"g{step}")
        hora.broadcast_async_(np.full(500, rank, np.int64), root_rank=0, name=f"b{step}")
        hora.grouped_allreduce_async([np.ones(100), np.ones((7, 7), np.float32)], name=f"group{step}")
        hora.reducescatter_async(np.ones((size * 3, 50)), name=f"rs{step}")
        hora.alltoall_async(np.ones((size * 2, 40)), name=f"a2a{step}")
        gc.collect()
        hora.barrier()
        total = hora.allreduce(np.full(5, rank + step, np.float64), op=hora.Sum, name=f"check{step}")
        np.testing.assert_array_equal(total, np.full(5, sum(r + step for r in range(size))))
    # Left in flight: rank 0 submits requests nobody else does and drops them; then every rank shuts down (main()).
    if rank == 0:
        for i in range(5):
            hora.allreduce_async(np.ones(10_000), name=f"orphan{i}")
    gc.collect()
    hora.barrier()
    print(f"rank {rank}: dropped handles ok", flush=True)


@initializing_scenario
def init_with_process_sets() -> None:
    """``hora.init(process_sets=...)`` registers the sets on every rank."""
    first = hora.ProcessSet([1, 0])  # given in any order, kept sorted
    assert first.ranks == [0, 1] and first.process_set_id is None
    hora.init(process_sets=[first])
    rank = hora.rank()
    assert first.process_set_id is not None and first.process_set_id > 0
    if first.included():
        np.testing.assert_array_equal(hora.allreduce(np.ones(2), op=hora.Sum, process_set=first), [2.0, 2.0])
    np.testing.assert_array_equal(hora.allreduce(np.ones(2), op=hora.Sum), np.full(2, hora.size()))
    print(f"rank {rank}: init with process sets ok", flush=True)


def main() -> int:
    if sys.argv[1] not in INITS_ITSELF:
        hora.init()
    SCENARIOS[sys.argv[1]]()
    hora.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
