"""The driver's front door: connections wait here until they prove they know the job secret.

Anything that can reach the driver's port can connect (multi-host jobs bind
``0.0.0.0``), so until a connection has sent one genuine frame it gets no
thread and little memory. One thread runs a selector over the listener and
every unauthenticated connection: it answers each greeting, reads the
client's greeting and first frame without ever blocking on one peer, and
hands the connection on (to ``on_authenticated``) once that frame's MAC
checks out. What a stranger can cost is bounded three ways:

- bytes: the first frame's length is checked against
  :data:`~hora.driver.wire.PREAUTH_MAX_PAYLOAD` before its payload is read,
  and reads never ask for more than the frame still needs;
- time: the greeting and the first frame must be complete within
  ``deadline`` seconds of the connection being accepted, however the bytes
  are spaced (a slowloris sending a byte every few seconds is dropped then);
- count: at most ``max_pending`` connections wait at once. A new one beyond
  that evicts the oldest waiting connection, not itself: a genuine worker
  sends its greeting and frame within milliseconds of connecting, so it is
  always among the youngest, and strays that sit idle are the ones pushed
  out. Refusing new connections instead would let a few idle strays lock
  every worker out.

Every connection dropped here is logged on ``hora.driver`` with the peer's
address and the reason.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hora.driver.wire import (
    FRAME_HEADER_BYTES,
    HELLO_BYTES,
    PREAUTH_MAX_PAYLOAD,
    SignedChannel,
    frame_length,
    hello,
    new_nonce,
    open_frame,
    peer_nonce,
)
from hora.exceptions import AuthenticationError, HoraError

__all__ = ["Gate"]

_log = logging.getLogger("hora.driver")
_POLL_SECONDS = 0.2  # how often the loop notices stop() and expired deadlines when nothing arrives
_ACCEPTS_PER_WAKEUP = 16
_STOP_JOIN_SECONDS = 5.0  # how long stop() waits for the thread; it only ever waits for one event's handling


@dataclass
class _Pending:
    """One connection that has not proven itself yet, and the bytes it sent so far."""

    sock: socket.socket
    peer: str
    deadline: float
    nonce: bytes
    received: bytearray = field(default_factory=bytearray)
    needed: int = HELLO_BYTES  # bytes of greeting + header + payload the first frame needs in all


class Gate:
    """Accepts connections and hands on those whose first frame is genuine.

    Args:
        listener: a bound, listening socket; the gate owns it from now on.
        secret: the job secret.
        on_authenticated: called on the gate's thread with the channel and the
            first message of each authenticated connection; it must return at
            once (start a thread for anything that waits).
        deadline: seconds from accept within which the greeting and the first
            frame must be complete.
        max_pending: how many unauthenticated connections may wait at once.
        frame_timeout: seconds each later frame may take on an authenticated channel.
    """

    def __init__(
        self,
        listener: socket.socket,
        secret: bytes,
        on_authenticated: Callable[[SignedChannel, dict], None],
        *,
        deadline: float,
        max_pending: int,
        frame_timeout: float,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}.")
        self._listener = listener
        self._secret = secret
        self._on_authenticated = on_authenticated
        self._deadline = deadline
        self._max_pending = max_pending
        self._frame_timeout = frame_timeout
        self._pending: dict[socket.socket, _Pending] = {}  # insertion order is age order
        self._selector = selectors.DefaultSelector()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hora-driver-gate", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the listener."""
        host, port = self._listener.getsockname()[:2]
        return host, port

    @property
    def pending(self) -> int:
        """How many connections are waiting to authenticate (for tests and diagnostics)."""
        return len(self._pending)

    def start(self) -> None:
        """Starts the gate's thread."""
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._thread.start()

    def stop(self) -> None:
        """Stops accepting, drops every waiting connection and joins the thread.

        The thread owns the selector, the listener and the waiting sockets
        while it runs, and closes them itself as it ends: closing them under
        it could make it act on a closed (or reused) descriptor.
        """
        self._stopped.set()
        if self._thread.ident is None:  # never started: nobody else owns them
            self._close_all()
            return
        self._thread.join(timeout=_STOP_JOIN_SECONDS)
        if self._thread.is_alive():
            _log.warning(
                "The driver's gate thread did not stop within %g s of being asked (it is still handing on a "
                "connection); it closes the listener and its waiting connections when it does.",
                _STOP_JOIN_SECONDS,
            )

    def _run(self) -> None:
        # Nothing that goes wrong with one connection may end this loop: the driver would accept nothing more,
        # and every worker would wait until its start timeout with no word of why.
        try:
            while not self._stopped.is_set():
                try:
                    events = self._selector.select(timeout=self._next_wakeup())
                except Exception:
                    _log.exception("The driver's gate could not wait for connections; it tries again.")
                    self._stopped.wait(_POLL_SECONDS)  # not a busy loop if the error persists
                    continue
                for key, _ in events:
                    self._handle(key.fileobj)  # type: ignore[arg-type]
                now = time.monotonic()
                for pending in [p for p in self._pending.values() if p.deadline <= now]:
                    self._drop(
                        pending,
                        f"it sent {len(pending.received)} of the {pending.needed} bytes of its greeting and first "
                        f"message within the {self._deadline:g} s allowed.",
                    )
        finally:
            self._close_all()

    def _handle(self, ready: socket.socket) -> None:
        """Serves one readable socket; whatever goes wrong is logged, and costs at most that connection."""
        pending = None
        try:
            if ready is self._listener:
                self._accept()
                return
            pending = self._pending.get(ready)
            if pending is not None:  # not evicted earlier in this round of events
                self._read(pending)
        except Exception:
            peer = pending.peer if pending is not None else "a new connection"
            _log.exception("The driver's gate failed serving %s; dropped that connection and goes on.", peer)
            if pending is not None:
                self._forget(pending)
                with contextlib.suppress(OSError):
                    pending.sock.close()

    def _close_all(self) -> None:
        for pending in list(self._pending.values()):
            with contextlib.suppress(OSError):
                pending.sock.close()
        self._pending.clear()
        with contextlib.suppress(OSError):
            self._listener.close()
        with contextlib.suppress(OSError, RuntimeError):
            self._selector.close()

    def _next_wakeup(self) -> float:
        if not self._pending:
            return _POLL_SECONDS
        oldest = next(iter(self._pending.values())).deadline  # deadlines grow with age
        return min(max(oldest - time.monotonic(), 0.0), _POLL_SECONDS)

    def _accept(self) -> None:
        # A bounded batch per wakeup: under a flood of connections, the bytes that waiting (genuine)
        # connections already sent still get read before the flood ages them out.
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if not self._stopped.is_set():
                    _log.warning("The driver could not accept a connection: %s", exc)
                return
            peer = f"{address[0]}:{address[1]}"
            if len(self._pending) >= self._max_pending:
                self._drop(
                    next(iter(self._pending.values())),
                    f"{self._max_pending} connections were waiting to authenticate and it was the oldest "
                    f"(a new one from {peer} arrived).",
                )
            pending = _Pending(sock, peer, time.monotonic() + self._deadline, new_nonce())
            sock.setblocking(False)
            try:
                # 24 bytes into a new connection's empty send buffer: never partial.
                if sock.send(hello(pending.nonce)) != HELLO_BYTES:
                    raise OSError("the greeting was only partly sent")
            except OSError as exc:
                _log.warning("Rejected a driver connection from %s: could not greet it (%s).", peer, exc)
                sock.close()
                continue
            self._pending[sock] = pending
            self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, pending: _Pending) -> None:
        try:
            chunk = pending.sock.recv(pending.needed - len(pending.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(pending, f"its connection failed ({exc}).")
            return
        if not chunk:
            self._drop(pending, f"it closed the connection after {len(pending.received)} bytes.")
            return
        pending.received += chunk
        if len(pending.received) < pending.needed:
            return
        try:
            self._advance(pending)
        except (AuthenticationError, HoraError, OSError) as exc:
            self._drop(pending, str(exc))

    def _advance(self, pending: _Pending) -> None:
        """Moves on once a part (greeting, frame header, payload) is complete."""
        if pending.needed == HELLO_BYTES:
            peer_nonce(bytes(pending.received))
            pending.needed += FRAME_HEADER_BYTES
            return
        header_end = HELLO_BYTES + FRAME_HEADER_BYTES
        if pending.needed == header_end:
            length = frame_length(bytes(pending.received[HELLO_BYTES:header_end]), PREAUTH_MAX_PAYLOAD)
            pending.needed += length
            if length > 0:
                return
        received = bytes(pending.received)
        message = open_frame(
            self._secret,
            is_server=True,
            my_nonce=pending.nonce,
            sequence=0,
            header=received[HELLO_BYTES:header_end],
            payload=received[header_end:],
        )
        channel = SignedChannel.resume(
            pending.sock,
            self._secret,
            my_nonce=pending.nonce,
            peer_nonce=peer_nonce(received[:HELLO_BYTES]),
            timeout=self._frame_timeout,
        )
        self._forget(pending)
        self._on_authenticated(channel, message)

    def _forget(self, pending: _Pending) -> None:
        if self._pending.pop(pending.sock, None) is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):  # a socket closed under it is unknown to it
                self._selector.unregister(pending.sock)

    def _drop(self, pending: _Pending, why: str) -> None:
        _log.warning("Rejected a driver connection from %s: %s", pending.peer, why)
        self._forget(pending)
        pending.sock.close()
