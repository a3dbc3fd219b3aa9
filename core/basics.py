"""Joining and leaving a job, and the calling process's place in it."""

from __future__ import annotations

import atexit
import collections
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hora import _native, _native_warnings, mpi
from hora.driver.client import Joined, join_round
from hora.driver.topology import Assignment
from hora.exceptions import NotInitializedError
from hora.settings import Settings

if TYPE_CHECKING:
    from hora.process_sets import ProcessSet

__all__ = [
    "cross_rank",
    "cross_size",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_enabled",
    "mpi_threads_supported",
    "rank",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]


# "allreduce.noname" for each request kind: the automatic names' stem, and the name of waited-for requests.
_LABELS = {kind: f"{kind.name.lower()}.noname" for kind in _native.RequestKind.__members__.values()}
_WAITED = {kind: f"{label}.sync" for kind, label in _LABELS.items()}


def waited_name(kind: _native.RequestKind) -> str:
    """The automatic name of a request of ``kind`` that its thread waits for at once (see :meth:`_Job.unnamed`)."""
    return _WAITED[kind]


@dataclass
class _Job:
    engine: _native.Engine
    transport: _native.Transport
    place: Assignment
    settings: Settings
    mpi_comm: Any = None  # the mpi4py communicator of a job that MPI started
    host_updates: int = 0  # in an elastic job: the latest host update this rendezvous round reflects
    fresh_members: bool = False  # in an elastic job: this round has workers the previous one had not
    # The process sets given to init(), which an elastic reset registers again, and every set registered in
    # this job (those included), which lose their ids when it ends.
    init_process_sets: tuple[ProcessSet, ...] = ()
    process_sets: list[ProcessSet] = field(default_factory=list)
    _counters: dict[tuple[_native.RequestKind, int], Iterator[int]] = field(default_factory=dict)

    def unnamed(self, kind: _native.RequestKind, process_set: int, waited: bool = False) -> str:
        """An automatic request name.

        ``<kind>.noname.<n>``, counted per kind and process set, names a request
        that may stay in flight while others are submitted. A request its
        thread waits for at once (``waited``) is ``<kind>.noname.sync``: the
        thread submits no other before it completes, so one name serves every
        such call, and from the second call on the engine's response cache
        recognises it (a bit instead of the whole request on the wire).
        """
        if waited:
            return waited_name(kind)
        # next() on a count and dict.setdefault are atomic: no lock needed between threads.
        return f"{_LABELS[kind]}.{next(self._counters.setdefault((kind, process_set), itertools.count()))}"

    def transport_links(self) -> list[str]:
        """How this rank reaches each rank: ``"shm"``, ``"tcp"``, or ``"self"`` for itself."""
        if isinstance(self.transport, _native.MeshTransport):
            return self.transport.links()
        return ["self"]

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def size(self) -> int:
        return self.place.size


_job: _Job | None = None
_init_lock = threading.Lock()
# (job secret, rendezvous rounds this process has joined in that job). Keyed by the secret because a
# process may outlive its job and join another (Spark reuses Python workers), which starts at round 0.
_rounds_joined: tuple[bytes, int] = (b"", 0)


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | None = None) -> None:
    """Joins the job this process was started in and starts the engine thread.

    Under ``horarun`` (or the Spark and Ray backends) the process registers
    with the job's driver service, receives its rank and connects to every
    peer. Under an MPI launcher (``mpiexec``, ``mpirun``, ``srun``), or given
    ``comm``, the ranks meet through MPI instead (see :mod:`hora.mpi`).
    Started on its own, it becomes a job of one rank. Calling it again
    while initialized only registers the ``process_sets`` not registered
    yet (a task of :func:`hora.spark.run` is initialized before its function
    runs). After :func:`shutdown`, it joins the job
    again (the driver's next rendezvous round, on fresh connections) with
    the same rank; every worker must do the same.

    Args:
        comm: for a job that MPI starts: the mpi4py communicator whose ranks
            form the job, or a list of ``COMM_WORLD`` ranks (default:
            ``COMM_WORLD``), as in Horovod.
        process_sets: process sets to register at once (every rank passes the
            same list); each gets its ``process_set_id``. As
            :func:`hora.add_process_set` for each after ``init``, except that
            a set of every rank is the global set (id 0), as in Horovod, and
            an elastic job's reset registers them all again (one removed
            since too: a worker that joins registers them all in its init).

    Raises:
        RendezvousError: not all workers of the job registered in time.
        HoraInternalError: the connections to the peers could not be set up.
        ValueError: ``comm`` in a job that horarun, Spark or Ray started.
    """
    _join(comm)
    if process_sets:
        from hora.process_sets import register_at_init

        job = current_job()
        job.init_process_sets = (*job.init_process_sets, *(p for p in process_sets if p not in job.init_process_sets))
        for process_set in process_sets:
            if process_set.process_set_id is None:
                register_at_init(process_set)


