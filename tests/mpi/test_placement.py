"""MPI mode's pure parts: which environments are MPI launches, and places for ranks MPI has numbered."""

from __future__ import annotations

import pytest
from hora.driver.topology import Registration, assign_ranks, place_in_order
from hora.mpi import launched_by_mpi


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"OMPI_COMM_WORLD_SIZE": "4"}, True),
        ({"PMI_SIZE": "2", "PMI_RANK": "1"}, True),
        ({"PMIX_SIZE": "8"}, True),
        ({"MV2_COMM_WORLD_SIZE": "2"}, True),
        ({"SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}, True),  # inside srun
        ({"SLURM_NTASKS": "4"}, False),  # a batch script in an allocation, not a task of srun
        ({"PMI_SIZE": "1"}, False),  # one process alone needs no MPI
    ],
)
def test_mpi_launches_are_recognised_from_the_launchers_variables(environ: dict, expected: bool) -> None:
    assert launched_by_mpi(environ) is expected


def test_ranks_numbered_by_mpi_keep_their_numbers_across_interleaved_hosts() -> None:
    peers = [("10.0.0.1", 1000), ("10.0.0.2", 1001), ("10.0.0.1", 1002), ("10.0.0.2", 1003)]
    places = place_in_order(["a", "b", "a", "b"], peers)
    assert [p.rank for p in places] == [0, 1, 2, 3]
    assert [(p.local_rank, p.local_size) for p in places] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert [(p.cross_rank, p.cross_size) for p in places] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert all(p.hosts == (0, 1, 0, 1) and p.peers == tuple(peers) for p in places)


def test_the_driver_still_makes_each_hosts_ranks_contiguous() -> None:
    registrations = [Registration(i, "ab"[i % 2], ("127.0.0.1", 2000 + i)) for i in range(4)]
    places = assign_ranks(registrations)
    assert [places[i].rank for i in range(4)] == [0, 2, 1, 3]
    assert places[1].hosts == (0, 0, 1, 1) and places[1].local_rank == 0 and places[1].cross_rank == 1
