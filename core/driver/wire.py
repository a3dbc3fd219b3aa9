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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
from typing import Any

from hora.exceptions import AuthenticationError, HoraError

__all__ = ["SignedChannel"]

_MAGIC = b"HORADRV1"
_NONCE_BYTES = 16
_MAC_BYTES = 32
_MAX_PAYLOAD = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


class SignedChannel:
    """One authenticated conversation over a connected socket.

    Args:
        sock: a connected stream socket; the channel owns it from now on.
        secret: the job secret shared by the driver and its workers.
        is_server: which end of the connection this is; it picks the
            direction label that is signed, so a frame cannot be reflected
            back to its sender.
        timeout: seconds any single send or receive may take.
    """

    def __init__(self, sock: socket.socket, secret: bytes, *, is_server: bool, timeout: float) -> None:
        if not secret:
            raise ValueError("The job secret must not be empty.")
        self._sock = sock
        self._secret = secret
        self._send_label = b"S" if is_server else b"C"
        self._recv_label = b"C" if is_server else b"S"
        self._send_sequence = 0
        self._recv_sequence = 0
        sock.settimeout(timeout)
        self._my_nonce = os.urandom(_NONCE_BYTES)
        sock.sendall(_MAGIC + self._my_nonce)
        hello = self._read_exactly(len(_MAGIC) + _NONCE_BYTES)
        if hello[: len(_MAGIC)] != _MAGIC:
            raise AuthenticationError("The peer does not speak the Hora driver protocol (bad magic bytes).")
        self._peer_nonce = hello[len(_MAGIC) :]

    @property
    def peer(self) -> str:
        """The remote address, for log and error messages."""
        try:
            host, port = self._sock.getpeername()[:2]
        except OSError:
            return "<disconnected>"
        return f"{host}:{port}"

    def settimeout(self, timeout: float) -> None:
        """Changes the timeout of later sends and receives."""
        self._sock.settimeout(timeout)

    def send(self, message: dict[str, Any]) -> None:
        """Signs and sends one JSON-serialisable message."""
        payload = json.dumps(message, separators=(",", ":")).encode()
        mac = self._mac(self._send_label, self._peer_nonce, self._send_sequence, payload)
        self._send_sequence += 1
        self._sock.sendall(_HEADER.pack(len(payload)) + mac + payload)

    def receive(self) -> dict[str, Any]:
        """Receives one message; raises AuthenticationError if it is not genuine."""
        (length,) = _HEADER.unpack(self._read_exactly(_HEADER.size))
        if length > _MAX_PAYLOAD:
            raise AuthenticationError(f"Frame of {length} bytes exceeds the limit of {_MAX_PAYLOAD} bytes.")
        mac = self._read_exactly(_MAC_BYTES)
        payload = self._read_exactly(length)
        expected = self._mac(self._recv_label, self._my_nonce, self._recv_sequence, payload)
        if not hmac.compare_digest(mac, expected):
            raise AuthenticationError(
                "A message failed its signature check: it was forged, altered, replayed, or signed "
                "with another job's secret."
            )
        self._recv_sequence += 1
        message = json.loads(payload)
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise HoraError(f"Malformed driver message (expected an object with a 'type'): {payload[:200]!r}")
        return message

    def close(self) -> None:
        """Closes the socket."""
        self._sock.close()

    def _mac(self, label: bytes, nonce: bytes, sequence: int, payload: bytes) -> bytes:
        header = label + nonce + struct.pack(">Q", sequence)
        return hmac.new(self._secret, header + payload, hashlib.sha256).digest()

    def _read_exactly(self, count: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < count:
            chunk = self._sock.recv(count - len(chunks))
            if not chunk:
                raise ConnectionError(f"Connection closed by {self.peer} in the middle of a message.")
            chunks += chunk
        return bytes(chunks)
