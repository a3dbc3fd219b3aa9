"""horarun for an elastic job: workers come and go, training goes on (Horovod's elastic semantics).

The launcher keeps as many workers running as the available slots allow, up
to ``--max-np``: it asks the host discovery (a script, or the fixed ``-H``
hosts) about once a second, starts a worker on every free slot and dismisses
the workers of hosts that went away. The driver service's
:class:`~hora.driver.elastic.ElasticRounds` hold who takes part in each
rendezvous round; the workers learn of added or removed hosts at their next
``state.commit()`` and re-form the job there (see :mod:`hora.elastic`).

A worker that fails gets its host blacklisted (every slot of it; its other
workers are stopped), as in Horovod; the others restore their last commit
and go on without it. The job fails when a round cannot complete within the
elastic timeout (fewer than ``--min-np`` workers, or a member that never
comes back), when it re-forms more than ``--reset-limit`` times, or when
every host is blacklisted for good. It ends when a worker exits with 0: the
others are finishing too, and the job succeeds once every worker of the last
round has exited with 0.

Each worker gets a fresh index, never reused; output lines carry it
(``[index]<stdout>:``). The rank variables a worker starts with
(``HORA_RANK`` ...) are its expected place; ``hora.rank()`` after ``init``
is the truth.
"""

from __future__ import annotations

import itertools
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hora.driver.elastic import ElasticRounds, HostUpdateResult
from hora.driver.service import DriverService
from hora.runner.config import ElasticConfig, LaunchConfig
from hora.runner.discovery import DiscoveryError, HostManager, ScriptDiscovery, fixed_hosts
from hora.runner.failure import how_it_ended, shell_code
from hora.runner.hosts import is_local
from hora.runner.launch import guarded_argv, job_env, stop_workers
from hora.runner.rank_env import rank_variables
from hora.runner.worker import Worker, guard_header
from hora.settings import interface_address

__all__ = ["launch_elastic"]

# How often the hosts are discovered (Horovod: once a second) and the workers polled.
_DISCOVERY_SECONDS = 1.0
_POLL_SECONDS = 0.05


@dataclass
class _Member:
    worker: Worker
    host: str
    dismissed: bool = False


@dataclass
class _Job:
    """What the launcher knows of its workers, and how to start one."""

    start: Callable[[int, str, dict[str, str]], Worker]
    rounds: ElasticRounds
    members: dict[int, _Member] = field(default_factory=dict)
    indexes: itertools.count = field(default_factory=itertools.count)

    def running(self) -> list[_Member]:
        return [m for m in self.members.values() if not m.dismissed and m.worker.exit_code is None]

    def on_host(self, host: str) -> list[_Member]:
        return [m for m in self.running() if m.host == host]


