"""The worker side of rendezvous."""

from __future__ import annotations

import socket
import threading
from typing import Any

from hora.driver.topology import Assignment
from hora.driver.wire import SignedChannel
from hora.exceptions import RendezvousError

__all__ = ["EventStream", "register"]


def register(
    driver: tuple[str, int],
    secret: bytes,
    *,
    index: int,
    host: str,
    address: tuple[str, int],
    timeout: float,
    round_number: int = 0,
) -> Assignment:
    """Registers this worker with the driver service and waits for its assignment.

    Args:
        driver: ``(host, port)`` of the driver service.
        secret: the job secret.
        index: this worker's slot index.
        host: this worker's host identity.
        address: where this worker accepts peer connections.
        timeout: seconds to wait for every worker of the job to register.
        round_number: the rendezvous round this registration joins: 0 for a
            process's first ``hora.init()`` in this job, one more for each later one.

    Raises:
        RendezvousError: the driver is unreachable, refused the registration,
            or not all workers registered in time.
    """
    try:
        sock = socket.create_connection(driver, timeout=timeout)
    except OSError as exc:
        raise RendezvousError(f"Could not reach the Hora driver service at {driver[0]}:{driver[1]}.") from exc
    channel = SignedChannel(sock, secret, is_server=False, timeout=timeout + 10.0)
    try:
        channel.send(
            {"type": "register", "index": index, "host": host, "address": list(address), "round": round_number}
        )
        reply = channel.receive()
    except (OSError, ConnectionError) as exc:
        raise RendezvousError(
            f"Lost the connection to the Hora driver service at {driver[0]}:{driver[1]} during rendezvous."
        ) from exc
    finally:
        channel.close()
    if reply["type"] == "error":
        raise RendezvousError(reply["message"])
    return Assignment(
        rank=reply["rank"],
        size=reply["size"],
        local_rank=reply["local_rank"],
        local_size=reply["local_size"],
        cross_rank=reply["cross_rank"],
        cross_size=reply["cross_size"],
        peers=tuple((h, int(p)) for h, p in reply["peers"]),
        hosts=tuple(int(h) for h in reply["hosts"]),
    )


class EventStream:
    """A worker's stream of signed messages to the driver service (output lines, failures).

    Sending is thread-safe. Once the driver is gone, sends are dropped
    silently: a worker's output must never fail because nobody listens.
    """

    def __init__(self, driver: tuple[str, int], secret: bytes, *, timeout: float) -> None:
        try:
            sock = socket.create_connection(driver, timeout=timeout)
            self._channel: SignedChannel | None = SignedChannel(sock, secret, is_server=False, timeout=timeout)
            self._channel.send({"type": "events"})
        except OSError as exc:
            raise RendezvousError(f"Could not reach the Hora driver service at {driver[0]}:{driver[1]}.") from exc
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        """Sends one JSON-serialisable message; drops it if the stream is closed or broken."""
        with self._lock:
            if self._channel is None:
                return
            try:
                self._channel.send(message)
            except OSError:
                self._channel.close()
                self._channel = None

    def close(self) -> None:
        """Ends the stream."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
