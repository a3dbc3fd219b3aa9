"""The rendezvous driver service.

One service serves every way of starting a job: ``horarun`` starts it before
its worker processes, and the Spark and Ray backends start it on their
drivers. It knows nothing about how workers were started. Workers connect,
register (slot index, host identity, listening address, rendezvous round) and
wait; once all ``num_workers`` of a round are in, each receives its
:class:`Assignment`. If they are not all in by the start timeout, every
waiting worker (and :meth:`wait`) gets an error naming exactly who is missing.
A worker that calls ``hora.shutdown()`` then ``hora.init()`` registers again
for the next round and gets the same rank (see :mod:`hora.driver.rounds`).

Workers may also open an event stream (``{"type": "events"}``) and send any
number of signed messages on it: the Spark backend streams each rank's output
lines and failures to its driver this way. The service hands every event to
its ``on_event`` callback, in order per stream, and a last
``{"type": "closed", "index": ...}`` when the worker's end of a stream that
named its worker closes (``index``: of the first message that carried one;
an elastic driver tells a worker that ended from one that died by it).

Every message is signed (see :mod:`hora.driver.wire`). Connections wait in
the :class:`~hora.driver.gate.Gate` until their first frame proves they know
the secret; only then do they get a thread of their own. A connection that
fails verification, or is too slow, too large or one too many, is logged and
dropped; its contents are never acted on.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from types import TracebackType

from hora.driver.elastic import ElasticRounds
from hora.driver.gate import Gate
from hora.driver.rounds import Rounds
from hora.driver.topology import Assignment, Registration
from hora.driver.wire import SignedChannel
from hora.exceptions import HoraError, RendezvousError

__all__ = ["DriverService"]

_log = logging.getLogger("hora.driver")


class DriverService:
    """Assigns ranks to the workers of one job, round after round.

    Args:
        num_workers: how many workers must register before any may start.
        secret: the per-job secret (32 random bytes) that signs every message.
        host: the address to listen on.
        port: the port to listen on; 0 picks a free one.
        start_timeout: seconds from :meth:`start` within which all workers must
            register (and, for each later round, from its first registration).
        expected_hosts: optional host of each slot index, used to say where a
            missing worker should have come from.
        on_event: called (on a service thread) with every message that
            workers send on their event streams; without it, streams are refused.
        handshake_timeout: seconds a new connection has to send its greeting
            and first, signed message; then it is dropped.
        max_pending: how many connections may wait to authenticate at once;
            one more drops the oldest of them.
        elastic: the rounds of an elastic job, whose membership its launcher
            changes (``num_workers`` is then only the first round's size).
            Workers are then placed in the open round, told to leave when
            dismissed, and may ask for host updates (``{"type": "hosts"}``).
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
        handshake_timeout: float = 10.0,
        max_pending: int = 64,
        elastic: ElasticRounds | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers!r}.")
        if len(secret) < 16:
            raise ValueError(f"The job secret must be at least 16 bytes, got {len(secret)}.")
        if max_pending < 1 or not handshake_timeout > 0:
            raise ValueError(
                f"max_pending must be at least 1 and handshake_timeout positive, got {max_pending!r} and "
                f"{handshake_timeout!r}."
            )
        self._num_workers = num_workers
        self._secret = secret
        self._start_timeout = start_timeout
        self._on_event = on_event
        self._lock = threading.Lock()
        self._closed = False
        self._streams: set[SignedChannel] = set()
        self._gate = Gate(
            socket.create_server((host, port)),
            secret,
            self._on_authenticated,
            deadline=handshake_timeout,
            max_pending=max_pending,
            frame_timeout=10.0,
        )
        address = self._gate.address
        self._rounds: Rounds | ElasticRounds = elastic or Rounds(
            num_workers, start_timeout, expected_hosts or {}, f"{address[0]}:{address[1]}"
        )

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` that workers connect to."""
        return self._gate.address

    def start(self) -> DriverService:
        """Starts accepting registrations; the start timeout of round 0 counts from now."""
        self._rounds.open()
        self._gate.start()
        return self

    def wait(self, round_number: int = 0) -> dict[int, Assignment]:
        """Blocks until every worker registered for a round (the first by default).

        Raises:
            RendezvousError: the round did not fill within the start timeout,
                or the service was stopped.
        """
        return self._rounds.wait(round_number)

    def registered(self, round_number: int = 0) -> set[int]:
        """The slot indexes that have registered for a rendezvous round (the first by default) so far.

        A round forgotten since (one before the latest complete round) reports
        every slot, or, if it failed, the slots it had when it failed.

        Safe to call from any thread. A launcher compares it with the workers
        that have exited: one that exited before its slot registered means the
        round can never fill.

        Args:
            round_number: the rendezvous round; 0 is every worker's first ``hora.init()``.

        Returns:
            A new set (the caller may keep or change it); empty for a round that has not started.
        """
        return self._rounds.registered(round_number)

    def latest_round(self) -> int:
        """The number of the latest rendezvous round that has started (0 before any worker registers).

        Safe to call from any thread. Every worker registers in every round in
        turn, so while this round is open, a worker that exits without having
        registered in it means it can never fill.
        """
        return self._rounds.latest()

    def stop(self) -> None:
        """Stops accepting connections and wakes every waiting worker."""
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams), set()
        self._rounds.close()
        self._gate.stop()
        for stream in streams:  # ends their threads' reads
            stream.close()

    def __enter__(self) -> DriverService:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _on_authenticated(self, channel: SignedChannel, message: dict) -> None:
        """Called by the gate: a genuine first message gets a thread, since it waits (rendezvous) or streams."""
        threading.Thread(target=self._serve, args=(channel, message), name="hora-driver-conn", daemon=True).start()

    def _serve(self, channel: SignedChannel, message: dict) -> None:
        try:
            if message["type"] == "events" and self._on_event is not None:
                self._stream_events(channel)
                return
            if message["type"] == "hosts" and isinstance(self._rounds, ElasticRounds):
                timestamp, result = self._rounds.updates_since(int(message.get("since", 0)))
                channel.send({"type": "hosts", "timestamp": timestamp, "result": int(result)})
                return
            if message["type"] != "register":
                channel.send({"type": "error", "message": f"Unknown request type {message['type']!r}."})
                return
            channel.send(self._register(message))
        except (HoraError, OSError, ValueError, KeyError) as exc:
            _log.warning("Dropped a driver connection from %s after an error: %s", channel.peer, exc)
        finally:
            channel.close()

    def _stream_events(self, channel: SignedChannel) -> None:
        """Passes each message of an event stream to ``on_event`` until the worker (or :meth:`stop`) closes it."""
        assert self._on_event is not None
        with self._lock:
            if self._closed:
                return
            self._streams.add(channel)
        index = None
        try:
            while True:
                try:
                    # A worker may be silent for hours (stop() closes the stream); a frame, once begun, may not.
                    message = channel.receive(idle=None)
                except (ConnectionError, OSError):
                    with self._lock:
                        closed_by_worker = not self._closed
                    if closed_by_worker and index is not None:  # it ended its stream, or died
                        self._on_event({"type": "closed", "index": index})
                    return
                if message.get("type") == "closed":
                    continue  # only the service says a stream closed
                if index is None and isinstance(message.get("index"), int):
                    index = message["index"]
                self._on_event(message)
        finally:
            with self._lock:
                self._streams.discard(channel)

    def _register(self, message: dict) -> dict:
        try:
            index = int(message["index"])
            host = str(message["host"])
            address = (str(message["address"][0]), int(message["address"][1]))
            round_number = int(message.get("round", 0))
        except (KeyError, TypeError, ValueError, IndexError):
            return {"type": "error", "message": f"Malformed registration: {message!r}."}
        try:
            if isinstance(self._rounds, ElasticRounds):
                placed = self._rounds.join(round_number, Registration(index, host, address))
                if placed is None:
                    return {"type": "leave"}
                round_number, a, updates, fresh = placed
            else:
                updates, fresh = 0, False
                a = self._rounds.join(round_number, Registration(index, host, address))
        except RendezvousError as exc:
            return {"type": "error", "message": str(exc)}
        return {
            "type": "assignment",
            "round": round_number,
            "rank": a.rank,
            "size": a.size,
            "local_rank": a.local_rank,
            "local_size": a.local_size,
            "cross_rank": a.cross_rank,
            "cross_size": a.cross_size,
            "peers": [list(peer) for peer in a.peers],
            "hosts": list(a.hosts),
            "updates": updates,
            "fresh": fresh,
        }