def _join(comm: Any) -> None:
    """Starts this process's job, unless it has one (the work of :func:`init`)."""
    global _job
    with _init_lock:
        if _job is not None:
            return
        settings = Settings.from_env()
        by_mpi = comm is not None or (settings.driver_address is None and mpi.launched_by_mpi())
        if by_mpi and settings.driver_address is not None:
            raise ValueError(
                "hora.init: comm= is for jobs that MPI starts (mpiexec, mpirun, srun); this process belongs to a "
                "job started by horarun, Spark or Ray."
            )
        _native_warnings.queue()  # the connections' warnings are logged before init returns
        try:
            if by_mpi:
                communicator = mpi.communicator(comm)
                try:
                    _job = _start(*mpi.rendezvous(communicator, settings), settings, mpi_comm=communicator)
                except BaseException:
                    mpi.release(communicator)
                    raise
            elif settings.driver_address is None:
                transport = _native.LoopbackGroup(1, settings.timeout).transport(0)
                alone = Assignment(
                    rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, peers=(), hosts=(0,)
                )
                _job = _start(transport, alone, settings)
            else:
                transport, joined = _connect(settings)
                _job = _start(transport, joined.assignment, settings)
                _job.host_updates, _job.fresh_members = joined.host_updates, joined.fresh
        except BaseException:
            _native_warnings.stop()
            raise
        _native_warnings.pump()


def _next_round(secret: bytes) -> int:
    """The rendezvous round the next init joins: how many of this process's inits in this job got an assignment."""
    job, joined = _rounds_joined
    return joined if job == secret else 0


def _joined_round(secret: bytes, number: int) -> None:
    """Records that the driver assigned this process a place in round ``number`` of the job."""
    global _rounds_joined
    _rounds_joined = (secret, number + 1)


def _connect(settings: Settings) -> tuple[_native.Transport, Joined]:
    assert settings.secret is not None and settings.driver_address is not None
    # A fresh listener each init: the previous round's peer connections and port are gone with its transport.
    listener = _native.TcpListener(settings.bind_host, 0)
    try:
        asked = _next_round(settings.secret)
        joined = join_round(
            settings.driver_address,
            settings.secret,
            index=settings.worker_index,
            host=settings.hostname,
            address=(settings.advertise_host, listener.port),
            # An elastic round may wait for workers that are still training towards their next commit.
            timeout=max(settings.start_timeout, settings.elastic_timeout)
            if settings.elastic
            else settings.start_timeout,
            round_number=asked,
        )
        # Only now is this process a member of the round. A registration that never reached the driver (refused,
        # dropped, reset) leaves the count alone, so a retried init() joins the round its peers are waiting in.
        # Past this point the round is the driver's, whether or not the peer connections below succeed.
        _joined_round(settings.secret, joined.round)
        assignment = joined.assignment
        transport = _native.connect(
            listener,
            assignment.rank,
            list(assignment.peers),
            settings.secret,
            settings.start_timeout,
            settings.timeout,
            hosts=list(assignment.hosts),
            shared_memory=settings.transport == "auto",
            single_copy=settings.shm_single_copy,
        )
    finally:
        listener.close()
    return transport, joined


