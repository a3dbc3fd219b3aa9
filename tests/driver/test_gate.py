"""What a stranger on the network can cost the driver: bytes, time and connections are bounded.

Every test here talks to a service on 127.0.0.1 with a bounded number of
sockets, all closed at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from hora.driver import DriverService, gate, register
from hora.driver.wire import HELLO_BYTES, PREAUTH_MAX_PAYLOAD, SignedChannel

SECRET = bytes(range(32))
pytestmark = pytest.mark.timeout(60)


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _greeted(service: DriverService) -> socket.socket:
    """A raw connection that has exchanged greetings (with a zero nonce) and sent nothing else."""
    sock = socket.create_connection(service.address, timeout=5)
    sock.sendall(b"HORADRV1" + bytes(16))
    assert len(sock.recv(HELLO_BYTES, socket.MSG_WAITALL)) == HELLO_BYTES
    return sock


def _closed_by_peer(sock: socket.socket, within: float) -> float | None:
    """Seconds until the service closes ``sock`` (None if it stays open ``within`` seconds)."""
    started = time.monotonic()
    while (left := started + within - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            break
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except ConnectionResetError:
            return time.monotonic() - started
    return None


@contextlib.contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _register_all(service: DriverService, count: int, timeout: float) -> list[object]:
    results: list[object] = [None] * count

    def one(index: int) -> None:
        try:
            results[index] = register(
                service.address, SECRET, index=index, host="h", address=("127.0.0.1", 7000 + index), timeout=timeout
            )
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 15)
    return results


def test_huge_frames_are_dropped_after_their_header_without_being_read(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="hora.driver")
    huge = 16 * 1024 * 1024 - 1
    with DriverService(1, SECRET, start_timeout=30) as service, _sockets() as opened:
        before = _rss_bytes()
        for _ in range(60):
            sock = _greeted(service)
            opened.append(sock)
            sock.sendall(struct.pack(">I", huge) + bytes(32))  # a length header and a (wrong) MAC
        # Each is dropped on its header alone: the service never waits for, or allocates, the payload.
        # Within the 10 s handshake deadline: dropped for the header, not for being slow (upper bound for a hang).
        dropped = [_closed_by_peer(sock, within=9.0) for sock in opened]
        assert all(seconds is not None for seconds in dropped), dropped
        for sock in opened:  # whatever they still send goes nowhere
            with contextlib.suppress(OSError):
                sock.sendall(bytes(256 * 1024))
        growth = _rss_bytes() - before
        ports = [sock.getsockname()[1] for sock in opened]
    assert growth < 50 * 1024 * 1024, f"the service grew by {growth / 2**20:.0f} MiB"
    messages = [r.getMessage() for r in caplog.records]
    for port in ports:
        expected = (
            f"Rejected a driver connection from 127.0.0.1:{port}: Frame of {huge} bytes exceeds the limit of "
            f"{PREAUTH_MAX_PAYLOAD} bytes."
        )
        assert expected in messages


def test_a_slowloris_is_dropped_at_the_handshake_deadline(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="hora.driver")
    with DriverService(1, SECRET, start_timeout=30, handshake_timeout=1.0) as service, _sockets() as opened:
        sock = socket.create_connection(service.address, timeout=5)
        opened.append(sock)
        started = time.monotonic()
        dropped_after = None
        greeting = b"HORADRV1" + bytes(16) + struct.pack(">I", 100)
        for byte in greeting:  # one byte every 0.2 s: each recv() alone would be quick
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                dropped_after = time.monotonic() - started
                break
            if _closed_by_peer(sock, within=0.2) is not None:
                dropped_after = time.monotonic() - started
                break
        if dropped_after is None:  # a loaded machine: the whole greeting went out before the gate's sweep
            waited = _closed_by_peer(sock, within=20.0)
            dropped_after = None if waited is None else time.monotonic() - started
        port = sock.getsockname()[1]
    # Not before the 1 s deadline (each byte arrived well within any per-recv timeout); the upper bound only
    # guards against never.
    assert dropped_after is not None and 0.9 <= dropped_after < 25.0, dropped_after
    rejected = [r.getMessage() for r in caplog.records if f"from 127.0.0.1:{port}:" in r.getMessage()]
    assert len(rejected) == 1 and "within the 1 s allowed" in rejected[0], rejected


def test_workers_register_while_stray_connections_fill_the_gate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="hora.driver")
    strays = 80  # more than the 64 that may wait: the gate evicts the oldest
    with DriverService(3, SECRET, start_timeout=10) as service, _sockets() as opened:
        for number in range(strays):
            sock = socket.create_connection(service.address, timeout=5)
            opened.append(sock)
            if number % 2:  # half idle, half stalled half-way through their greeting
                sock.sendall(b"HORA")
        # Registered at all means within the 10 s start timeout, however loaded the machine.
        results = _register_all(service, 3, timeout=10)
        stray_ports = {sock.getsockname()[1] for sock in opened}
    assert [getattr(r, "rank", r) for r in results] == [0, 1, 2]
    evicted = [r.getMessage() for r in caplog.records if "it was the oldest" in r.getMessage()]
    assert strays - 64 <= len(evicted) <= strays - 64 + 3, evicted
    evicted_ports = {int(m.split("127.0.0.1:")[1].split(":")[0]) for m in evicted}
    assert evicted_ports <= stray_ports  # only strays were pushed out, never a worker


def test_an_authenticated_stream_may_send_frames_larger_than_the_first() -> None:
    events: list[dict] = []
    arrived = threading.Event()

    def on_event(message: dict) -> None:
        events.append(message)
        arrived.set()

    with DriverService(1, SECRET, on_event=on_event) as service:
        sock = socket.create_connection(service.address, timeout=5)
        channel = SignedChannel(sock, SECRET, is_server=False, timeout=5)
        channel.send({"type": "events"})
        channel.send({"type": "line", "text": "x" * (64 * PREAUTH_MAX_PAYLOAD)})
        assert arrived.wait(10)
        channel.close()
    assert events == [{"type": "line", "text": "x" * (64 * PREAUTH_MAX_PAYLOAD)}]


def test_a_frame_trickled_past_its_deadline_fails_even_if_each_recv_is_quick() -> None:
    server_sock, client_sock = socket.socketpair()
    holder: dict[str, SignedChannel] = {}
    thread = threading.Thread(
        target=lambda: holder.setdefault("server", SignedChannel(server_sock, SECRET, is_server=True, timeout=1.0))
    )
    thread.start()
    client = SignedChannel(client_sock, SECRET, is_server=False, timeout=5)
    thread.join(5)
    server = holder["server"]
    stop = threading.Event()

    def trickle() -> None:  # a byte every 0.2 s: well inside a per-recv timeout of 1 s
        while not stop.wait(0.2):
            with contextlib.suppress(OSError):
                client_sock.send(b"\x00")

    trickler = threading.Thread(target=trickle)
    trickler.start()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"of 36 bytes within 1 s"):
            server.receive()
        assert time.monotonic() - started < 15.0  # while the trickle would go on forever
    finally:
        stop.set()
        trickler.join(5)
        server.close()
        client.close()


def test_workers_register_during_a_flood_of_new_connections() -> None:
    stop = threading.Event()
    flood: list[socket.socket] = []

    def churn() -> None:  # new idle connections as fast as one thread can open them, at most 300
        while not stop.is_set() and len(flood) < 300:
            with contextlib.suppress(OSError):
                flood.append(socket.create_connection(service.address, timeout=5))

    with DriverService(3, SECRET, start_timeout=15, max_pending=8) as service, _sockets() as opened:
        flooder = threading.Thread(target=churn)
        flooder.start()
        try:
            time.sleep(0.2)  # the gate is full and evicting
            results = _register_all(service, 3, timeout=15)
        finally:
            stop.set()
            flooder.join(10)
            opened.extend(flood)
    assert [getattr(r, "rank", r) for r in results] == [0, 1, 2]


def test_workers_whose_connections_a_flood_evicts_register_on_a_retry() -> None:
    # Room for only two waiting connections and four threads opening new ones: the gate accepts a batch of
    # them per wakeup, each evicting the oldest, so a worker's connection is usually dropped before its frame
    # is read (EOF or reset before the answer). The flood is bounded; the workers' retries get through after.
    stop = threading.Event()
    flood: list[socket.socket] = []

    def churn() -> None:
        while not stop.is_set() and len(flood) < 400:
            with contextlib.suppress(OSError):
                flood.append(socket.create_connection(service.address, timeout=5))

    with DriverService(4, SECRET, start_timeout=30, max_pending=2) as service, _sockets() as opened:
        flooders = [threading.Thread(target=churn) for _ in range(4)]
        for flooder in flooders:
            flooder.start()
        try:
            time.sleep(0.1)  # the gate is full and evicting
            results = _register_all(service, 4, timeout=30)
        finally:
            stop.set()
            for flooder in flooders:
                flooder.join(10)
            opened.extend(flood)
    assert [getattr(r, "rank", r) for r in results] == [0, 1, 2, 3]


def test_the_gate_survives_an_unexpected_error_handing_a_connection_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hora.driver")
    hand_on = DriverService._on_authenticated
    calls = itertools.count()

    def failing_once(self: DriverService, channel: SignedChannel, message: dict) -> None:
        if next(calls) == 0:  # as Thread.start does when no thread can be had
            raise RuntimeError("can't start new thread")
        hand_on(self, channel, message)

    monkeypatch.setattr(DriverService, "_on_authenticated", failing_once)
    with DriverService(2, SECRET, start_timeout=20) as service:
        results = _register_all(service, 2, timeout=20)  # the first attempt loses its connection and retries
    assert [getattr(r, "rank", r) for r in results] == [0, 1]
    failed = [r for r in caplog.records if "The driver's gate failed serving 127.0.0.1:" in r.getMessage()]
    assert len(failed) == 1 and "can't start new thread" in (failed[0].exc_text or ""), caplog.text


def test_stop_leaves_the_selector_to_a_gate_thread_that_does_not_stop_in_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hora.driver")
    monkeypatch.setattr(gate, "_STOP_JOIN_SECONDS", 0.2)
    release = threading.Event()
    handed_on: list[SignedChannel] = []

    def slow(channel: SignedChannel, message: dict) -> None:  # breaks the "return at once" contract
        handed_on.append(channel)
        release.wait(10)

    door = gate.Gate(socket.create_server(("127.0.0.1", 0)), SECRET, slow, deadline=5, max_pending=4, frame_timeout=5)
    door.start()
    address = door.address
    client = SignedChannel(socket.create_connection(address, timeout=5), SECRET, is_server=False, timeout=5)
    try:
        client.send({"type": "register"})
        deadline = time.monotonic() + 10
        while not handed_on and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handed_on, "the gate never handed the connection on"
        door.stop()  # the thread is inside slow(): stop() must not close the selector under it
        assert door._thread.is_alive()
        assert "did not stop within 0.2 s" in caplog.text
        release.set()
        door._thread.join(10)
        assert not door._thread.is_alive()
        assert "Traceback" not in caplog.text  # the thread ended cleanly and closed its own sockets
        with pytest.raises(ConnectionRefusedError):  # the thread closed the listener as it ended
            socket.create_connection(address, timeout=2)
    finally:
        release.set()
        client.close()
        for channel in handed_on:
            channel.close()


def test_bad_limits_are_reported() -> None:
    with pytest.raises(ValueError, match="max_pending must be at least 1 and handshake_timeout positive, got 0 and 10"):
        DriverService(1, SECRET, max_pending=0)
    with pytest.raises(ValueError, match="got 64 and -1"):
        DriverService(1, SECRET, handshake_timeout=-1)
