"""The rank variables every launcher gives a worker before user code runs.

horovodrun sets ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``,
``HOROVOD_LOCAL_SIZE``, ``HOROVOD_CROSS_RANK``, ``HOROVOD_CROSS_SIZE`` and
``HOROVOD_HOSTNAME`` in each worker's environment, and scripts read them
before ``init`` (to pin a GPU, to pick a data shard). Hora's launchers set
those and the same ``HORA_*`` names.

A launcher knows each worker's slot index and host identity before any
worker starts (horarun from its slots; Spark from the barrier stage's task
addresses; Ray from the actors' node ids). The driver service will assign
ranks from exactly those registrations with
:func:`hora.driver.topology.assign_ranks`, so running the same function here
gives the values ``hora.rank()`` and friends will return after ``init``.
"""

from __future__ import annotations

from collections.abc import Sequence

from hora.driver.topology import Registration, assign_ranks

__all__ = ["rank_variables"]

_NAMES = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")


def rank_variables(hosts: Sequence[str]) -> list[dict[str, str]]:
    """The rank variables of each worker of a job.

    Args:
        hosts: the host identity of each worker, by slot index (what it will
            register as ``HORA_HOSTNAME``).

    Returns:
        For each slot index, ``HORA_RANK`` ... ``HORA_HOSTNAME`` and the same
        ``HOROVOD_*`` names, as strings.
    """
    if not hosts:
        return []
    registrations = [Registration(index, host, ("", 0)) for index, host in enumerate(hosts)]
    assignments = assign_ranks(registrations)
    variables = []
    for index, host in enumerate(hosts):
        a = assignments[index]
        values = (a.rank, a.size, a.local_rank, a.local_size, a.cross_rank, a.cross_size, host)
        one = {}
        for name, value in zip(_NAMES, values, strict=True):
            one[f"HORA_{name}"] = one[f"HOROVOD_{name}"] = str(value)
        variables.append(one)
    return variables
