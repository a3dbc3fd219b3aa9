"""Rank assignment: from the workers' registrations to each worker's place in the job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Assignment", "Registration", "assign_ranks"]


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
    gets rank == index. ``cross_rank``/``cross_size`` follow Horovod: the
    position among, and the number of, workers with the same ``local_rank``.

    Returns:
        The assignment of each registration, keyed by its index.
    """
    by_host: dict[str, list[Registration]] = {}
    for registration in sorted(registrations, key=lambda r: r.index):
        by_host.setdefault(registration.host, []).append(registration)
    ordered = [(local_rank, len(group), r) for group in by_host.values() for local_rank, r in enumerate(group)]
    peers = tuple(r.address for _, _, r in ordered)
    host_numbers = {host: number for number, host in enumerate(by_host)}
    hosts = tuple(host_numbers[r.host] for _, _, r in ordered)
    cross_groups: dict[int, list[int]] = {}
    for rank, (local_rank, _, _) in enumerate(ordered):
        cross_groups.setdefault(local_rank, []).append(rank)
    assignments = {}
    for rank, (local_rank, local_size, registration) in enumerate(ordered):
        group = cross_groups[local_rank]
        assignments[registration.index] = Assignment(
            rank=rank,
            size=len(ordered),
            local_rank=local_rank,
            local_size=local_size,
            cross_rank=group.index(rank),
            cross_size=len(group),
            peers=peers,
            hosts=hosts,
        )
    return assignments
