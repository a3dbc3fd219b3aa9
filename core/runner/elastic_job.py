"""An elastic job, whatever starts its workers: horarun's processes, Ray's actors.

The job keeps as many workers running as the available slots allow, up to
``max_workers``: it asks the host discovery about once a second, starts a
worker on every free slot and dismisses the workers of slots that went away.
The driver service's :class:`~hora.driver.elastic.ElasticRounds` hold who
takes part in each rendezvous round; the workers learn of added or removed
hosts at their next ``state.commit()`` and re-form there (see
:mod:`hora.elastic`). What starts a worker is the launcher's: a function
``start(index, host, place) -> WorkerHandle``, where ``place`` holds the
worker's expected rank variables; :meth:`ElasticJob.contract` gives what the
worker needs to join.

Horovod's semantics: a worker that fails gets its host blacklisted (every
slot of it; its other workers are stopped) and the others restore their last
commit and go on without it. The job fails when a round cannot complete within
the elastic timeout (fewer than ``min_workers``, or a member that never comes
back), when it re-forms more than ``reset_limit`` times, or when every host is
blacklisted for good. It ends when a worker exits with 0: the others are
finishing too (workers still waiting to join are stopped), and it succeeds
once every worker of the last round has exited with 0.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hora.driver.elastic import ElasticRounds, HostUpdateResult
from hora.driver.job import Job
from hora.runner.discovery import HostManager
from hora.runner.failure import how_it_ended
from hora.runner.rank_env import rank_variables

__all__ = ["ElasticJob", "Outcome", "StartWorker", "WorkerHandle"]

# How often the hosts are discovered (Horovod: once a second) and the workers polled.
DISCOVERY_SECONDS = 1.0
_POLL_SECONDS = 0.05
# After a fatal failure, how long the other workers get to end, so the cause is blamed rather than its victims.
_BLAME_GRACE_SECONDS = 1.0
# How long a stopped worker (its host blacklisted, or late once training ended) gets before it is killed.
_KILL_GRACE_SECONDS = 5.0


class WorkerHandle(Protocol):
    """A running worker, as its launcher sees it."""

    def poll(self) -> int | None:
        """Its exit code once it has ended (negative: killed by that signal), else None."""

    def stop(self) -> None:
        """Stops it (it need not have ended when this returns)."""

    def last_lines(self) -> str:
        """Its last lines of output, for a failure's report."""

    # Optionally, ``lost_peer``: whether it failed only because a peer was lost (it is then not blamed), and
    # ``kill()``: stops it for sure, for one that outlived ``stop()`` by a grace period (else stop() is called again).


StartWorker = Callable[[int, str, dict[str, str]], WorkerHandle]
"""``start(index, host, place)``: starts worker ``index`` on ``host``; ``place`` holds its expected rank variables."""


@dataclass
class _Member:
    handle: WorkerHandle
    index: int
    host: str
    dismissed: bool = False
    exit_code: int | None = None
    kill_at: float | None = None  # stopped: when to kill it if it is still running


@dataclass(frozen=True)
class Outcome:
    """How an elastic job ended.

    Attributes:
        exit_code: 0; the failing worker's exit code (negative: a signal); or
            1 when the job could not go on.
        message: why it failed (None on success).
        finished: the indexes of the workers of the last round, which all exited with 0 on success.
        culprit: the handle of the worker blamed for a failure, if any.
    """

    exit_code: int
    message: str | None = None
    finished: tuple[int, ...] = ()
    culprit: WorkerHandle | None = None


@dataclass
class _Members:
    by_index: dict[int, _Member] = field(default_factory=dict)
    indexes: itertools.count = field(default_factory=itertools.count)

    def running(self) -> list[_Member]:
        return [m for m in self.by_index.values() if not m.dismissed and m.exit_code is None]

    def on_host(self, host: str) -> list[_Member]:
        return [m for m in self.running() if m.host == host]


