"""Hora's compiled core (private; use the ``hora`` package).

Transports connect the ranks of one job; the collectives run over any
transport, in place on C-contiguous buffers, with the GIL released. Every
rank must call the same collectives in the same order. A Transport is not
thread-safe.
"""

import enum
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from typing_extensions import Buffer

class HoraError(RuntimeError):
    """Base class of Hora's errors."""

class HoraInternalError(HoraError):
    """Communication with a peer failed (closed, died, or no progress within the timeout)."""

class RequestError(HoraError, ValueError):
    """The ranks' requests for one collective cannot run together (they disagree, or some ranks joined)."""

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

class MeshTransport(Transport):
    """The links of a real job: shared memory within a host, TCP between hosts."""

    def links(self) -> list[str]:
        """``"shm"``, ``"tcp"`` or ``"self"`` for every rank."""
    def single_copy(self) -> list[bool]:
        """For every rank, whether its link passes large messages by reference (shared memory only)."""
    def sent_by_reference(self) -> list[int]:
        """For every rank, how many messages this rank has passed to it by reference so far (a diagnostic: read it
        while no collective runs)."""

def connect(
    listener: TcpListener,
    rank: int,
    peers: Sequence[tuple[str, int]],
    secret: bytes,
    connect_timeout: float,
    timeout: float,
    hosts: Sequence[int] = (),
    shared_memory: bool = True,
    single_copy: bool = True,
    single_copy_buffer_bytes: int = 32 << 20,
) -> MeshTransport:
    """Connects to every peer (lower ranks connect out, higher ranks are accepted),
    authenticating each connection with HMAC-SHA256 challenges under ``secret``.
    Ranks with equal entries in ``hosts`` share memory unless ``shared_memory`` is
    false on either side; the others, or all when ``hosts`` is empty, use TCP.
    A shared-memory pair passes large messages of buffers from
    ``single_copy_buffer_bytes`` by reference (the reader copies straight from the
    writer's memory) unless ``single_copy`` is false on either side or the system
    forbids it; every rank must give the same ``single_copy_buffer_bytes`` (the
    default; tests lower it), or the set-up fails naming both values."""

class LoopbackGroup:
    """An in-process world whose ranks are threads; for testing algorithms."""

    def __init__(self, size: int, timeout: float = 30.0) -> None: ...
    @property
    def size(self) -> int: ...
    def transport(self, rank: int) -> Transport: ...
    def push(self, src: int, dst: int, message: Buffer) -> None:
        """Queues ``message`` as the next message from rank src to rank dst (a scripted peer in tests)."""
    def pop(self, src: int, dst: int) -> bytes:
        """Takes the next message from rank src to rank dst, waiting up to the group's timeout."""

def allreduce(
    transport: Transport,
    buffer: Buffer,
    dtype: DataType,
    op: ReduceOp,
    prescale: float = 1.0,
    postscale: float = 1.0,
    output: Buffer | None = None,
) -> None:
    """Allreduce of ``buffer``: postscale * reduce(prescale * x), in place or into ``output`` (``buffer`` unchanged)."""

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

class RequestKind(enum.Enum):
    ALLREDUCE = ...
    ALLGATHER = ...
    BROADCAST = ...
    ALLTOALL = ...
    REDUCESCATTER = ...
    BARRIER = ...
    JOIN = ...
    ADD_PROCESS_SET = ...
    REMOVE_PROCESS_SET = ...

class Request:
    """One tensor's request to the engine. The element type and shape are read from the buffer unless
    ``dtype`` is given (bfloat16 travels as 2-byte integers, which only the caller can name)."""

    kind: RequestKind
    name: str
    buffer: Buffer | None
    dtype: DataType | None
    op: ReduceOp
    prescale: float
    postscale: float
    root: int
    process_set: int
    splits: list[int]
    ranks: list[int]
    output: Buffer | None
    """allreduce: a buffer for the result (the tensor is then only read), or None for in place."""

    def __init__(
        self,
        kind: RequestKind,
        name: str = "",
        buffer: Buffer | None = None,
        dtype: DataType | None = None,
        op: ReduceOp = ...,
        prescale: float = 1.0,
        postscale: float = 1.0,
        root: int = -1,
        process_set: int = 0,
        splits: Sequence[int] | None = None,
        ranks: Sequence[int] | None = None,
        output: Buffer | None = None,
    ) -> None: ...

class Result:
    """What a completed request hands back."""

    @property
    def output(self) -> NDArray[np.uint8] | None:
        """The bytes the engine allocated (allgather, alltoall, reducescatter), or None for in-place requests."""
    @property
    def shape(self) -> list[int]: ...
    @property
    def received_splits(self) -> list[int]: ...
    @property
    def value(self) -> int: ...

