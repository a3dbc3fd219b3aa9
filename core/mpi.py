"""Jobs that MPI starts: ``mpiexec -n 4 python train.py`` (or ``mpirun``, ``srun``), no horarun needed.

Under an MPI launcher (found from its environment: Open MPI, MPICH/Hydra,
Intel MPI, MVAPICH, PMIx, Slurm) or with ``hora.init(comm=...)``,
:func:`hora.init` rendezvouses through MPI (mpi4py) instead of a driver
service: every rank opens its peer listener, the ranks gather where they
listen and which node they run on (``MPI.Get_processor_name()``), rank 0
broadcasts a fresh job secret, and Hora's own transports connect as under
horarun (shared memory within a node, TCP across, every connection
authenticated with the secret). Ranks are the communicator's; local ranks
count the ranks on the same node in rank order, cross ranks as Horovod.

MPI's collectives cannot time out, so the rendezvous first waits in a
non-blocking barrier for at most the start timeout: a rank that never calls
``init`` fails the others with :class:`hora.RendezvousError` instead of
hanging them.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hora import _native
from hora.driver.topology import Assignment, place_in_order
from hora.exceptions import RendezvousError
from hora.settings import Settings

__all__ = ["communicator", "launched_by_mpi", "mpi_available", "release", "rendezvous", "thread_support"]

# Variables an MPI launcher sets in every process it starts, with the number of processes.
LAUNCHER_SIZES = (
    "OMPI_COMM_WORLD_SIZE",  # Open MPI
    "PMI_SIZE",  # MPICH/Hydra, Intel MPI
    "PMIX_SIZE",  # PMIx launchers
    "MV2_COMM_WORLD_SIZE",  # MVAPICH
    "SLURM_NTASKS",  # srun
)
_ARRIVAL_POLL = 0.005  # seconds between tests of the arrival barrier
_MADE: list[Any] = []  # the communicators communicator() made from lists of ranks, until release()


def _launcher_size(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The launcher's variable that gives the number of processes, and its value; None outside a launcher."""
    for name in LAUNCHER_SIZES:
        if env.get(name) and (name != "SLURM_NTASKS" or env.get("SLURM_STEP_ID")):  # srun, not an allocation
            return name, env[name]
    return None


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """Whether an MPI launcher (``mpiexec``, ``mpirun``, ``srun``) started this process with others.

    One process alone (``srun -n 1``) is a job of one, as without a launcher: it needs no MPI.
    """
    found = _launcher_size(os.environ if environ is None else environ)
    return found is not None and found[1] != "1"


def mpi_available() -> bool:
    """Whether mpi4py can be imported (it brings the MPI library it was built against, e.g. the mpich wheel)."""
    from importlib.util import find_spec

    return find_spec("mpi4py") is not None


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            "Hora was started by an MPI launcher (or given comm=), which needs mpi4py: pip install 'hora[mpi]'."
        ) from exc
    return MPI


def communicator(comm: Any) -> Any:
    """The mpi4py communicator a job runs on: ``comm`` itself, ``COMM_WORLD`` for None, or for a list of
    ``COMM_WORLD`` ranks, their communicator (every rank in the list calls this, as ``init``)."""
    MPI = _mpi()  # noqa: N806 - mpi4py's name
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Intracomm):
        return comm
    if isinstance(comm, MPI.Comm):
        raise TypeError(f"hora.init: comm must be an intracommunicator, got {comm!r}.")
    if isinstance(comm, (str, bytes)) or not isinstance(comm, Sequence):
        raise TypeError(f"hora.init: comm must be an mpi4py communicator or a list of COMM_WORLD ranks, got {comm!r}.")
    world = MPI.COMM_WORLD
    ranks = [int(r) for r in comm]
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < world.Get_size() for r in ranks):
        raise ValueError(f"hora.init: comm={list(comm)!r} must be distinct ranks of COMM_WORLD (0 .. "
                         f"{world.Get_size() - 1}).")  # fmt: skip
    if world.Get_rank() not in ranks:
        raise ValueError(f"hora.init: this process (COMM_WORLD rank {world.Get_rank()}) is not in comm={ranks!r}.")
    group = world.Get_group().Incl(ranks)
    try:
        made = world.Create_group(group)
    finally:
        group.Free()
    _MADE.append(made)  # freed by release() when the job ends
    return made


def release(comm: Any) -> None:
    """Frees ``comm`` if :func:`communicator` made it (from a list of ranks); a caller's own is theirs."""
    for i, made in enumerate(_MADE):
        if made is comm:
            del _MADE[i]
            comm.Free()
            return


