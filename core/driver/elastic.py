"""Rendezvous rounds of an elastic job: membership that shrinks and grows between rounds.

In a fixed job every round has the same workers (:mod:`hora.driver.rounds`).
In an elastic job the launcher decides, at any moment, which running workers
take part: its *members*. A worker that died is removed, a worker started on
a newly discovered slot is added, and a worker whose host was removed (or
blacklisted) is told to leave when it next registers.

Every registration goes into the *open* round, the one after the latest
complete round, whatever round the worker counted itself: a worker started
mid-job joins the round its peers form at their next commit. The open round
completes once every member has registered and there are at least
``min_workers`` of them. Ranks: the workers of the previous round keep their
relative order, so rank 0 is a survivor (which holds the committed state)
whenever one survives; new workers follow by index; the ranks of one host stay
contiguous.

Deadlines: round 0 must complete within ``start_timeout`` of :meth:`open`; a
later round within ``elastic_timeout`` of its first registration (the time
between rounds is training time, which nobody bounds). A round that misses its
deadline fails every worker waiting in it, with the launcher's account of the
hosts.

Host updates: the launcher posts one whenever it adds workers or removes
them; rank 0 asks for the updates since the last one it saw at each
``state.commit()`` (see :mod:`hora.elastic`), and the ranks then agree to
re-form at that commit. Results are Horovod's ``HostUpdateResult`` values.

This module knows nothing of sockets or processes: the service calls
:meth:`ElasticRounds.join` from its connection threads, the launcher the rest.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hora.driver.topology import Assignment, Registration, place_in_order
from hora.exceptions import RendezvousError

__all__ = ["ElasticRounds", "HostUpdateResult"]

# Complete rounds whose assignments are kept for workers still waking up from them.
_KEPT_ROUNDS = 4


class HostUpdateResult(enum.IntFlag):
    """What changed in the job's hosts since a worker last looked (Horovod's values)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = 3


@dataclass
class _OpenRound:
    number: int
    deadline: float | None  # None: round > 0 before its first registration
    registrations: dict[int, Registration] = field(default_factory=dict)


