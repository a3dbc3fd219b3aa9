"""The TCP transport on its own: authentication of connections, and no-progress timeouts."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hora import _native

SECRET = b"s" * 32


def connect_pair(secrets: tuple[bytes, bytes], timeout: float = 5.0) -> list[object]:
    """Connects ranks 0 and 1 from two threads; returns each transport or exception."""
    listeners = [_native.TcpListener("127.0.0.1", 0) for _ in range(2)]
    peers = [("127.0.0.1", listener.port) for listener in listeners]
    results: list[object] = [None, None]

    def body(rank: int) -> None:
        try:
            results[rank] = _native.connect(listeners[rank], rank, peers, secrets[rank], 2.0, timeout)
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for listener in listeners:
        listener.close()
    return results


@pytest.mark.timeout(30)
def test_connection_with_another_secret_is_refused(capfd: pytest.CaptureFixture[str]) -> None:
    acceptor, connector = connect_pair((SECRET, b"x" * 32))
    assert isinstance(connector, _native.HoraInternalError)
    assert "Rank 1 could not connect to rank 0" in str(connector)
    assert isinstance(acceptor, _native.HoraInternalError)
    assert "Rank 0 timed out after 2 s waiting for connections from ranks 1." in str(acceptor)
    assert "rank 0 rejected a connection from 127.0.0.1" in capfd.readouterr().err


@pytest.mark.timeout(30)
def test_silent_peer_times_out_and_breaks_the_transport() -> None:
    first, second = connect_pair((SECRET, SECRET), timeout=0.5)
    assert isinstance(first, _native.Transport) and isinstance(second, _native.Transport)
    data = np.ones(1000, np.float32)
    with pytest.raises(_native.HoraInternalError, match=r"no data moved for 0.5 s .* rank 1 \(127\.0\.0\.1:\d+\)"):
        _native.allreduce(first, data, _native.DataType.FLOAT32, _native.ReduceOp.SUM)
    # Broken from now on: later requests fail at once with the same cause.
    with pytest.raises(_native.HoraInternalError, match=r"no data moved for 0\.5 s"):
        _native.barrier(first)
