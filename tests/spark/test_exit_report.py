"""A task's os._exit reports its code to the driver, and exits whatever happens to the report."""

from __future__ import annotations

import threading
import time

import pytest
from hora.driver import DriverService, EventStream
from hora.spark.barrier import EXIT_REPORT_SECONDS, _ExitReporter

SECRET = bytes(range(32))
pytestmark = pytest.mark.timeout(60)


class _BrokenEvents:
    """An event stream whose every call fails with something other than OSError."""

    def send(self, message: dict, *, within: float | None = None) -> bool:
        raise RuntimeError("the stream is in a state nobody expected")

    def close(self, *, within: float | None = None) -> None:
        raise RuntimeError("the stream is in a state nobody expected")


def _reporting_service(received: list[dict]) -> DriverService:
    return DriverService(1, SECRET, on_event=received.append)


def _wait_for(received: list[dict], count: int) -> list[dict]:
    deadline = time.monotonic() + 10
    while len(received) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return received


def test_the_exit_code_reaches_the_driver_before_the_process_exits() -> None:
    received: list[dict] = []
    exits: list[int] = []
    with _reporting_service(received) as service:
        events = EventStream(service.address, SECRET, timeout=5)
        _ExitReporter(exits.append, events, (), index=1, rank=4)(3)
        assert exits == [3]
        report = _wait_for(received, 2)
    assert [(m["type"], m["index"], m["rank"], m["code"]) for m in report[:1]] == [("exited", 1, 4, 3)]
    assert report[1:] == [{"type": "closed", "index": 1}]  # the service says whose stream ended


def test_a_send_in_progress_on_another_thread_does_not_hold_up_the_exit() -> None:
    exits: list[int] = []
    with _reporting_service([]) as service:
        events = EventStream(service.address, SECRET, timeout=5)
        holding, done = threading.Event(), threading.Event()

        def stuck_sender() -> None:  # a LineForwarder whose send blocks (a driver that does not read)
            with events._lock:
                holding.set()
                done.wait(30)

        sender = threading.Thread(target=stuck_sender)
        sender.start()
        try:
            assert holding.wait(10)
            started = time.monotonic()
            _ExitReporter(exits.append, events, (), index=0, rank=0)(5)
            took = time.monotonic() - started
        finally:
            done.set()
            sender.join(10)
        events.close()
    assert exits == [5]
    assert EXIT_REPORT_SECONDS * 0.9 <= took < 10.0  # it waited a moment for the stream, not for the sender


def test_an_exit_from_a_signal_handler_on_the_thread_holding_the_stream_does_not_hang() -> None:
    exits: list[int] = []
    with _reporting_service([]) as service:
        events = EventStream(service.address, SECRET, timeout=5)
        events._lock.acquire()  # as if the handler interrupted this thread inside events.send
        try:
            _ExitReporter(exits.append, events, (), index=0, rank=0)(7)
        finally:
            events._lock.release()
        events.close()
    assert exits == [7]


def test_the_process_exits_whatever_the_report_raises() -> None:
    exits: list[int] = []
    with pytest.raises(RuntimeError, match="a state nobody expected"):
        _ExitReporter(exits.append, _BrokenEvents(), (), index=0, rank=0)(9)  # type: ignore[arg-type]
    assert exits == [9]
