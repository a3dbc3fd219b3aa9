"""The rendezvous driver service.

One service serves every way of starting a job: ``horarun`` starts it before
its worker processes, and the Spark and Ray backends start it on their
drivers. It knows nothing about how workers were started. Workers connect,
register (slot index, host identity, listening address) and wait; once all
``num_workers`` are in, each receives its :class:`Assignment`. If they are not
all in by the start timeout, every waiting worker (and :meth:`wait`) gets an
error naming exactly who is missing.

Workers may also open an event stream (``{"type": "events"}``) and send any
number of signed messages on it: the Spark backend streams each rank's output
lines and failures to its driver this way. The service hands every event to
its ``on_event`` callback, in order per stream.

Every message is signed (see :mod:`hora.driver.wire`). A connection whose
message fails verification is logged and dropped; its contents are never
acted on.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType

from hora.driver.topology import Assignment, Registration, assign_ranks
from hora.driver.wire import SignedChannel
from hora.exceptions import AuthenticationError, HoraError, RendezvousError

__all__ = ["DriverService"]

_log = logging.getLogger("hora.driver")


class DriverService:
    """Assigns ranks to the workers of one job.

    Args:
        num_workers: how many workers must register before any may start.
        secret: the per-job secret (32 random bytes) that signs every message.
        host: the address to listen on.
        port: the port to listen on; 0 picks a free one.
        start_timeout: seconds from :meth:`start` within which all workers must register.
        expected_hosts: optional host of each slot index, used to say where a
            missing worker should have come from.
        on_event: called (on a service thread) with every message that
            workers send on their event streams; without it, streams are refused.
    """

    def __init__(
        self,
        num_workers: int,
        secret: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout: float = 30.0,
        expected_hosts: Mapping[int, str] | None = None,
        on_event: Callable[[dict], None] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers!r}.")
        if len(secret) < 16:
            raise ValueError(f"The job secret must be at least 16 bytes, got {len(secret)}.")
        self._num_workers = num_workers
        self._secret = secret
        self._start_timeout = start_timeout
        self._expected_hosts = dict(expected_hosts or {})
        self._registrations: dict[int, Registration] = {}
        self._assignments: dict[int, Assignment] | None = None
        self._failure: str | None = None
        self._condition = threading.Condition()
        self._deadline = float("inf")
        self._closed = False
        self._on_event = on_event
        self._streams: set[socket.socket] = set()
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="hora-driver", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` that workers connect to."""
        host, port = self._listener.getsockname()[:2]
        return host, port

    def start(self) -> DriverService:
        """Starts accepting registrations; the start timeout counts from now."""
        self._deadline = time.monotonic() + self._start_timeout
        self._thread.start()
        return self

    def wait(self) -> dict[int, Assignment]:
        """Blocks until every worker registered; raises RendezvousError at the timeout."""
        with self._condition:
            self._wait_for_assignments()
            assert self._assignments is not None
            return dict(self._assignments)

    def stop(self) -> None:
        """Stops accepting connections and wakes every waiting worker."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        self._listener.close()
        with self._condition:
            streams, self._streams = list(self._streams), set()
        for stream in streams:  # ends their handlers' reads
            stream.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def __enter__(self) -> DriverService:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), name="hora-driver-conn", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        channel = None
        try:
            channel = SignedChannel(conn, self._secret, is_server=True, timeout=10.0)
            message = channel.receive()
            if message["type"] == "events" and self._on_event is not None:
                self._stream_events(channel, conn)
                return
            if message["type"] != "register":
                channel.send({"type": "error", "message": f"Unknown request type {message['type']!r}."})
                return
            channel.settimeout(max(self._deadline - time.monotonic(), 0) + 10.0)
            channel.send(self._register(message))
        except AuthenticationError as exc:
            peer = channel.peer if channel else "an unknown peer"
            _log.warning("Rejected a driver connection from %s: %s", peer, exc)
        except (HoraError, OSError, ValueError, KeyError) as exc:
            _log.warning("Dropped a driver connection after an error: %s", exc)
        finally:
            conn.close()

    def _stream_events(self, channel: SignedChannel, conn: socket.socket) -> None:
        """Passes each message of an event stream to ``on_event`` until the worker (or :meth:`stop`) closes it."""
        assert self._on_event is not None
        with self._condition:
            if self._closed:
                return
            self._streams.add(conn)
        channel.settimeout(None)  # a worker may be silent for hours; stop() closes the stream
        try:
            while True:
                try:
                    message = channel.receive()
                except (ConnectionError, OSError):
                    return  # the worker closed its stream
                self._on_event(message)
        finally:
            with self._condition:
                self._streams.discard(conn)

    def _register(self, message: dict) -> dict:
        try:
            index = int(message["index"])
            host = str(message["host"])
            address = (str(message["address"][0]), int(message["address"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            return {"type": "error", "message": f"Malformed registration: {message!r}."}
        with self._condition:
            if not 0 <= index < self._num_workers:
                return {
                    "type": "error",
                    "message": f"Worker index {index} is outside 0..{self._num_workers - 1} for a job of "
                    f"{self._num_workers} workers.",
                }
            if index in self._registrations:
                return {"type": "error", "message": f"Worker index {index} registered twice."}
            self._registrations[index] = Registration(index, host, address)
            if len(self._registrations) == self._num_workers:
                self._assignments = assign_ranks(list(self._registrations.values()))
            self._condition.notify_all()
            try:
                self._wait_for_assignments()
            except RendezvousError as exc:
                return {"type": "error", "message": str(exc)}
            assert self._assignments is not None
            a = self._assignments[index]
            return {
                "type": "assignment",
                "rank": a.rank,
                "size": a.size,
                "local_rank": a.local_rank,
                "local_size": a.local_size,
                "cross_rank": a.cross_rank,
                "cross_size": a.cross_size,
                "peers": [list(peer) for peer in a.peers],
                "hosts": list(a.hosts),
            }

    def _wait_for_assignments(self) -> None:
        """Waits (holding the condition) until assigned, failed, closed or timed out."""
        while self._assignments is None and self._failure is None:
            remaining = self._deadline - time.monotonic()
            if self._closed:
                raise RendezvousError("The driver service was stopped before every worker registered.")
            if remaining <= 0:
                self._failure = self._missing_message()
                self._condition.notify_all()
                break
            self._condition.wait(timeout=min(remaining, 1.0))
        if self._failure is not None:
            raise RendezvousError(self._failure)

    def _missing_message(self) -> str:
        missing = [i for i in range(self._num_workers) if i not in self._registrations]
        where = {}
        for index in missing:
            where.setdefault(self._expected_hosts.get(index, "an unknown host"), []).append(str(index))
        places = "; ".join(f"{', '.join(indices)} on host {host}" for host, indices in where.items())
        return (
            f"{len(self._registrations)} of {self._num_workers} workers registered after "
            f"{self._start_timeout:g} s; missing ranks {places}. Check that those workers started "
            f"(see their output) and can reach the driver at {self.address[0]}:{self.address[1]}."
        )