def thread_support() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE`` (False when MPI is not initialized)."""
    MPI = _mpi()  # noqa: N806
    return bool(MPI.Is_initialized() and MPI.Query_thread() >= MPI.THREAD_MULTIPLE)


def _check_launcher(comm: Any, environ: Mapping[str, str]) -> None:
    """An MPI library that does not speak its launcher's protocol starts every process as a job of one."""
    MPI = _mpi()  # noqa: N806
    launcher = _launcher_size(environ)
    if comm is not MPI.COMM_WORLD or launcher is None:
        return
    name, text = launcher
    if text.isdigit() and int(text) != comm.Get_size():
        raise RendezvousError(
            f"The launcher started {text} processes ({name}) but MPI sees {comm.Get_size()}: this mpi4py's MPI "
            f"({MPI.Get_library_version().splitlines()[0]}) is not the launcher's. Start the job with the "
            "mpiexec of the MPI that mpi4py was built against (the mpich wheel's is .venv/bin/mpiexec)."
        )


def _await_every_rank(comm: Any, timeout: float) -> None:
    """Waits at most ``timeout`` seconds for every rank of ``comm`` to reach here."""
    request = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"hora.init: not every one of the {comm.Get_size()} MPI ranks called hora.init within {timeout:g} s "
                "(HORA_START_TIMEOUT)."
            )
        time.sleep(_ARRIVAL_POLL)


def rendezvous(
    comm: Any, settings: Settings, environ: Mapping[str, str] | None = None
) -> tuple[_native.Transport, Assignment]:
    """This rank's transport to every peer of ``comm``, and its place in the job."""
    env = os.environ if environ is None else environ
    MPI = _mpi()  # noqa: N806
    _check_launcher(comm, env)
    _await_every_rank(comm, settings.start_timeout)
    rank = comm.Get_rank()
    # Past the barrier every rank answers each collective below, a failing one too, with its error: no rank is
    # left waiting in MPI (which cannot time out) for one that gave up.
    nodes = comm.allgather(env.get("HORA_HOSTNAME") or MPI.Get_processor_name())
    one_node = len(set(nodes)) == 1
    listener, failure = None, None
    try:
        bind, advertise = _addresses(env, settings, one_node, nodes[rank])
        listener = _native.TcpListener(bind, 0)
        mine: tuple[str, int] | str = (advertise, listener.port)
    except (OSError, RendezvousError, _native.HoraError) as exc:
        failure = mine = f"rank {rank} ({nodes[rank]}): {exc}"
    try:
        secret = comm.bcast(secrets.token_bytes(32) if rank == 0 else None, root=0)
        peers = comm.allgather(mine)
        failed = [p for p in peers if isinstance(p, str)]
        if failed:
            raise RendezvousError("hora.init: MPI ranks could not open their peer listeners: " + "; ".join(failed))
        assert listener is not None and failure is None
        place = place_in_order(nodes, [tuple(p) for p in peers])[rank]
        transport = _native.connect(
            listener, rank, list(place.peers), secret, settings.start_timeout, settings.timeout,
            hosts=list(place.hosts), shared_memory=settings.transport == "auto", single_copy=settings.shm_single_copy,
        )  # fmt: skip
    finally:
        if listener is not None:
            listener.close()
    return transport, place


def _addresses(env: Mapping[str, str], settings: Settings, one_node: bool, node: str) -> tuple[str, str]:
    """Where this rank listens and the address its peers reach it at.

    One node: loopback, as horarun on one host. Several: listen everywhere
    and give the node's address. ``HORA_NETWORK_INTERFACE`` (its address, for
    both), ``HORA_BIND_ADDR`` and ``HORA_ADVERTISE_ADDR`` override.
    """
    if env.get("HORA_NETWORK_INTERFACE"):
        return settings.bind_host, settings.advertise_host
    explicit = env.get("HORA_ADVERTISE_ADDR")
    bind = env.get("HORA_BIND_ADDR") or ("127.0.0.1" if one_node and not explicit else "0.0.0.0")
    if explicit:
        return bind, settings.advertise_host
    if one_node:
        return bind, "127.0.0.1"
    address = socket.gethostbyname(node)
    if address.startswith("127."):
        raise RendezvousError(
            f"the node name {node!r} resolves to {address}, which the other nodes cannot reach; set "
            "HORA_NETWORK_INTERFACE (e.g. eth0) or HORA_ADVERTISE_ADDR."
        )
    return bind, address
