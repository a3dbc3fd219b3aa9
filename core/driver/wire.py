"""Signed, framed JSON messages between the driver service and its clients.

Every connection starts with both sides sending a fresh random nonce. Each
later frame carries an HMAC-SHA256, under the job secret, over the direction,
the *other* side's nonce, a per-direction sequence number and the payload.
So a frame is only valid on the connection and at the position it was made
for: a forged frame fails the MAC, a replayed one (on this or any other
connection) fails because the nonce or the sequence number differs. The
payload is JSON and is parsed only after its MAC has been verified; nothing
received here is ever unpickled.

Frame layout: ``length (4 bytes, big-endian) | mac (32 bytes) | payload``.

Until a peer has sent one genuine frame it has proven nothing, so what it may
cost the receiver is bounded: the first frame of a connection may carry at
most :data:`PREAUTH_MAX_PAYLOAD` bytes (a registration is a few hundred), and
its length is checked before any of its payload is read. Later frames may
carry up to :data:`MAX_PAYLOAD`. Every frame, and the handshake, must arrive
whole within one deadline: a peer that trickles a byte at a time cannot
stretch a per-``recv`` timeout into forever.

The pieces (:func:`hello`, :func:`peer_nonce`, :func:`frame_length`,
:func:`open_frame`) are exposed so that the driver's gate can run the
handshake and the first frame on non-blocking sockets, then hand the
connection on with :meth:`SignedChannel.resume`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
import time
from typing import Any

from hora.exceptions import AuthenticationError, HoraError

__all__ = [
    "FRAME_HEADER_BYTES",
    "HELLO_BYTES",
    "MAX_PAYLOAD",
    "PREAUTH_MAX_PAYLOAD",
    "SignedChannel",
    "frame_length",
    "hello",
    "new_nonce",
    "open_frame",
    "peer_nonce",
]

_MAGIC = b"HORADRV1"
_NONCE_BYTES = 16
_MAC_BYTES = 32
_LENGTH = struct.Struct(">I")

HELLO_BYTES = len(_MAGIC) + _NONCE_BYTES
"""Bytes of the greeting each side sends first: magic and nonce."""
FRAME_HEADER_BYTES = _LENGTH.size + _MAC_BYTES
"""Bytes before a frame's payload: its length and its MAC."""
PREAUTH_MAX_PAYLOAD = 4 * 1024
"""Largest payload of a connection's first frame, read before the peer is authenticated."""
MAX_PAYLOAD = 16 * 1024 * 1024
"""Largest payload of any later frame."""


def new_nonce() -> bytes:
    """A fresh random nonce for one connection."""
    return os.urandom(_NONCE_BYTES)


def hello(nonce: bytes) -> bytes:
    """The greeting that opens a connection: magic bytes and this side's nonce."""
    return _MAGIC + nonce


def peer_nonce(greeting: bytes) -> bytes:
    """The nonce in the other side's greeting; raises AuthenticationError if it is not Hora's protocol."""
    if len(greeting) != HELLO_BYTES or greeting[: len(_MAGIC)] != _MAGIC:
        raise AuthenticationError(
            f"The peer does not speak the Hora driver protocol: its greeting starts {greeting[:8]!r}, "
            f"expected {_MAGIC!r}."
        )
    return greeting[len(_MAGIC) :]


def frame_length(header: bytes, limit: int) -> int:
    """The payload length announced by a frame header; raises AuthenticationError above ``limit``."""
    (length,) = _LENGTH.unpack(header[: _LENGTH.size])
    if length > limit:
        raise AuthenticationError(f"Frame of {length} bytes exceeds the limit of {limit} bytes.")
    return length


def open_frame(
    secret: bytes, *, is_server: bool, my_nonce: bytes, sequence: int, header: bytes, payload: bytes
) -> dict:
    """Verifies one received frame and parses its payload.

    Args:
        secret: the job secret.
        is_server: whether the receiving side is the server.
        my_nonce: the nonce the receiving side sent in its greeting.
        sequence: how many frames the receiving side has accepted on this connection.
        header: the frame's :data:`FRAME_HEADER_BYTES` bytes.
        payload: the frame's payload.

    Raises:
        AuthenticationError: the MAC does not match (forged, altered, replayed or another job's secret).
        HoraError: the genuine payload is not a JSON object with a string ``type``.
    """
    label = b"C" if is_server else b"S"
    expected = _mac(secret, label, my_nonce, sequence, payload)
    if not hmac.compare_digest(header[_LENGTH.size :], expected):
        raise AuthenticationError(
            "A message failed its signature check: it was forged, altered, replayed, or signed "
            "with another job's secret."
        )
    try:
        message = json.loads(payload)
    except ValueError as exc:
        raise HoraError(f"A signed driver message is not JSON: {payload[:200]!r}.") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise HoraError(f"Malformed driver message (expected an object with a 'type'): {payload[:200]!r}")
    return message


def _mac(secret: bytes, label: bytes, nonce: bytes, sequence: int, payload: bytes) -> bytes:
    return hmac.new(secret, label + nonce + struct.pack(">Q", sequence) + payload, hashlib.sha256).digest()


