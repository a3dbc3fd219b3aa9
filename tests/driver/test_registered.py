"""DriverService.registered(): which slots registered in a round, as launchers ask while workers wait."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import pytest
from hora.driver import DriverService, register
from hora.exceptions import RendezvousError

SECRET = bytes(range(32))
pytestmark = pytest.mark.timeout(60)


def _start_registering(service: DriverService, indexes: list[int], number: int = 0) -> list[threading.Thread]:
    """Registers each slot in ``indexes`` for round ``number`` on its own thread (each waits for the round)."""

    def one(index: int) -> None:
        # The service may stop before a round fills: these tests check registered(), not the assignment.
        with contextlib.suppress(RendezvousError, OSError):
            register(service.address, SECRET, index=index, host="h", address=("127.0.0.1", 7000 + index),
                     timeout=10, round_number=number)  # fmt: skip

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in indexes]
    for thread in threads:
        thread.start()
    return threads


def _until(service: DriverService, expected: set[int], number: int = 0) -> set[int]:
    """Polls registered() until it equals ``expected`` (or 10 s pass); returns what it last said."""
    deadline = time.monotonic() + 10
    seen = service.registered(number)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        seen = service.registered(number)
    return seen


def test_registered_grows_as_slots_register_and_is_complete_once_the_round_fills() -> None:
    with DriverService(3, SECRET, start_timeout=20) as service:
        assert service.registered() == set()
        waiting = _start_registering(service, [0, 2])
        assert _until(service, {0, 2}) == {0, 2}  # slot 1 is missing: round 0 cannot fill
        assert service.registered(1) == set()  # round 1 has not started
        copy = service.registered()
        copy.add(1)
        assert service.registered() == {0, 2}  # a snapshot, not the service's own set
        waiting += _start_registering(service, [1])
        assert _until(service, {0, 1, 2}) == {0, 1, 2}
        assert sorted(service.wait()) == [0, 1, 2]
        for thread in waiting:
            thread.join(15)
        assert not any(thread.is_alive() for thread in waiting)


def test_registered_in_later_rounds_and_rounds_already_forgotten() -> None:
    with DriverService(2, SECRET, start_timeout=20) as service:
        for number in range(3):
            for thread in _start_registering(service, [0, 1], number):
                thread.join(15)
        # Round 2 filled, so round 1 is forgotten; every worker registered in it all the same.
        assert [service.registered(n) for n in range(3)] == [{0, 1}] * 3
        assert service.registered(3) == set()
        late = _start_registering(service, [1], 3)
        assert _until(service, {1}, 3) == {1}
        assert service.registered(0) == {0, 1}  # the round launchers watch is not disturbed by later ones
    for thread in late:
        thread.join(15)


def test_refused_registrations_are_not_counted() -> None:
    with DriverService(2, SECRET, start_timeout=20) as service:
        waiting = _start_registering(service, [0])
        assert _until(service, {0}) == {0}
        with pytest.raises(RendezvousError, match="Worker index 0 registered twice in rendezvous round 0"):
            register(service.address, SECRET, index=0, host="h", address=("127.0.0.1", 7100), timeout=5)
        with pytest.raises(RendezvousError, match=r"Worker index 5 is outside 0\.\.1"):
            register(service.address, SECRET, index=5, host="h", address=("127.0.0.1", 7101), timeout=5)
        with pytest.raises((RendezvousError, ConnectionError, OSError)):  # the wrong secret: dropped unread
            register(service.address, b"x" * 32, index=1, host="h", address=("127.0.0.1", 7102), timeout=2)
        assert service.registered() == {0}
    for thread in waiting:
        thread.join(15)


def test_registered_is_safe_to_call_from_many_threads_while_workers_register() -> None:
    size = 8
    snapshots: list[list[set[int]]] = [[] for _ in range(4)]
    stop = threading.Event()

    def watch(seen: list[set[int]]) -> None:
        while not stop.is_set():
            seen.append(service.registered())

    with DriverService(size, SECRET, start_timeout=20) as service:
        watchers = [threading.Thread(target=watch, args=(seen,), daemon=True) for seen in snapshots]
        for watcher in watchers:
            watcher.start()
        workers = _start_registering(service, list(range(size)))
        assert _until(service, set(range(size))) == set(range(size))
        for thread in workers:
            thread.join(15)
        stop.set()
        for watcher in watchers:
            watcher.join(5)
    for seen in snapshots:
        assert seen, "a watcher never ran"
        # Each caller sees the registrations only grow, and never a slot that did not register.
        assert all(earlier <= later for earlier, later in itertools.pairwise(seen))
        assert all(snapshot <= set(range(size)) for snapshot in seen)


def test_a_forgotten_round_that_failed_reports_the_slots_it_had() -> None:
    with DriverService(2, SECRET, start_timeout=2) as service:
        assert service.latest_round() == 0
        for thread in _start_registering(service, [0, 1], 0):
            thread.join(15)
        with pytest.raises(RendezvousError, match=r"In rendezvous round 1 .* 1 of 2 workers registered"):
            register(service.address, SECRET, index=0, host="h", address=("127.0.0.1", 7000), timeout=5,
                     round_number=1)  # fmt: skip
        assert service.latest_round() == 1
        for thread in _start_registering(service, [0, 1], 2):
            thread.join(15)
        assert service.latest_round() == 2
        # Round 2 filled, so round 1 is forgotten; it failed with slot 1 missing, and still says so.
        assert [service.registered(n) for n in range(3)] == [{0, 1}, {0}, {0, 1}]


def test_the_latest_round_is_the_one_workers_may_be_waiting_in() -> None:
    with DriverService(2, SECRET, start_timeout=20) as service:
        for thread in _start_registering(service, [0, 1], 0):
            thread.join(15)
        assert (service.latest_round(), service.registered(service.latest_round())) == (0, {0, 1})
        waiting = _start_registering(service, [1], 1)  # slot 1 called shutdown() then init(); slot 0 has not yet
        assert _until(service, {1}, 1) == {1}
        assert (service.latest_round(), service.registered(service.latest_round())) == (1, {1})
    for thread in waiting:
        thread.join(15)


def test_a_retried_registration_of_the_same_worker_is_not_a_duplicate() -> None:
    # A worker whose answer was lost registers again with the same slot, host and address: it gets its place.
    with DriverService(2, SECRET, start_timeout=20) as service:
        first = _start_registering(service, [0])
        assert _until(service, {0}) == {0}
        again: list[object] = []
        retry = threading.Thread(
            target=lambda: again.append(
                register(service.address, SECRET, index=0, host="h", address=("127.0.0.1", 7000), timeout=10)
            )
        )
        retry.start()
        for thread in _start_registering(service, [1]):
            thread.join(15)
        retry.join(15)
        assert [getattr(a, "rank", a) for a in again] == [0]
        assert service.registered() == {0, 1}
    for thread in first:
        thread.join(15)