class ElasticRounds:
    """The rounds of one elastic job, safe to use from many threads.

    Args:
        min_workers: the fewest workers a round may have.
        start_timeout: seconds round 0 may take to complete, from :meth:`open`.
        elastic_timeout: seconds a later round may take, from its first registration.
        describe_hosts: the launcher's account of its hosts (available,
            blacklisted), quoted when a round misses its deadline.
        reset_limit: how many rounds may follow round 0 (Horovod's
            ``--reset-limit``); a registration for one more fails the job.
        open_membership: workers the launcher did not start join by
            registering (Spark starts its tasks, and retries failed ones,
            itself): an unknown index becomes a member, unless the job already
            has ``max_workers``, and a host update is posted for it.
        max_workers: with ``open_membership``, the most members at once.
        first_workers: how many workers round 0 waits for (default
            ``min_workers``): with open membership, the job's starting size.
    """

    def __init__(
        self,
        min_workers: int,
        start_timeout: float,
        elastic_timeout: float,
        describe_hosts: Callable[[], str] = lambda: "",
        reset_limit: int | None = None,
        open_membership: bool = False,
        max_workers: int | None = None,
        first_workers: int | None = None,
    ) -> None:
        if min_workers < 1:
            raise ValueError(f"min_workers must be at least 1, got {min_workers!r}.")
        self._min_workers = min_workers
        self._start_timeout = start_timeout
        self._elastic_timeout = elastic_timeout
        self._describe_hosts = describe_hosts
        self._reset_limit = reset_limit
        self._open_membership = open_membership
        self._max_workers = max_workers
        self._known: set[int] = set()  # every index ever a member: indexes are never reused
        self._finished = False
        self._first_workers = first_workers or min_workers
        self._members: dict[int, str] = {}  # index -> host, of the workers the launcher wants in the next round
        self._leaving: set[int] = set()
        self._previous_ranks: dict[int, int] = {}
        self._open = _OpenRound(0, None)
        self._assignments: dict[int, dict[int, Assignment]] = {}  # the latest complete rounds', by number
        self._round_updates: dict[int, int] = {}  # the latest host update each complete round reflects
        self._round_fresh: dict[int, bool] = {}  # whether each complete round has workers its previous had not
        self._failure: str | None = None
        self._closed = False
        self._updates = 0
        self._update_results: dict[int, HostUpdateResult] = {}
        # Workers the launcher added that have not registered yet, and whether an "added" update waits for them:
        # the running workers learn of new ones only once those are ready to join, so that they keep training
        # while a new process starts instead of waiting for it in the next round.
        self._unregistered: set[int] = set()
        self._added_pending = False
        self._added_ready: set[int] = set()  # added workers that registered and are not yet in a complete round
        self._condition = threading.Condition()

    # The launcher's side.

    def open(self) -> None:
        """Starts round 0's clock."""
        with self._condition:
            if self._open.number == 0 and self._open.deadline is None:
                self._open.deadline = time.monotonic() + self._start_timeout

    def close(self) -> None:
        """Ends every round: waiting workers get an error at once."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def add(self, index: int, host: str) -> None:
        """Makes a (new) worker a member of the open round and every later one."""
        with self._condition:
            if index in self._known:
                raise ValueError(f"Worker index {index} is already part of this job; indexes are never reused.")
            self._known.add(index)
            self._members[index] = host
            self._unregistered.add(index)
            self._condition.notify_all()

    def remove(self, index: int) -> None:
        """Drops a worker that exited: the open round no longer waits for it (nor keeps its registration).

        A worker of the last round lost starts the open round's clock: the
        others must re-form within the elastic timeout.
        """
        with self._condition:
            if index in self._members and index in self._previous_ranks and self._open.deadline is None:
                self._open.deadline = time.monotonic() + self._elastic_timeout
            self._members.pop(index, None)
            self._leaving.discard(index)
            self._open.registrations.pop(index, None)
            self._no_longer_awaited(index)
            self._try_complete()
            self._condition.notify_all()

    def dismiss(self, index: int) -> None:
        """Tells a running worker to leave: its next registration is answered "leave", and no round waits for it."""
        with self._condition:
            if self._members.pop(index, None) is not None:
                self._leaving.add(index)
            registered = self._open.registrations.pop(index, None)
            if registered is not None:
                self._leaving.add(index)
            self._no_longer_awaited(index)
            self._try_complete()
            self._condition.notify_all()

    def finish(self) -> None:
        """Training ended (a worker returned): workers not in the latest complete round leave, as does any later one."""
        with self._condition:
            self._open_membership, self._finished = False, True
            current = set(self._assignments.get(self._open.number - 1, {}))
            for index in [i for i in self._members if i not in current]:
                del self._members[index]
                self._leaving.add(index)
                self._open.registrations.pop(index, None)
            self._try_complete()
            self._condition.notify_all()

    def post_update(self, result: HostUpdateResult) -> int:
        """Records that hosts were added or removed; returns the number (the "timestamp") of the latest update.

        Workers added are announced once every one added so far has registered for the next round (they
        are ready to join); until then the running workers keep training.
        """
        with self._condition:
            result = HostUpdateResult(result)
            if result & HostUpdateResult.added and self._unregistered:
                self._added_pending = True
                result &= ~HostUpdateResult.added
            if result:
                self._publish(result)
            return self._updates

    def _publish(self, result: HostUpdateResult) -> None:
        self._updates += 1
        self._update_results[self._updates] = result

    def _no_longer_awaited(self, index: int, registered: bool = False) -> None:
        """Worker ``index`` registered (or is gone): once no added worker is awaited, announce those that came."""
        if index not in self._unregistered:
            return
        self._unregistered.discard(index)
        if registered:
            self._added_ready.add(index)
        else:
            self._added_ready.discard(index)
        if self._added_pending and not self._unregistered:
            if self._added_ready:
                self._publish(HostUpdateResult.added)
            self._added_pending = False
            self._added_ready.clear()

    def current(self) -> set[int]:
        """The worker indexes of the latest complete round (empty before round 0 completes)."""
        with self._condition:
            latest = self._open.number - 1
            return set(self._assignments.get(latest, {}))

    def latest(self) -> int:
        """The number of the open round (the latest complete one is one less)."""
        with self._condition:
            return self._open.number

    def failure(self) -> str | None:
        """Why a round failed, if one did (the job cannot go on)."""
        with self._condition:
            return self._failure

    def wait(self, number: int = 0) -> dict[int, Assignment]:
        """Blocks until round ``number`` is complete, if it is the open round or the latest complete one."""
        with self._condition:
            while number not in self._assignments:
                if number != self._open.number:
                    raise RendezvousError(f"Rendezvous round {number} has not started or is long over.")
                self._wait_open()
            return dict(self._assignments[number])

    def registered(self, number: int = 0) -> set[int]:
        """The worker indexes registered in round ``number`` so far (the open or latest complete round)."""
        with self._condition:
            if number == self._open.number:
                return set(self._open.registrations)
            return set(self._assignments.get(number, {}))

    # The workers' side.

    def join(self, number: int, registration: Registration) -> tuple[int, Assignment, int, bool] | None:
        """Registers a worker in the open round and waits until it completes.

        Args:
            number: the round the worker counted itself into; registrations
                go to the open round whatever it says.
            registration: the worker's slot index, host and address.

        Returns:
            ``(round, assignment, update, fresh)``: ``update`` is the latest
            host update the round reflects (the worker need not act on it
            again); ``fresh`` says the round has workers the previous one did
            not (so the state must be synced, whatever the workers expected).
            None when the worker is to leave the job.

        Raises:
            RendezvousError: the worker is unknown or registered twice, the
                round missed its deadline (which starts when a worker of the
                previous round registers or is lost), a new worker waited the
                elastic timeout for the others to come, or the service stopped.
        """
        index = registration.index
        with self._condition:
            if self._failure is not None:
                raise RendezvousError(self._failure)
            if index in self._leaving:
                return None
            if index not in self._known and not self._open_membership and self._finished:
                return None
            if index not in self._members and self._open_membership and index not in self._known:
                if self._max_workers is not None and len(self._members) >= self._max_workers:
                    self._known.add(index)
                    return None
                self._known.add(index)
                self._members[index] = registration.host
                self._updates += 1  # the members of the round running now re-form at their next commit
                self._update_results[self._updates] = HostUpdateResult.added
            if index not in self._members:
                raise RendezvousError(f"Worker index {index} is not part of this elastic job.")
            found = self._open
            if self._reset_limit is not None and found.number > self._reset_limit:
                self._failure = (
                    "Hora stopped the elastic job because the number of resets exceeded its limit: "
                    f"{self._reset_limit} (--reset-limit)."
                )
                self._condition.notify_all()
                raise RendezvousError(self._failure)
            earlier = found.registrations.get(index)
            if earlier is not None and earlier != registration:
                raise RendezvousError(f"Worker index {index} registered twice in rendezvous round {found.number}.")
            if found.deadline is None and index in self._previous_ranks:
                # A worker of the last round re-forms: the others must follow within the elastic timeout. A new
                # worker starts no clock: the running ones come at their next commit, however far off it is.
                found.deadline = time.monotonic() + self._elastic_timeout
            found.registrations[index] = registration
            self._no_longer_awaited(index, registered=True)
            self._try_complete()
            self._condition.notify_all()
            own_deadline = time.monotonic() + self._elastic_timeout
            while found.number not in self._assignments:
                if index in self._leaving:
                    return None
                if found.deadline is None and time.monotonic() > own_deadline:
                    found.registrations.pop(index, None)
                    raise RendezvousError(
                        f"Worker index {index} waited {self._elastic_timeout:g} s to join the job, but its running "
                        "workers did not reach a commit (state.commit()) in that time; commit more often than the "
                        "elastic timeout."
                    )
                self._wait_open()
            if index not in self._assignments[found.number]:  # dismissed after registering, before completion
                return None
            round_number = found.number
            return (round_number, self._assignments[round_number][index], self._round_updates[round_number],
                    self._round_fresh[round_number])  # fmt: skip

    def updates_since(self, timestamp: int) -> tuple[int, HostUpdateResult]:
        """The latest update's number and what changed in all updates after ``timestamp``."""
        with self._condition:
            result = HostUpdateResult.no_update
            for number in range(max(timestamp, 0) + 1, self._updates + 1):
                result |= self._update_results.get(number, HostUpdateResult.no_update)
            return self._updates, result

    # Internals (hold the condition).

    def _try_complete(self) -> None:
        found = self._open
        if not self._members or set(self._members) - set(found.registrations):
            return
        if len(self._members) < (self._first_workers if found.number == 0 else self._min_workers):
            return
        ordered = sorted(
            found.registrations.values(),
            key=lambda r: (0, self._previous_ranks[r.index]) if r.index in self._previous_ranks else (1, r.index),
        )
        by_host: dict[str, list[Registration]] = {}
        for registration in ordered:
            by_host.setdefault(registration.host, []).append(registration)
        grouped = [r for group in by_host.values() for r in group]
        places = place_in_order([r.host for r in grouped], [r.address for r in grouped])
        assignments = {r.index: place for r, place in zip(grouped, places, strict=True)}
        self._assignments[found.number] = assignments
        self._round_updates[found.number] = self._updates
        self._round_fresh[found.number] = bool(self._previous_ranks) and not set(assignments) <= set(
            self._previous_ranks
        )
        for old in [n for n in self._assignments if n < found.number - _KEPT_ROUNDS]:
            del self._assignments[old], self._round_updates[old], self._round_fresh[old]
        oldest = min(self._round_updates.values())  # no worker asks about updates before its round's
        for number in [n for n in self._update_results if n <= oldest]:
            del self._update_results[number]
        self._previous_ranks = {index: place.rank for index, place in assignments.items()}
        self._added_ready -= set(assignments)  # in the job now: nothing left to announce about them
        self._open = _OpenRound(found.number + 1, None)

    def _wait_open(self) -> None:
        """Waits (holding the condition) for the open round to change; raises at its deadline or on close."""
        found = self._open
        if self._closed:
            raise RendezvousError("The driver service was stopped before the rendezvous round completed.")
        if self._failure is not None:
            raise RendezvousError(self._failure)
        remaining = None if found.deadline is None else found.deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            self._failure = self._missing_message(found)
            self._condition.notify_all()
            raise RendezvousError(self._failure)
        self._condition.wait(timeout=1.0 if remaining is None else min(remaining, 1.0))

    def _missing_message(self, found: _OpenRound) -> str:
        limit = self._start_timeout if found.number == 0 else self._elastic_timeout
        missing = sorted(set(self._members) - set(found.registrations))
        text = (
            f"Elastic rendezvous round {found.number} did not complete within {limit:g} s: "
            f"{len(found.registrations)} workers registered"
        )
        if missing:
            text += "; waiting for workers " + ", ".join(f"{i} on {self._members[i]}" for i in missing)
        if len(self._members) < self._min_workers:
            text += f"; only {len(self._members)} workers of the {self._min_workers} needed (--min-np) are running"
        hosts = self._describe_hosts()
        return text + (f". Hosts: {hosts}." if hosts else ".")