def launch_elastic(config: LaunchConfig, elastic: ElasticConfig) -> int:
    """Runs an elastic job; returns its exit code (0, or the failing worker's, or 1 when the job cannot go on)."""
    discover = (
        ScriptDiscovery(elastic.discovery_script, elastic.slots_per_host)
        if elastic.discovery_script
        else fixed_hosts(config.hosts)
    )
    hosts = HostManager(elastic.cooldown_range)
    try:
        hosts.update(discover())
    except DiscoveryError as exc:
        print(f"horarun: {exc}", file=sys.stderr)
        return 2
    try:
        hosts.update(_wait_for_slots(discover, hosts, config.num_proc, elastic.elastic_timeout))
    except (DiscoveryError, TimeoutError) as exc:
        print(f"horarun: {exc}", file=sys.stderr)
        return 1
    loopback = all(is_local(host) for host in hosts.available()) and not config.network_interface
    if config.network_interface:
        driver_host = interface_address(config.network_interface)
    else:
        driver_host = "127.0.0.1" if loopback else "0.0.0.0"
    secret = secrets.token_bytes(32)
    rounds = ElasticRounds(
        elastic.min_np,
        config.start_timeout,
        elastic.elastic_timeout,
        describe_hosts=hosts.describe,
        reset_limit=elastic.reset_limit,
    )
    service = DriverService(config.num_proc, secret, host=driver_host, start_timeout=config.start_timeout,
                            elastic=rounds)  # fmt: skip
    advertised = service.address
    if advertised[0] == "0.0.0.0":
        advertised = (socket.gethostname(), advertised[1])
    base_env = dict(job_env(config, advertised), HORA_ELASTIC="1", HORA_ELASTIC_TIMEOUT=str(elastic.elastic_timeout))
    output_dir = Path(config.output_filename) if config.output_filename else None

    def start(index: int, host: str, place: dict[str, str]) -> Worker:
        env = dict(base_env, HORA_WORKER_INDEX=str(index), **place)
        if is_local(host) and not config.network_interface:
            env["HORA_BIND_ADDR"] = "127.0.0.1" if loopback else "0.0.0.0"
        header = guard_header(secret, env, local=is_local(host))
        return Worker(index, index, host, guarded_argv(config, host), env, header, output_dir)

    job = _Job(start, rounds)
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with service:
            _fill(job, hosts, elastic.max_np, quiet=True)
            return _supervise(job, hosts, discover, elastic)
    except KeyboardInterrupt:
        print("horarun: interrupted; stopping every worker.", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        stop_workers([m.worker for m in job.members.values()])


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait_for_slots(
    discover: Callable[[], dict[str, int]], hosts: HostManager, needed: int, timeout: float
) -> dict[str, int]:
    """Discovers hosts until they hold ``needed`` slots; raises TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    found = discover()
    while sum(found.values()) < needed:
        if time.monotonic() >= deadline:
            listing = ", ".join(f"{h}:{s}" for h, s in found.items()) or "none"
            raise TimeoutError(
                f"Timed out waiting for {needed} slots (-np) to become available after {timeout:g} s; "
                f"discovered: {listing}."
            )
        time.sleep(_DISCOVERY_SECONDS)
        found = discover()
    return found


def _fill(job: _Job, hosts: HostManager, max_np: int | None, *, quiet: bool = False) -> HostUpdateResult:
    """Dismisses the workers of slots that went away and starts one on every free slot (up to ``max_np``)."""
    result = HostUpdateResult.no_update
    available = hosts.available()
    leaving = []
    for host in {m.host for m in job.running()}:
        leaving += job.on_host(host)[available.get(host, 0) :]  # the newest beyond the host's slots
    staying = [m for m in job.running() if m not in leaving]
    if max_np is not None:
        leaving += staying[max_np:]
    for member in leaving:
        _dismiss(job, member, stop=False)
        print(f"horarun: worker {member.worker.slot} on {member.host} leaves the job at its next commit (its slot is "
              "no longer available).", file=sys.stderr)  # fmt: skip
        result |= HostUpdateResult.removed
    wanted = sum(available.values()) if max_np is None else min(max_np, sum(available.values()))
    started = []
    for host, slots in available.items():
        for _ in range(slots - len(job.on_host(host))):
            if len(job.running()) + len(started) >= wanted:
                break
            started.append(host)
    if started:
        expected = [m.host for m in job.running()] + started
        places = rank_variables(expected)[len(expected) - len(started) :]
        for host, place in zip(started, places, strict=True):
            index = next(job.indexes)
            job.rounds.add(index, host)
            job.members[index] = _Member(job.start(index, host, place), host)
            if not quiet:
                print(f"horarun: started worker {index} on {host}; it joins the job at the next commit.",
                      file=sys.stderr)  # fmt: skip
        result |= HostUpdateResult.added
    return result


def _dismiss(job: _Job, member: _Member, *, stop: bool) -> None:
    member.dismissed = True
    job.rounds.dismiss(member.worker.slot)
    if stop:
        member.worker.stop()


class _Discovery:
    """Runs the discovery in a thread of its own, about once a second; keeps the latest hosts found."""

    def __init__(self, discover: Callable[[], dict[str, int]]) -> None:
        self._discover = discover
        self._lock = threading.Lock()
        self._found: dict[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hora-discovery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(_DISCOVERY_SECONDS):
            try:
                found = self._discover()
            except DiscoveryError as exc:
                if not failing:
                    print(f"horarun: {exc} (keeping the hosts found before; retrying)", file=sys.stderr)
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


def _supervise(job: _Job, hosts: HostManager, discover: Callable[[], dict[str, int]], elastic: ElasticConfig) -> int:
    """Watches the workers and the hosts until the job ends; returns its exit code."""
    discovery = _Discovery(discover)
    finishing = False
    short_since: float | None = None
    try:
        while True:
            # A failed round first: its workers exit with its error, which is no fault of their hosts.
            failure = job.rounds.failure()
            if failure is not None:
                print(f"horarun: {failure} Stopped every worker.", file=sys.stderr)
                return 1
            for member in [m for m in job.members.values() if m.worker.exit_code is None]:
                code = member.worker.poll()
                if code is None:
                    continue
                if member.dismissed:
                    job.rounds.remove(member.worker.slot)
                elif code == 0:
                    if not finishing:  # the training ended: who waits to join a next round never will
                        trained = job.rounds.current()
                        for waiting in [m for m in job.running() if m.worker.slot not in trained]:
                            _dismiss(job, waiting, stop=True)
                    finishing = True
                elif finishing:
                    return _failed(job, member, "while the job was finishing")
                else:
                    _blacklist(job, hosts, member, code)
            if finishing:
                if not job.running():
                    return _finished(job)
                time.sleep(_POLL_SECONDS)
                continue
            found = discovery.take()
            update = hosts.update(found) if found is not None else HostUpdateResult.no_update
            update |= _fill(job, hosts, elastic.max_np)
            if update:
                job.rounds.post_update(update)
            if len(job.running()) >= elastic.min_np:
                short_since = None
            elif not job.running() and not hosts.available() and not hosts.may_come_back():
                print(f"horarun: no worker is left and every host is blacklisted ({hosts.describe()}); stopped the "
                      "job.", file=sys.stderr)  # fmt: skip
                return 1
            else:
                short_since = short_since or time.monotonic()
                if time.monotonic() - short_since > elastic.elastic_timeout:
                    print(f"horarun: timed out waiting for the minimum number of workers: {elastic.min_np} "
                          f"(--min-np) after {elastic.elastic_timeout:g} s. Hosts: {hosts.describe()}.",
                          file=sys.stderr)  # fmt: skip
                    return 1
            time.sleep(_POLL_SECONDS)
    finally:
        discovery.stop()


def _blacklist(job: _Job, hosts: HostManager, member: _Member, code: int) -> None:
    """A worker failed: the job goes on without its host (its other workers are stopped), as in Horovod."""
    job.rounds.remove(member.worker.slot)
    member.dismissed = True
    cooldown = hosts.blacklist(member.host)
    for other in job.on_host(member.host):
        _dismiss(job, other, stop=True)
    how_long = "for good" if cooldown is None else f"for {cooldown:.0f} s"
    print(f"horarun: worker {member.worker.slot} on {member.host} {how_it_ended(code)}; blacklisted {member.host} "
          f"{how_long}; the job goes on without it.", file=sys.stderr)  # fmt: skip


def _finished(job: _Job) -> int:
    """Every worker of the last round has exited: 0 if they all succeeded."""
    for member in job.members.values():
        member.worker.join_output(5.0)
    failed = [m for m in job.members.values() if not m.dismissed and m.worker.exit_code]
    if failed:
        return _failed(job, failed[0], "while the job was finishing")
    return 0


def _failed(job: _Job, culprit: _Member, when: str) -> int:
    stop_workers([m.worker for m in job.members.values()])
    code = culprit.worker.exit_code
    assert code is not None
    culprit.worker.join_output(2.0)
    print(f"horarun: worker {culprit.worker.slot} on {culprit.host} {how_it_ended(code)} {when}; stopped the job. "
          f"Last lines:\n{culprit.worker.last_lines()}", file=sys.stderr)  # fmt: skip
    return shell_code(code)
