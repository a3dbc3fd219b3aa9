"""The driver service: rank assignment, signed messages, rendezvous timeouts."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from hora.driver import DriverService, Registration, assign_ranks, register
from hora.driver.wire import SignedChannel
from hora.exceptions import RendezvousError

SECRET = bytes(range(32))


def test_assign_ranks_groups_hosts_and_follows_horovod_cross_ranks() -> None:
    regs = [Registration(i, host, ("h", 1000 + i)) for i, host in enumerate(["a", "b", "a", "b", "a"])]
    got = assign_ranks(regs)
    # Hosts ordered by first index: a = indices 0, 2, 4 -> ranks 0, 1, 2; b = 1, 3 -> ranks 3, 4.
    assert [got[i].rank for i in range(5)] == [0, 3, 1, 4, 2]
    assert [(got[i].local_rank, got[i].local_size) for i in range(5)] == [(0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]
    assert [(got[i].cross_rank, got[i].cross_size) for i in range(5)] == [(0, 2), (1, 2), (0, 2), (1, 2), (0, 1)]
    assert got[0].peers == (("h", 1000), ("h", 1002), ("h", 1004), ("h", 1001), ("h", 1003))
    assert all(got[i].hosts == (0, 0, 0, 1, 1) for i in range(5))


def _register_all(service: DriverService, hosts: list[str], secret: bytes = SECRET) -> list[object]:
    results: list[object] = [None] * len(hosts)

    def one(index: int) -> None:
        try:
            results[index] = register(
                service.address, secret, index=index, host=hosts[index], address=("127.0.0.1", 5000 + index), timeout=5
            )
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return results


@pytest.mark.timeout(30)
def test_rendezvous_assigns_every_worker() -> None:
    with DriverService(3, SECRET, start_timeout=10) as service:
        results = _register_all(service, ["x", "x", "y"])
        assignments = service.wait()
    assert [r.rank for r in results] == [0, 1, 2]
    assert [r.local_rank for r in results] == [0, 1, 0]
    assert [r.hosts for r in results] == [(0, 0, 1)] * 3  # through the wire, as the workers see it
    assert assignments[2].peers == (("127.0.0.1", 5000), ("127.0.0.1", 5001), ("127.0.0.1", 5002))


@pytest.mark.timeout(30)
def test_rendezvous_timeout_names_the_missing_ranks_and_hosts() -> None:
    expected = {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
    with DriverService(4, SECRET, start_timeout=1.0, expected_hosts=expected) as service:
        results = _register_all(service, ["nodeA", "nodeA"])
        with pytest.raises(RendezvousError) as info:
            service.wait()
    message = "2 of 4 workers registered after 1 s; missing ranks 2, 3 on host nodeB"
    assert message in str(info.value)
    assert all(isinstance(r, RendezvousError) and message in str(r) for r in results)


def _raw_register_frame(service: DriverService) -> tuple[bytes, bytes]:
    """Performs a genuine registration while recording the client's bytes."""
    sent = bytearray()

    class Recording(socket.socket):
        def sendall(self, data, *args):  # type: ignore[override]
            sent.extend(data)
            return super().sendall(data, *args)

    sock = Recording(socket.AF_INET, socket.SOCK_STREAM)
    sock.connect(service.address)
    channel = SignedChannel(sock, SECRET, is_server=False, timeout=5)
    channel.send({"type": "register", "index": 0, "host": "h", "address": ["127.0.0.1", 1]})
    channel.receive()
    channel.close()
    return bytes(sent[:24]), bytes(sent[24:])


def _send_raw(service: DriverService, frame: bytes) -> bytes:
    with socket.create_connection(service.address, timeout=5) as sock:
        sock.sendall(b"HORADRV1" + bytes(16))
        sock.recv(24)
        sock.sendall(frame)
        return sock.recv(1000)


@pytest.mark.timeout(30)
def test_forged_replayed_and_tampered_messages_are_rejected(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="hora.driver")
    with DriverService(1, SECRET, start_timeout=10) as service:
        _, frame = _raw_register_frame(service)
        # Replayed: a genuine frame on a new connection (new nonce) is refused, and nothing is registered.
        assert _send_raw(service, frame) == b""
        # Tampered: one byte of the payload changed.
        tampered = frame[:-3] + bytes([frame[-3] ^ 1]) + frame[-2:]
        assert _send_raw(service, tampered) == b""
        # Forged: signed with another secret. The worker cannot tell this drop from a flood's, so it retries
        # until its timeout; every attempt is refused.
        with pytest.raises(RendezvousError, match="has the job's secret"):
            register(service.address, b"x" * 32, index=0, host="h", address=("127.0.0.1", 1), timeout=2)
    rejected = [r for r in caplog.records if "Rejected a driver connection" in r.getMessage()]
    assert len(rejected) >= 3, [r.getMessage() for r in caplog.records]
    assert all("signature check" in r.getMessage() for r in rejected)


def test_bad_arguments_are_reported() -> None:
    with pytest.raises(ValueError, match="num_workers must be at least 1, got 0"):
        DriverService(0, SECRET)
    with pytest.raises(ValueError, match="at least 16 bytes, got 3"):
        DriverService(1, b"abc")
