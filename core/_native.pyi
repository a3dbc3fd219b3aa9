"""Hora's compiled core (private; use the ``hora`` package).

Transports connect the ranks of one job; the collectives run over any
transport, in place on C-contiguous buffers, with the GIL released. Every
rank must call the same collectives in the same order. A Transport is not
thread-safe.
"""

import enum
from collections.abc import Sequence

from typing_extensions import Buffer

class HoraError(RuntimeError):
    """Base class of Hora's errors."""

class HoraInternalError(HoraError):
    """Communication with a peer failed (closed, died, or no progress within the timeout)."""

class DataType(enum.Enum):
    UINT8 = ...
    INT8 = ...
    INT16 = ...
    INT32 = ...
    INT64 = ...
    FLOAT16 = ...
    BFLOAT16 = ...
    FLOAT32 = ...
    FLOAT64 = ...
    BOOL = ...

class ReduceOp(enum.Enum):
    SUM = ...
    AVERAGE = ...
    MIN = ...
    MAX = ...
    PRODUCT = ...

class Transport:
    """Connections to the other ranks of one job."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def timeout(self) -> float:
        """Seconds a wait may go without progress before HoraInternalError."""
    def abort(self, reason: str) -> None:
        """Fails every pending and later operation and closes the connections."""

class TcpListener:
    """A listening socket, bound before rendezvous so its port can be published."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    def close(self) -> None: ...

def connect_tcp(
    listener: TcpListener,
    rank: int,
    peers: Sequence[tuple[str, int]],
    secret: bytes,
    connect_timeout: float,
    timeout: float,
) -> Transport:
    """Connects to every peer (lower ranks connect out, higher ranks are accepted),
    authenticating each connection with HMAC-SHA256 challenges under ``secret``."""

class LoopbackGroup:
    """An in-process world whose ranks are threads; for testing algorithms."""

    def __init__(self, size: int, timeout: float = 30.0) -> None: ...
    @property
    def size(self) -> int: ...
    def transport(self, rank: int) -> Transport: ...

def allreduce(
    transport: Transport,
    buffer: Buffer,
    dtype: DataType,
    op: ReduceOp,
    prescale: float = 1.0,
    postscale: float = 1.0,
) -> None:
    """Ring allreduce of ``buffer`` in place: postscale * reduce(prescale * x)."""

def reducescatter(
    transport: Transport,
    buffer: Buffer,
    counts: Sequence[int],
    dtype: DataType,
    op: ReduceOp,
    prescale: float = 1.0,
    postscale: float = 1.0,
) -> None:
    """Leaves block ``rank`` (``counts[rank]`` elements, blocks back to back) reduced in place."""

def allgather(transport: Transport, input: Buffer, output: Buffer, byte_counts: Sequence[int]) -> None:
    """Gathers each rank's block (``byte_counts[r]`` bytes) into ``output`` in rank order."""

def broadcast(transport: Transport, buffer: Buffer, root: int) -> None:
    """Copies ``buffer`` from ``root`` to every rank (pipelined chain)."""

def alltoall(
    transport: Transport,
    input: Buffer,
    send_bytes: Sequence[int],
    output: Buffer,
    recv_bytes: Sequence[int],
) -> None:
    """Sends block p of ``input`` to rank p and receives rank p's block into ``output``."""

def barrier(transport: Transport) -> None:
    """Returns once every rank has entered the barrier."""

def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 as used by the connection handshake (exposed for tests)."""