class SignedChannel:
    """One authenticated conversation over a connected socket.

    Args:
        sock: a connected stream socket; the channel owns it from now on.
        secret: the job secret shared by the driver and its workers.
        is_server: which end of the connection this is; it picks the
            direction label that is signed, so a frame cannot be reflected
            back to its sender.
        timeout: seconds the handshake, and then each whole frame, may take.
    """

    def __init__(self, sock: socket.socket, secret: bytes, *, is_server: bool, timeout: float) -> None:
        if not secret:
            raise ValueError("The job secret must not be empty.")
        self._setup(sock, secret, is_server, timeout, new_nonce())
        self._sock.sendall(hello(self._my_nonce))
        self._peer_nonce = peer_nonce(self._read_exactly(HELLO_BYTES, time.monotonic() + timeout))

    @classmethod
    def resume(
        cls, sock: socket.socket, secret: bytes, *, my_nonce: bytes, peer_nonce: bytes, timeout: float
    ) -> SignedChannel:
        """The server's channel for a connection whose handshake and first frame were already read.

        Args:
            sock: the connection, now owned by the channel.
            secret: the job secret.
            my_nonce: the nonce this server sent.
            peer_nonce: the nonce the client sent.
            timeout: seconds each later frame may take.
        """
        channel = cls.__new__(cls)
        channel._setup(sock, secret, True, timeout, my_nonce)
        channel._peer_nonce = peer_nonce
        channel._recv_sequence = 1
        return channel

    def _setup(self, sock: socket.socket, secret: bytes, is_server: bool, timeout: float, nonce: bytes) -> None:
        self._sock = sock
        self._secret = secret
        self._is_server = is_server
        self._send_label = b"S" if is_server else b"C"
        self._timeout = timeout
        self._send_sequence = 0
        self._recv_sequence = 0
        self._my_nonce = nonce
        sock.setblocking(True)
        sock.settimeout(timeout)

    @property
    def peer(self) -> str:
        """The remote address, for log and error messages."""
        try:
            name = self._sock.getpeername()
        except OSError:
            return "<disconnected>"
        return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else repr(name)  # a Unix socket's is a path

    def settimeout(self, timeout: float) -> None:
        """Changes how long each later send, and each later frame received, may take."""
        self._timeout = timeout
        self._sock.settimeout(timeout)

    def send(self, message: dict[str, Any]) -> None:
        """Signs and sends one JSON-serialisable message."""
        payload = json.dumps(message, separators=(",", ":")).encode()
        mac = _mac(self._secret, self._send_label, self._peer_nonce, self._send_sequence, payload)
        self._send_sequence += 1
        self._sock.sendall(_LENGTH.pack(len(payload)) + mac + payload)

    def receive(self, *, idle: float | None = 0.0) -> dict[str, Any]:
        """Receives one message; raises AuthenticationError if it is not genuine.

        Args:
            idle: seconds to wait for the frame to begin, on top of the
                channel's timeout for the whole frame; None waits forever
                (an event stream may be quiet for hours). Once the first
                byte is in, the rest must follow within the timeout.
        """
        if idle != 0.0:
            self._sock.settimeout(idle)
            try:
                first = self._sock.recv(1)
            finally:
                self._sock.settimeout(self._timeout)
            if not first:
                raise ConnectionError(f"Connection closed by {self.peer} between messages.")
            deadline = time.monotonic() + self._timeout
            header = first + self._read_exactly(FRAME_HEADER_BYTES - 1, deadline)
        else:
            deadline = time.monotonic() + self._timeout
            header = self._read_exactly(FRAME_HEADER_BYTES, deadline)
        payload = self._read_exactly(frame_length(header, MAX_PAYLOAD), deadline)
        message = open_frame(
            self._secret,
            is_server=self._is_server,
            my_nonce=self._my_nonce,
            sequence=self._recv_sequence,
            header=header,
            payload=payload,
        )
        self._recv_sequence += 1
        return message

    def close(self) -> None:
        """Closes the connection; a thread blocked receiving on it gets an error at once."""
        with contextlib.suppress(OSError):  # already disconnected
            self._sock.shutdown(socket.SHUT_RDWR)  # close() alone does not wake a blocked recv()
        self._sock.close()

    def _read_exactly(self, count: int, deadline: float) -> bytes:
        """Reads ``count`` bytes, all of them by ``deadline`` (not a timeout per ``recv``)."""
        chunks = bytearray()
        try:
            while len(chunks) < count:
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    self._sock.settimeout(remaining)
                    chunk = self._sock.recv(min(count - len(chunks), 1 << 20))
                except TimeoutError:
                    raise TimeoutError(
                        f"{self.peer} sent {len(chunks)} of {count} bytes within {self._timeout:g} s; "
                        "the rest did not arrive in time."
                    ) from None
                if not chunk:
                    raise ConnectionError(f"Connection closed by {self.peer} in the middle of a message.")
                chunks += chunk
        finally:
            self._sock.settimeout(self._timeout)
        return bytes(chunks)
