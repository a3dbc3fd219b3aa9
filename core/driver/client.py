"""The worker side of rendezvous."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from hora.driver.topology import Assignment
from hora.driver.wire import SignedChannel
from hora.exceptions import RemovedFromJobError, RendezvousError

__all__ = ["EventStream", "Joined", "host_updates", "join_round", "register"]


@dataclass(frozen=True)
class Joined:
    """A worker's place in the rendezvous round it joined.

    Attributes:
        round: the round's number.
        assignment: the worker's rank and peers.
        host_updates: in an elastic job, the latest host update the round
            already reflects (see :func:`host_updates`); 0 otherwise.
        fresh: in an elastic job, the round has workers the previous round
            had not: the state must be synced from rank 0.
    """

    round: int
    assignment: Assignment
    host_updates: int = 0
    fresh: bool = False


# Backoff between registration attempts whose connection failed: short at first (a flood passes in
# milliseconds to seconds), never longer than a second (a retry is one connection the gate reads at once).
_FIRST_RETRY_SECONDS = 0.05
_LONGEST_RETRY_SECONDS = 1.0


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

    The same as :func:`join_round`, without the round the driver placed the worker in.
    """
    joined = join_round(
        driver, secret, index=index, host=host, address=address, timeout=timeout, round_number=round_number
    )
    return joined.assignment


def join_round(
    driver: tuple[str, int],
    secret: bytes,
    *,
    index: int,
    host: str,
    address: tuple[str, int],
    timeout: float,
    round_number: int = 0,
) -> Joined:
    """Registers this worker with the driver service and waits for its round and assignment.

    A connection that fails before the driver's signed answer (refused, reset,
    closed) is retried with a short backoff until ``timeout``: the driver's
    gate drops the oldest waiting connections when strays flood it, and a
    worker may start before its driver listens. A failed signature check or
    the driver's explicit refusal is never retried. A retry is safe even if
    the driver did read the lost attempt: the same slot, host and address
    registering again in a round is the same worker asking again.

    Args:
        driver: ``(host, port)`` of the driver service.
        secret: the job secret.
        index: this worker's slot index.
        host: this worker's host identity.
        address: where this worker accepts peer connections.
        timeout: seconds to wait for every worker of the job to register.
        round_number: the rendezvous round this registration joins: 0 for a
            process's first ``hora.init()`` in this job, one more for each later one.
            An elastic job's driver places the worker in its open round instead.

    Returns:
        The round the worker joined and its place in it.

    Raises:
        RendezvousError: the driver is unreachable, refused the registration,
            or not all workers registered in time.
        RemovedFromJobError: the worker's elastic job goes on without it.
        AuthenticationError: the driver's answer failed its signature check.
    """
    message = {"type": "register", "index": index, "host": host, "address": list(address), "round": round_number}
    deadline = time.monotonic() + timeout
    backoff = _FIRST_RETRY_SECONDS
    attempts = 0
    while True:
        attempts += 1
        try:
            reply = _ask(driver, secret, message, deadline)
            break
        except ConnectionError as exc:  # refused, reset, or closed before the answer: maybe a flood, retry
            failure: OSError = exc
        except OSError as exc:  # a timeout, or no route: the deadline has passed or retrying cannot help
            raise RendezvousError(
                f"Could not register with the Hora driver service at {driver[0]}:{driver[1]}: {str(exc).rstrip('.')}. "
                "Check that the driver is running and reachable from this host."
            ) from exc
        pause = min(backoff, deadline - time.monotonic())
        if pause <= 0:
            raise RendezvousError(
                f"Could not register with the Hora driver service at {driver[0]}:{driver[1]} within {timeout:g} s "
                f"({attempts} attempts); the last failed with: {failure}. Check that the driver is running and "
                "that this worker has the job's secret (the driver drops a connection whose signature fails)."
            ) from failure
        time.sleep(pause)
        backoff = min(backoff * 2, _LONGEST_RETRY_SECONDS)
    if reply["type"] == "error":
        raise RendezvousError(reply["message"])
    if reply["type"] == "leave":
        raise RemovedFromJobError(
            f"Worker index {index} on host {host} is no longer part of its elastic job (its host was removed or "
            "blacklisted, or the job is at its largest size); it should exit."
        )
    assignment = Assignment(
        rank=reply["rank"],
        size=reply["size"],
        local_rank=reply["local_rank"],
        local_size=reply["local_size"],
        cross_rank=reply["cross_rank"],
        cross_size=reply["cross_size"],
        peers=tuple((h, int(p)) for h, p in reply["peers"]),
        hosts=tuple(int(h) for h in reply["hosts"]),
    )
    return Joined(int(reply["round"]), assignment, int(reply.get("updates", 0)), bool(reply.get("fresh", False)))


def host_updates(driver: tuple[str, int], secret: bytes, since: int, *, timeout: float) -> tuple[int, int]:
    """Asks an elastic job's driver what changed in its hosts after update ``since``.

    Returns:
        The number of the latest update, and the union of the changes after
        ``since`` (a :class:`~hora.driver.elastic.HostUpdateResult` value).

    Raises:
        RendezvousError: the driver could not be asked or answered with an error.
    """
    try:
        reply = _ask(driver, secret, {"type": "hosts", "since": since}, time.monotonic() + timeout)
    except OSError as exc:
        raise RendezvousError(
            f"Could not ask the Hora driver service at {driver[0]}:{driver[1]} for host updates: {exc}."
        ) from exc
    if reply.get("type") != "hosts":
        raise RendezvousError(f"The Hora driver service did not answer a host-update request: {reply!r}.")
    return int(reply["timestamp"]), int(reply["result"])


def _ask(driver: tuple[str, int], secret: bytes, message: dict[str, Any], deadline: float) -> dict[str, Any]:
    """One attempt: connect, send the registration, wait for the answer (at most 10 s past ``deadline``)."""
    remaining = max(deadline - time.monotonic(), 0.01)
    sock = socket.create_connection(driver, timeout=remaining)
    try:
        # The driver answers once the round fills or times out, at the deadline at the latest: 10 s of slack.
        channel = SignedChannel(sock, secret, is_server=False, timeout=remaining + 10.0)
    except BaseException:
        sock.close()
        raise
    try:
        channel.send(message)
        return channel.receive()
    finally:
        channel.close()


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
        self._timeout = timeout

    def send(self, message: dict[str, Any], *, within: float | None = None) -> bool:
        """Sends one JSON-serialisable message; drops it if the stream is closed or broken.

        Args:
            message: the message.
            within: None to wait as long as the stream needs (another
                thread's send, a slow driver). Otherwise the most seconds
                to wait, for the stream's lock and then for the send: for a
                last word on the way out, which must not hold up the exit
                (nor deadlock when it interrupts a send on its own thread).
                A send cut short breaks the stream, which is then closed.

        Returns:
            Whether the message was sent.
        """
        if not self._lock.acquire(timeout=-1 if within is None else max(within, 0.0)):
            return False
        try:
            if self._channel is None:
                return False
            if within is not None:
                self._channel.settimeout(max(within, 0.001))
            try:
                self._channel.send(message)
            except OSError:
                self._channel.close()
                self._channel = None
                return False
            if within is not None:
                self._channel.settimeout(self._timeout)
            return True
        finally:
            self._lock.release()

    def close(self, *, within: float | None = None) -> None:
        """Ends the stream; with ``within``, waits at most that long for another send to finish (else leaves it)."""
        if not self._lock.acquire(timeout=-1 if within is None else max(within, 0.0)):
            return
        try:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
        finally:
            self._lock.release()