class ElasticJob(Job):
    """One elastic job: a :class:`~hora.driver.job.Job` with rounds, hosts and the workers it keeps running.

    Args:
        discover: the hosts available now and their slots (raises DiscoveryError).
        num_workers: workers needed before training starts.
        min_workers: the fewest workers training may continue with.
        max_workers: the most workers; None: every slot.
        start_timeout: seconds round 0 may take.
        elastic_timeout: seconds to wait for ``min_workers`` or for a round to re-form.
        reset_limit: how many times the job may re-form; None: no limit.
        cooldown_range: ``(min, max)`` seconds a failing host stays blacklisted; None: for good.
        host: the address the driver service listens on.
        report: says what happens (a worker starts, leaves, fails; a host is blacklisted).
        blacklist_failures: blacklist the host of a worker that fails (Horovod's launcher). Otherwise a
            worker killed by a signal only frees its slot, which is filled again (Ray replaces a dead
            actor where resources allow), and one that exits with an error (its function raised) fails
            the job: it would fail again.
    """

    def __init__(
        self,
        discover: Callable[[], dict[str, int]],
        *,
        num_workers: int,
        min_workers: int,
        max_workers: int | None,
        start_timeout: float,
        elastic_timeout: float,
        reset_limit: int | None = None,
        cooldown_range: tuple[int, int] | None = None,
        host: str = "127.0.0.1",
        report: Callable[[str], None] = lambda text: None,
        blacklist_failures: bool = True,
    ) -> None:
        if not 1 <= min_workers <= num_workers or (max_workers is not None and max_workers < num_workers):
            raise ValueError(
                f"Expected 1 <= min_workers <= num_workers <= max_workers, got {min_workers}, {num_workers} and "
                f"{max_workers}."
            )
        self._discover = discover
        self.num_workers, self.min_workers, self.max_workers = num_workers, min_workers, max_workers
        self._report = report
        self._blacklist_failures = blacklist_failures
        self.hosts = HostManager(cooldown_range)
        self.rounds = ElasticRounds(
            min_workers, start_timeout, elastic_timeout, describe_hosts=self.hosts.describe, reset_limit=reset_limit
        )
        super().__init__(num_workers, host=host, start_timeout=start_timeout, elastic_timeout=elastic_timeout,
                         rounds=self.rounds)  # fmt: skip
        self._members = _Members()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Makes :meth:`run` return at its next look (from any thread); the launcher then stops the workers."""
        self._cancelled.set()

    def wait_for_slots(self) -> dict[str, int]:
        """Discovers hosts until they hold ``num_workers`` slots; returns them.

        Raises:
            DiscoveryError: the discovery failed.
            TimeoutError: not enough slots within the elastic timeout.
        """
        deadline = time.monotonic() + self.elastic_timeout
        found = self._discover()
        while sum(found.values()) < self.num_workers:
            if time.monotonic() >= deadline:
                listing = ", ".join(f"{h}:{s}" for h, s in found.items()) or "none"
                raise TimeoutError(
                    f"Timed out waiting for {self.num_workers} slots to become available after "
                    f"{self.elastic_timeout:g} s; discovered: {listing}."
                )
            time.sleep(DISCOVERY_SECONDS)
            found = self._discover()
        self.hosts.update(found)
        return found

    def handle(self, index: int) -> WorkerHandle:
        """The handle of worker ``index``."""
        return self._members.by_index[index].handle

    def handles(self) -> list[WorkerHandle]:
        """Every worker started, in the order started."""
        return [m.handle for m in self._members.by_index.values()]

    def run(self, start: StartWorker) -> Outcome:
        """Starts the workers and watches them and the hosts until the job ends (call :meth:`wait_for_slots` first).

        The driver service must be running (``with job.service:``).
        """
        self._fill(start, quiet=True)
        discovery = _Discovery(self._discover, self._report)
        finishing = False
        short_since: float | None = None
        try:
            while True:
                if self._cancelled.is_set():
                    return Outcome(1, "The job was cancelled; stopped every worker.")
                # A failed round first: its workers exit with its error, which is no fault of their hosts.
                failure = self.rounds.failure()
                if failure is not None:
                    return Outcome(1, f"{failure} Stopped every worker.")
                self._kill_overdue()
                for member in [m for m in self._members.by_index.values() if m.exit_code is None]:
                    code = member.exit_code = member.handle.poll()
                    if code is None:
                        continue
                    if member.dismissed:
                        self.rounds.remove(member.index)
                    elif code == 0:
                        if not finishing:  # the training ended: who waits to join a next round never will
                            trained = self.rounds.current()
                            for waiting in [m for m in self._members.running() if m.index not in trained]:
                                self._dismiss(waiting, stop=True)
                            self.rounds.finish()
                        self.rounds.remove(member.index)  # a peer that re-forms after this must not wait for it
                        finishing = True
                    elif finishing:
                        return self._failed(member, "while the job was finishing")
                    elif code > 0 and not self._blacklist_failures:
                        return self._failed(member, "")
                    else:
                        self._lost(member, code)
                if finishing:
                    if not self._members.running():
                        return self._finished()
                    time.sleep(_POLL_SECONDS)
                    continue
                found = discovery.take()
                update = self.hosts.update(found) if found is not None else HostUpdateResult.no_update
                update |= self._fill(start)
                if update:
                    self.rounds.post_update(update)
                running = self._members.running()
                if len(running) >= self.min_workers:
                    short_since = None
                elif not running and not self.hosts.available() and not self.hosts.may_come_back():
                    return Outcome(1, f"No worker is left and every host is blacklisted ({self.hosts.describe()}).")
                else:
                    short_since = short_since or time.monotonic()
                    if time.monotonic() - short_since > self.elastic_timeout:
                        return Outcome(
                            1,
                            f"Timed out waiting for the minimum number of workers: {self.min_workers} (--min-np) "
                            f"after {self.elastic_timeout:g} s. Hosts: {self.hosts.describe()}.",
                        )
                time.sleep(_POLL_SECONDS)
        finally:
            discovery.stop()

    def _fill(self, start: StartWorker, *, quiet: bool = False) -> HostUpdateResult:
        """Dismisses the workers of slots that went away and starts one on every free slot (up to max_workers)."""
        result = HostUpdateResult.no_update
        available = self.hosts.available()
        leaving = []
        for host in {m.host for m in self._members.running()}:
            leaving += self._members.on_host(host)[available.get(host, 0) :]  # the newest beyond the host's slots
        if self.max_workers is not None:
            leaving += [m for m in self._members.running() if m not in leaving][self.max_workers :]
        for member in leaving:
            self._dismiss(member, stop=False)
            self._report(f"worker {member.index} on {member.host} leaves the job at its next commit (its slot is no "
                         "longer available).")  # fmt: skip
            result |= HostUpdateResult.removed
        total = sum(available.values())
        wanted = total if self.max_workers is None else min(self.max_workers, total)
        started: list[str] = []
        for host, slots in available.items():
            for _ in range(slots - len(self._members.on_host(host))):
                if len(self._members.running()) + len(started) >= wanted:
                    break
                started.append(host)
        if started:
            expected = [m.host for m in self._members.running()] + started
            places = rank_variables(expected)[len(expected) - len(started) :]
            for host, place in zip(started, places, strict=True):
                index = next(self._members.indexes)
                self.rounds.add(index, host)
                self._members.by_index[index] = _Member(start(index, host, place), index, host)
                if not quiet:
                    self._report(f"started worker {index} on {host}; it joins the job at the next commit.")
            result |= HostUpdateResult.added
        return result

    def _dismiss(self, member: _Member, *, stop: bool) -> None:
        member.dismissed = True
        self.rounds.dismiss(member.index)
        if stop:
            member.handle.stop()
            member.kill_at = time.monotonic() + _KILL_GRACE_SECONDS

    def _kill_overdue(self) -> None:
        """Kills the stopped workers that are still running after their grace period (one ignoring SIGTERM)."""
        now = time.monotonic()
        for member in self._members.by_index.values():
            if member.kill_at is not None and now >= member.kill_at and member.exit_code is None:
                member.kill_at = None
                getattr(member.handle, "kill", member.handle.stop)()

    def _lost(self, member: _Member, code: int) -> None:
        """A worker failed: the job goes on without its host (its other workers are stopped), as in Horovod; or,
        without blacklisting, without it alone (its slot is filled again)."""
        self.rounds.remove(member.index)
        member.dismissed = True
        if not self._blacklist_failures:
            self._report(f"worker {member.index} on {member.host} {how_it_ended(code)}; the job goes on without it "
                         "and fills its slot again.")  # fmt: skip
            return
        cooldown = self.hosts.blacklist(member.host)
        for other in self._members.on_host(member.host):
            self._dismiss(other, stop=True)
        how_long = "for good" if cooldown is None else f"for {cooldown:.0f} s"
        self._report(f"worker {member.index} on {member.host} {how_it_ended(code)}; blacklisted {member.host} "
                     f"{how_long}; the job goes on without it.")  # fmt: skip

    def _finished(self) -> Outcome:
        """Every worker of the last round has exited: success if they all exited with 0."""
        last = [m for m in self._members.by_index.values() if not m.dismissed]
        failed = [m for m in last if m.exit_code]
        if failed:
            return self._failed(failed[0], "while the job was finishing")
        return Outcome(0, finished=tuple(m.index for m in last))

    def _failed(self, first: _Member, when: str) -> Outcome:
        """The job cannot go on: blames the cause, not a worker that failed because a peer was lost."""
        deadline = time.monotonic() + _BLAME_GRACE_SECONDS
        while time.monotonic() < deadline and any(m.handle.poll() is None for m in self._members.running()):
            time.sleep(_POLL_SECONDS)
        # Among the workers of the job as it was (not those lost or stopped before), those that failed.
        ended = [m for m in self._members.by_index.values() if (m is first or not m.dismissed)
                 and m.handle.poll() not in (None, 0)]  # fmt: skip
        causes = [m for m in ended if not getattr(m.handle, "lost_peer", False)]
        culprit = first if first in causes or not causes else causes[0]
        culprit.exit_code = culprit.handle.poll()
        assert culprit.exit_code is not None
        return Outcome(
            culprit.exit_code,
            f"worker {culprit.index} on {culprit.host} {how_it_ended(culprit.exit_code)}{' ' + when if when else ''}; "
            "stopped the job.",
            culprit=culprit.handle,
        )


class _Discovery:
    """Runs the discovery in a thread of its own, about once a second; keeps the latest hosts found."""

    def __init__(self, discover: Callable[[], dict[str, int]], report: Callable[[str], None]) -> None:
        self._discover = discover
        self._report = report
        self._lock = threading.Lock()
        self._found: dict[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hora-discovery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(DISCOVERY_SECONDS):
            try:
                found = self._discover()
            except Exception as exc:  # a script's failure, or the cluster manager's (Ray's GCS): keep trying
                if not failing:
                    self._report(f"host discovery failed: {exc} (keeping the hosts found before; retrying)")
                failing = True
                continue
            failing = False
            with self._lock:
                self._found = found

    def take(self) -> dict[str, int] | None:
        """The hosts found since the last call, or None."""
        with self._lock:
            found, self._found = self._found, None
        return found

    def stop(self) -> None:
        self._stop.set()