def _start(transport: _native.Transport, place: Assignment, settings: Settings, mpi_comm: Any = None) -> _Job:
    engine = _native.Engine(transport, settings.engine_options(list(place.hosts), min(settings.timeout, 30.0)))
    job = _Job(engine, transport, place, settings, mpi_comm)
    if settings.timeline_filename:
        path = _timeline_path(settings.timeline_filename, place.rank)
        if path is not None:
            engine.start_timeline(path, settings.timeline_mark_cycles)
    return job


def _timeline_path(pattern: str, rank: int) -> str | None:
    """Where this rank writes the timeline: ``{rank}`` in the pattern gives each rank a file, else rank 0 writes."""
    if "{rank}" in pattern:
        return pattern.replace("{rank}", str(rank))
    return pattern if rank == 0 else None


def shutdown() -> None:
    """Agrees with the other ranks to stop, stops the engine and closes the connections.

    Waits at most 30 s (or the collective timeout, if shorter) for the other
    ranks to shut down too. Safe to call twice. The job's process sets end
    with it: their ``process_set_id`` becomes None.
    """
    global _job
    with _init_lock:
        job, _job = _job, None
    if job is not None:
        try:
            job.engine.shutdown()
        finally:
            for process_set in job.process_sets:
                process_set.process_set_id = None
            _native_warnings.stop()
            mpi.release(job.mpi_comm)


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing a Chrome-trace timeline (open it in Perfetto or chrome://tracing).

    Call it on every rank. ``{rank}`` in ``file_path`` gives every rank its
    own file; otherwise rank 0 writes it. A running timeline is closed first.

    Args:
        file_path: the JSON file to write.
        mark_cycles: also mark every engine cycle.
    """
    job = current_job()
    path = _timeline_path(file_path, job.rank)
    if path is not None:
        job.engine.start_timeline(path, bool(mark_cycles))


def stop_timeline() -> None:
    """Stops the timeline and closes its file (a valid JSON array). Does nothing when none runs."""
    current_job().engine.stop_timeline()


atexit.register(shutdown)


def is_initialized() -> bool:
    """Whether :func:`init` has been called (and :func:`shutdown` has not)."""
    return _job is not None


def current_job() -> _Job:
    """The running job; raises NotInitializedError before :func:`init`."""
    job = _job
    if job is None:
        raise NotInitializedError("Hora has not been initialized; call hora.init() first.")
    return job


def rank() -> int:
    """This process's rank, 0 .. size() - 1."""
    return current_job().rank


def size() -> int:
    """The number of processes in the job."""
    return current_job().size


def local_rank() -> int:
    """This process's rank among the processes on its host."""
    return current_job().place.local_rank


def local_size() -> int:
    """The number of processes on this process's host."""
    return current_job().place.local_size


def cross_rank() -> int:
    """This process's rank among the processes with the same local rank (its host's index)."""
    return current_job().place.cross_rank


def cross_size() -> int:
    """The number of processes with this process's local rank (usually the number of hosts)."""
    return current_job().place.cross_size


def is_homogeneous() -> bool:
    """Whether every host of the job runs the same number of ranks, as Horovod's ``is_homogeneous``.

    Raises:
        NotInitializedError: before :func:`init`.
    """
    hosts = current_job().place.hosts
    return len(set(collections.Counter(hosts).values())) <= 1


def gloo_enabled() -> bool:
    """Whether this job runs on Gloo: never (Horovod's query; Hora's transports are its own)."""
    return False


def mpi_enabled() -> bool:
    """Whether this job was started by MPI (``mpiexec``) and its ranks met through it; False before init."""
    job = _job
    return job is not None and job.mpi_comm is not None


def mpi_threads_supported() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE`` in this job.

    Raises:
        NotInitializedError: before :func:`init`.
        ValueError: MPI did not start this job (as Horovod, when MPI is not enabled).
    """
    if current_job().mpi_comm is None:
        raise ValueError("hora.mpi_threads_supported: MPI is not enabled; this job was not started by mpiexec.")
    return mpi.thread_support()
