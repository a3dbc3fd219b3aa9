"""Rendezvous in numbered rounds: who registered, and each round's assignments.

A job's workers meet once per round. Round 0 is the first ``hora.init()``;
each ``shutdown()`` then ``init()`` in a worker process joins the next round
(the worker counts its own inits and says which round it is joining). Each
round keeps its own registrations, assignments, deadline and failure, so a
worker that registers again is a member of a new round, not a duplicate of
itself. Ranks come from :func:`~hora.driver.topology.assign_ranks`, which
depends only on the slot indexes and host identities registered: the same
workers coming back get the same ranks.

Round 0 must complete within the start timeout of the service starting;
a later round within the start timeout of its first registration (the time
between rounds is training time, which nobody bounds). Membership here is
fixed at ``num_workers`` slots; an elastic job's rounds
(:class:`~hora.driver.elastic.ElasticRounds`) change it from one round to
the next, which is why a round, not the service, holds its members.

This module knows nothing of sockets: the service calls :meth:`Rounds.join`
from its connection threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from hora.driver.topology import Assignment, Registration, assign_ranks
from hora.exceptions import RendezvousError

__all__ = ["Rounds"]


@dataclass
class _Round:
    number: int
    deadline: float
    registrations: dict[int, Registration] = field(default_factory=dict)
    assignments: dict[int, Assignment] | None = None
    failure: str | None = None


class Rounds:
    """The rounds of one job, safe to use from many threads.

    Args:
        num_workers: how many workers make up every round.
        start_timeout: seconds a round may take to fill.
        expected_hosts: optional host of each slot index, named when a worker is missing.
        driver: where workers reach the service, named when workers are missing.
    """

    def __init__(self, num_workers: int, start_timeout: float, expected_hosts: Mapping[int, str], driver: str) -> None:
        self._num_workers = num_workers
        self._start_timeout = start_timeout
        self._expected_hosts = dict(expected_hosts)
        self._driver = driver
        self._rounds: dict[int, _Round] = {}
        # The slots registered in each round that failed and was forgotten since: registered() stays honest.
        self._failed: dict[int, frozenset[int]] = {}
        self._latest_complete = -1
        self._closed = False
        self._condition = threading.Condition()

    def open(self) -> None:
        """Opens round 0; its start timeout counts from now."""
        with self._condition:
            self._rounds.setdefault(0, _Round(0, time.monotonic() + self._start_timeout))

    def close(self) -> None:
        """Ends every round: waiting workers get an error at once."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def join(self, number: int, registration: Registration) -> Assignment:
        """Registers a worker for round ``number`` and waits until the round is complete.

        Raises:
            RendezvousError: the registration is invalid for this round, or the
                round did not fill within the start timeout, or the service stopped.
        """
        index = registration.index
        if not 0 <= index < self._num_workers:
            raise RendezvousError(
                f"Worker index {index} is outside 0..{self._num_workers - 1} for a job of {self._num_workers} workers."
            )
        with self._condition:
            if number < 0 or number < self._latest_complete:
                raise RendezvousError(
                    f"Worker index {index} asked to join rendezvous round {number}, but the job is already in "
                    f"round {self._latest_complete}; every worker must call hora.init() the same number of times."
                )
            found = self._rounds.get(number)
            if found is None:
                found = self._rounds[number] = _Round(number, time.monotonic() + self._start_timeout)
            earlier = found.registrations.get(index)
            if earlier is not None and earlier != registration:
                raise RendezvousError(f"Worker index {index} registered twice in rendezvous round {number}.")
            # The same slot, host and listening address again is the same worker retrying after its connection
            # was lost (perhaps after the first attempt got here): it waits for the round like the first attempt.
            if earlier is None:
                found.registrations[index] = registration
                if len(found.registrations) == self._num_workers:
                    found.assignments = assign_ranks(list(found.registrations.values()))
                    self._complete(number)
                self._condition.notify_all()
            return self._wait(found)[index]

    def registered(self, number: int = 0) -> set[int]:
        """The slot indexes that have registered for round ``number`` so far.

        A round that has not started has none. Every worker registers in every
        round in turn, so a round already forgotten (one before the latest
        complete round) had all of them, unless it failed: then it reports the
        slots it had when it failed.
        """
        with self._condition:
            found = self._rounds.get(number)
            if found is not None:
                return set(found.registrations)
            if number in self._failed:
                return set(self._failed[number])
            if 0 <= number < self._latest_complete:
                return set(range(self._num_workers))
            return set()

    def latest(self) -> int:
        """The number of the latest round that has started (0 before anyone registers).

        A launcher watches it: a worker that exits while others wait in this
        round without having registered in it means the round can never fill.
        """
        with self._condition:
            return max(self._rounds, default=max(self._latest_complete, 0))

    def wait(self, number: int = 0) -> dict[int, Assignment]:
        """Blocks until round ``number`` is complete; raises RendezvousError at its timeout."""
        with self._condition:
            found = self._rounds.get(number)
            if found is None:
                raise RendezvousError(
                    f"Rendezvous round {number} has not started or is long over (the latest complete round is "
                    f"{self._latest_complete})."
                )
            return dict(self._wait(found))

    def _complete(self, number: int) -> None:
        """Records that a round filled, and forgets the rounds before it: no worker can still be in them.

        Round 0 is kept: launchers :meth:`wait` for it, perhaps only after the workers have moved on.
        """
        self._latest_complete = max(self._latest_complete, number)
        for old in [n for n in self._rounds if 0 < n < number]:
            forgotten = self._rounds.pop(old)
            if forgotten.failure is not None:
                self._failed[old] = frozenset(forgotten.registrations)

    def _wait(self, found: _Round) -> dict[int, Assignment]:
        """Waits (holding the condition) until the round is assigned, failed, closed or timed out."""
        while found.assignments is None and found.failure is None:
            if self._closed:
                raise RendezvousError("The driver service was stopped before every worker registered.")
            remaining = found.deadline - time.monotonic()
            if remaining <= 0:
                found.failure = self._missing_message(found)
                self._condition.notify_all()
                break
            self._condition.wait(timeout=min(remaining, 1.0))
        if found.failure is not None:
            raise RendezvousError(found.failure)
        assert found.assignments is not None
        return found.assignments

    def _missing_message(self, found: _Round) -> str:
        missing = [i for i in range(self._num_workers) if i not in found.registrations]
        where: dict[str, list[str]] = {}
        for index in missing:
            where.setdefault(self._expected_hosts.get(index, "an unknown host"), []).append(str(index))
        places = "; ".join(f"{', '.join(indices)} on host {host}" for host, indices in where.items())
        which = "" if found.number == 0 else f"In rendezvous round {found.number} (hora.init() after shutdown()), "
        counted = f"{len(found.registrations)} of {self._num_workers} workers registered"
        return (
            f"{which}{counted} after {self._start_timeout:g} s; missing ranks {places}. Check that those workers "
            f"started (see their output) and can reach the driver at {self._driver}."
        )
