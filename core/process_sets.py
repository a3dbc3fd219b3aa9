"""Process sets: collectives among a subset of the job's ranks.

Requests in different process sets negotiate independently, so two sets of
ranks can run unrelated collectives at the same time::

    evens = hora.add_process_set([0, 2])
    if evens.included():
        hora.allreduce(x, process_set=evens)

Adding and removing a set is itself a collective: every rank of the job calls
it, with the same ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hora import _native
from hora.basics import current_job, size
from hora.basics import rank as _job_rank
from hora.handles import Request, request_names, submit

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]


class ProcessSet:
    """A set of global ranks. Register it with :func:`add_process_set` before use.

    Attributes:
        process_set_id: the id the engine knows the set by, or None while it
            is not registered. The global set has id 0.
    """

    def __init__(self, ranks: Sequence[int] | Any) -> None:
        """Args:
        ranks: the member ranks; or, in a job that MPI started, an mpi4py
            communicator whose processes are the members (as Horovod's
            ``ProcessSet(comm)``: with ``COMM_WORLD.Split``, every rank passes
            its own part, and every part becomes a set on every rank).
        """
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        self._ranks: list[int] | None = None
        if hasattr(ranks, "Get_group"):  # an mpi4py communicator: its ranks are known once the job is
            self.mpi_comm = ranks
            return
        members = [int(r) for r in ranks]
        if any(r < 0 for r in members) or len(set(members)) != len(members):
            raise ValueError(f"A process set needs distinct non-negative ranks, got {list(ranks)!r}.")
        self._ranks = sorted(members)

    @property
    def ranks(self) -> list[int]:
        """The member ranks, ascending (for the global set: every rank of the running job)."""
        if self is global_process_set:
            return list(range(size()))
        if self._ranks is None:
            self._ranks = _communicator_ranks(self.mpi_comm)
        return list(self._ranks)

    def size(self) -> int:
        """The number of member ranks."""
        return len(self.ranks)

    def included(self) -> bool:
        """Whether this process is a member."""
        return _job_rank() in self.ranks

    def rank(self) -> int:
        """This process's index among the members; raises ValueError when it is not one."""
        ranks = self.ranks
        if _job_rank() not in ranks:
            raise ValueError(f"Rank {_job_rank()} is not a member of process set {ranks}.")
        return ranks.index(_job_rank())

    def __repr__(self) -> str:
        if self is global_process_set:
            return "ProcessSet(global)"
        members = self._ranks if self._ranks is not None else self.mpi_comm
        return f"ProcessSet({members}, process_set_id={self.process_set_id})"


def _communicator_ranks(comm: Any) -> list[int]:
    """The job ranks of ``comm``'s processes (the job's communicator's ranks)."""
    from mpi4py import MPI

    job_comm = current_job().mpi_comm
    if job_comm is None:
        raise ValueError(
            "A process set made from an MPI communicator needs a job that MPI started (mpiexec and hora.init()); "
            "this one was not: pass the ranks instead."
        )
    group, job_group = comm.Get_group(), job_comm.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job_group)
    finally:
        group.Free()
        job_group.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError(f"The communicator {comm!r} has processes outside this Hora job.")
    return sorted(ranks)


global_process_set = ProcessSet([])
"""Every rank of the job (id 0); the default ``process_set`` of every collective."""
global_process_set.process_set_id = 0


def set_id(process_set: ProcessSet, caller: str) -> int:
    """The engine id of ``process_set``; raises when it is not a registered ProcessSet."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"hora.{caller}: process_set must be a hora.ProcessSet, got {process_set!r}.")
    if process_set.process_set_id is None:
        raise ValueError(
            f"hora.{caller}: {process_set!r} is not registered; call hora.add_process_set() on every rank first."
        )
    return process_set.process_set_id


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Registers a process set on every rank and returns it, with its ``process_set_id`` set.

    Every rank of the job must call it with the same ranks, in the same order
    relative to other calls of add_process_set / remove_process_set.

    Raises:
        ValueError: a rank is outside the job, or a set with these ranks exists.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    job = current_job()
    if process_set is global_process_set or process_set.process_set_id is not None:
        raise ValueError(f"{process_set!r} is already registered.")
    if process_set.mpi_comm is not None:
        return _add_communicator_sets(process_set)
    members = process_set.ranks
    if not members or members[-1] >= job.size:
        raise ValueError(f"hora.add_process_set: ranks {members} must be a non-empty subset of 0 .. {job.size - 1}.")
    for existing in job.engine.process_set_ids():
        if job.engine.process_set(existing) == members:
            raise ValueError(f"hora.add_process_set: a process set with ranks {members} exists (id {existing}).")
    kind = _native.RequestKind.ADD_PROCESS_SET
    request = Request(kind, request_names(job, kind, None, 0, 1, False)[1][0], ranks=members)
    process_set.process_set_id = submit(job, [request], lambda results: results[0].value, group="").wait()
    job.process_sets.append(process_set)
    return process_set


def register_at_init(process_set: ProcessSet) -> None:
    """Registers a set given to :func:`hora.init`: as Horovod's init, one of every rank of the job is the global
    set (id 0) instead of an error."""
    job = current_job()
    if process_set.mpi_comm is None and process_set.ranks == list(range(job.size)):
        process_set.process_set_id = 0
        job.process_sets.append(process_set)
        return
    add_process_set(process_set)


def _add_communicator_sets(process_set: ProcessSet) -> ProcessSet:
    """Registers every rank's set of a communicator-made ``process_set`` (each rank may hold another part of a
    split), in the order of their lowest rank's first appearance; ``process_set`` gets its own part's id."""
    mine = process_set.ranks
    every = current_job().mpi_comm.allgather(mine)
    for ranks in dict.fromkeys(tuple(r) for r in every):
        registered = add_process_set(ProcessSet(list(ranks)))
        if list(ranks) == mine:
            process_set.process_set_id = registered.process_set_id
    current_job().process_sets.append(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregisters ``process_set`` on every rank (every rank calls it); returns whether it was registered.

    The global process set cannot be removed.
    """
    if process_set is global_process_set:
        raise ValueError("The global process set cannot be removed.")
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0):
        return False  # not registered, or given to init() with every rank: the global set, which stays
    job = current_job()
    kind = _native.RequestKind.REMOVE_PROCESS_SET
    request = Request(kind, request_names(job, kind, None, 0, 1, False)[1][0], ranks=[process_set.process_set_id])
    submit(job, [request], lambda results: None, group="").wait()
    process_set.process_set_id = None
    if process_set in job.process_sets:
        job.process_sets.remove(process_set)
    return True