class EngineOptions:
    """The engine's settings, with their defaults (the one place they are defined)."""

    fusion_threshold_bytes: int
    cycle_time_ms: float
    cache_capacity: int
    stall_warning_seconds: float
    stall_shutdown_seconds: float
    shutdown_timeout_seconds: float
    hosts: list[int]
    hierarchical_allreduce: bool | None
    autotune: bool
    autotune_log: str
    autotune_warmup_samples: int
    autotune_steps_per_sample: int
    autotune_samples_per_trial: int
    autotune_fixed: list[str]

    def __init__(self) -> None: ...

class EngineParameters:
    """The engine's parameters in force, tuned ones included."""

    @property
    def fusion_threshold_bytes(self) -> int: ...
    @property
    def cycle_time_ms(self) -> float: ...
    @property
    def cache_enabled(self) -> bool: ...
    @property
    def hierarchical_allreduce(self) -> bool: ...

class Engine:
    """The background thread that negotiates, fuses and runs collectives over a transport."""

    def __init__(self, transport: Transport, options: EngineOptions = ...) -> None: ...
    @property
    def parameters(self) -> EngineParameters:
        """The parameters in force (the autotuner's current trial while it tunes)."""
    @property
    def rank(self) -> int: ...
    @property
    def hierarchical_allreduce(self) -> bool:
        """Whether allreduce over the whole job runs within hosts, then across them."""
    @property
    def size(self) -> int: ...
    def submit(self, requests: Sequence[Request], group: str = "") -> list[int]:
        """Queues requests and returns their handles at once. With a group name they form one group, queued
        whole or not at all and executed as one unit. ValueError for a name in flight or bad arguments."""
    def run(self, request: Request) -> Result:
        """Submits one request and waits for it, driving the engine on this thread: submit() then wait() in one
        call."""
    def run_all(self, requests: Sequence[Request], group: str = "") -> list[Result]:
        """run() for several requests (with a group name, one group): submits them and waits for them all, driving
        the engine on this thread; their results in order, or the first failure once all have completed."""
    def try_run_in_place(
        self,
        kind: RequestKind,
        name: str,
        buffer: object,
        op: ReduceOp,
        prescale: float,
        postscale: float,
        root: int,
        process_set: int,
    ) -> bool:
        """run() for an in-place allreduce or broadcast of one buffer, from its arguments: True once it ran;
        False, having done nothing, when the buffer is not a writable C-contiguous buffer whose format
        names a type Hora reduces (the request layer's checked path then says what is wrong)."""
    def try_submit_in_place(
        self,
        kind: RequestKind,
        name: str,
        buffer: object,
        op: ReduceOp,
        prescale: float,
        postscale: float,
        root: int,
        process_set: int,
    ) -> int:
        """submit() for an in-place allreduce or broadcast of one buffer, from its arguments: its handle; -1,
        having done nothing, where try_run_in_place declines."""
    @property
    def open_handles(self) -> int:
        """How many handles the engine holds: requests in flight, and completed ones not yet
        waited for or released."""
    @property
    def agreed_from_cache(self) -> int:
        """How many tensors' responses were agreed from the response cache without the request
        table (every member announced the cached tensor in one cycle): a statistic."""
    def poll(self, handle: int) -> bool: ...
    def wait(self, handles: Sequence[int]) -> list[Result]:
        """Blocks until every handle completes; returns their results in order, or raises the first failure
        (all are released either way). A KeyboardInterrupt leaves them all in flight."""
    def release(self, handle: int) -> None:
        """Gives up a handle without waiting: the request completes with its buffers and its result is dropped."""
    def shutdown(self) -> None:
        """Stops the engine on every rank (the others' pending requests fail)."""
    def start_timeline(self, path: str, mark_cycles: bool = False) -> None: ...
    def stop_timeline(self) -> None: ...
    def process_set(self, id: int) -> list[int]:
        """The members of process set ``id``, or [] when there is none."""
    def process_set_ids(self) -> list[int]: ...

def background_patience(cycle_time_ms: float, caller_away_ms: float, spare_cores: bool) -> float:
    """How long, in milliseconds, the background thread stays parked once the last caller stopped driving
    (exposed for tests; see Engine::park)."""

def on_huge_pages(buffer: Buffer) -> bool | None:
    """Whether at least half of the buffer lies on huge pages, as the kernel's page tables say now; None where
    the kernel cannot say (before Linux 6.7). A shared-memory link passes a large message by reference only
    from huge pages (huge_pages.h)."""

def set_warnings_drained(drained: bool) -> None:
    """Queue the native core's warnings for take_warnings() (True) or write them to stderr (False)."""

def take_warnings(wait: float) -> list[str]:
    """Waits up to ``wait`` seconds for the native core's queued warnings and returns them, oldest first."""

def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 as used by the connection handshake (exposed for tests)."""
