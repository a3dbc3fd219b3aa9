"""Worker script under ``mpiexec -n N``: what MPI mode adds. The ranks meet through MPI (no horarun).

Prints ``FAILED <case>`` with each failure's traceback and, last, ``rank R: P of T cases passed``; exits
non-zero if a case failed.
"""

from __future__ import annotations

import sys

import hora
import numpy as np
from mpi4py import MPI

from tests.worker import run_each

WORLD = MPI.COMM_WORLD


def cases():
    def ranks_are_mpis():
        hora.init()
        assert hora.mpi_enabled() and hora.mpi_built()
        assert (hora.rank(), hora.size()) == (WORLD.Get_rank(), WORLD.Get_size())
        assert (hora.local_rank(), hora.local_size()) == (WORLD.Get_rank(), WORLD.Get_size())  # one node
        assert (hora.cross_rank(), hora.cross_size()) == (0, 1)
        assert hora.mpi_threads_supported() == (MPI.Query_thread() >= MPI.THREAD_MULTIPLE)
        links = hora.basics.current_job().transport_links()
        assert links == ["self" if r == hora.rank() else "shm" for r in range(hora.size())], links
        total = hora.allreduce(np.full(3, hora.rank() + 1.0), op=hora.Sum)
        np.testing.assert_array_equal(total, np.full(3, hora.size() * (hora.size() + 1) / 2))

    yield "ranks, local and cross ranks come from MPI; shared memory within the node", ranks_are_mpis

    def split_communicators_become_process_sets():
        parity = WORLD.Get_rank() % 2
        part = WORLD.Split(color=parity, key=WORLD.Get_rank())
        halves = hora.ProcessSet(part)
        hora.shutdown()
        hora.init(WORLD, process_sets=[halves])  # Horovod's way: each rank passes its own part
        mine = [r for r in range(WORLD.Get_size()) if r % 2 == parity]
        assert halves.ranks == mine and halves.included() and halves.process_set_id not in (None, 0)
        total = hora.allreduce(np.array([float(hora.rank())]), op=hora.Sum, process_set=halves)
        assert total[0] == sum(mine), (total, mine)
        part.Free()

    yield (
        "ProcessSet(comm) of a split communicator, on every rank its own part",
        split_communicators_become_process_sets,
    )

    def a_list_of_ranks_makes_the_job_of_those_ranks():
        hora.shutdown()
        evens = [r for r in range(WORLD.Get_size()) if r % 2 == 0]
        odds = [r for r in range(WORLD.Get_size()) if r % 2 == 1]
        members = evens if WORLD.Get_rank() % 2 == 0 else odds
        hora.init(comm=members)
        assert hora.size() == len(members) and hora.rank() == members.index(WORLD.Get_rank())
        gathered = hora.allgather(np.array([WORLD.Get_rank()]))
        assert list(gathered) == members, (list(gathered), members)
        hora.shutdown()
        hora.init()  # and COMM_WORLD again, on fresh connections
        assert hora.size() == WORLD.Get_size()

    yield (
        "init(comm=[ranks]) makes a job of those ranks; init() again, of all",
        a_list_of_ranks_makes_the_job_of_those_ranks,
    )

    def bad_comm_arguments_are_refused():
        hora.shutdown()
        for comm, kind, text in [
            ("world", TypeError, "an mpi4py communicator or a list of COMM_WORLD ranks, got 'world'"),
            ([0, 0], ValueError, "must be distinct ranks of COMM_WORLD"),
            ([WORLD.Get_size()], ValueError, "must be distinct ranks of COMM_WORLD"),
        ]:
            try:
                hora.init(comm=comm)
            except kind as exc:
                assert text in str(exc), (text, str(exc))
            else:
                raise AssertionError(f"init(comm={comm!r}) was accepted")
        assert not hora.is_initialized()
        hora.init()

    yield "bad comm= arguments are refused, naming the value", bad_comm_arguments_are_refused


def main() -> int:
    code = run_each(cases(), f"rank {WORLD.Get_rank()}")
    hora.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
