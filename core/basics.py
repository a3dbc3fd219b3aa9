"""Joining and leaving a job, and the calling process's place in it."""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass

from hora import _native
from hora.driver.client import register
from hora.driver.topology import Assignment
from hora.exceptions import NotInitializedError
from hora.settings import Settings

__all__ = [
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]


@dataclass
class _Job:
    transport: _native.Transport
    place: Assignment
    settings: Settings
    # The native transport is not thread-safe; collectives hold this lock.
    lock: threading.Lock

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def size(self) -> int:
        return self.place.size


_job: _Job | None = None
_init_lock = threading.Lock()


def init() -> None:
    """Joins the job this process was started in.

    Under ``horarun`` (or the Spark and Ray backends) the process registers
    with the job's driver service, receives its rank and connects to every
    peer. Started on its own, it becomes a job of one rank. Calling it again
    while initialized does nothing.

    Raises:
        RendezvousError: not all workers of the job registered in time.
        HoraInternalError: the connections to the peers could not be set up.
    """
    global _job
    with _init_lock:
        if _job is not None:
            return
        settings = Settings.from_env()
        if settings.driver_address is None:
            transport = _native.LoopbackGroup(1, settings.timeout).transport(0)
            alone = Assignment(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, peers=())
            _job = _Job(transport, alone, settings, threading.Lock())
            return
        assert settings.secret is not None
        listener = _native.TcpListener(settings.bind_host, 0)
        try:
            assignment = register(
                settings.driver_address,
                settings.secret,
                index=settings.worker_index,
                host=settings.hostname,
                address=(settings.advertise_host, listener.port),
                timeout=settings.start_timeout,
            )
            transport = _native.connect_tcp(
                listener,
                assignment.rank,
                list(assignment.peers),
                settings.secret,
                settings.start_timeout,
                settings.timeout,
            )
        finally:
            listener.close()
        _job = _Job(transport, assignment, settings, threading.Lock())


def shutdown() -> None:
    """Leaves the job and closes the connections to the peers. Safe to call twice."""
    global _job
    with _init_lock:
        _job = None


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
