"""Rank assignment: from the workers' registrations to each worker's place in the job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Assignment", "Registration", "assign_ranks", "place_in_order"]


@dataclass(frozen=True)
class Registration:
    """What a worker tells the driver about itself.

    Attributes:
        index: the launcher's slot number for the worker, unique in the job.
        host: host identity; workers with equal identities share a host.
        address: ``(host, port)`` on which the worker accepts peer connections.
    """

    index: int
    host: str
    address: tuple[str, int]


@dataclass(frozen=True)
class Assignment:
    """A worker's place in the job, where every peer listens, and which host each rank is on.

    ``hosts[r]`` numbers rank r's host (0, 1, ... in rank order); ranks with
    equal numbers share a host, and so can share memory.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    peers: tuple[tuple[str, int], ...]
    hosts: tuple[int, ...] = ()


def assign_ranks(registrations: Sequence[Registration]) -> dict[int, Assignment]:
    """Assigns ranks so that the ranks of one host are contiguous.

    Hosts are ordered by the lowest index registered on them and workers by
    index within a host, so a launcher that numbers its slots host by host
    gets rank == index.

    Returns:
        The assignment of each registration, keyed by its index.
    """
    by_host: dict[str, list[Registration]] = {}
    for registration in sorted(registrations, key=lambda r: r.index):
        by_host.setdefault(registration.host, []).append(registration)
    ordered = [r for group in by_host.values() for r in group]
    places = place_in_order([r.host for r in ordered], [r.address for r in ordered])
    return {r.index: place for r, place in zip(ordered, places, strict=True)}


def place_in_order(hosts: Sequence[str], peers: Sequence[tuple[str, int]]) -> list[Assignment]:
    """The places of ranks numbered already (MPI's): rank r runs on ``hosts[r]`` and listens at ``peers[r]``.

    Local ranks count the ranks of a host in rank order; hosts are numbered
    by their lowest rank. ``cross_rank``/``cross_size`` follow Horovod: the
    position among, and the number of, ranks with the same ``local_rank``.
    """
    host_numbers: dict[str, int] = {}
    local: dict[str, int] = {}
    local_ranks = []
    for host in hosts:
        host_numbers.setdefault(host, len(host_numbers))
        local_ranks.append(local.get(host, 0))
        local[host] = local_ranks[-1] + 1
    cross_groups: dict[int, list[int]] = {}
    for rank, local_rank in enumerate(local_ranks):
        cross_groups.setdefault(local_rank, []).append(rank)
    numbers = tuple(host_numbers[host] for host in hosts)
    return [
        Assignment(
            rank=rank,
            size=len(hosts),
            local_rank=local_rank,
            local_size=local[hosts[rank]],
            cross_rank=cross_groups[local_rank].index(rank),
            cross_size=len(cross_groups[local_rank]),
            peers=tuple(peers),
            hosts=numbers,
        )
        for rank, local_rank in enumerate(local_ranks)
    ]
