"""Starting, watching and stopping the worker processes of one job.

The launcher starts the driver service, then one process per slot (see
:mod:`hora.runner.worker`: every worker runs under a guard, locally or over
ssh), each told the driver's address, its slot index and its place in the
job (``HORA_RANK`` ... and the ``HOROVOD_*`` names) through its environment;
the job secret reaches it on the guard's standard input. Output lines are
relayed with a ``[rank]<stream>:`` prefix.

When a worker fails, the others get a short grace period to show whether
someone else caused it (see :mod:`hora.runner.failure`); then every worker is
stopped and the launcher exits with the culprit's code, showing its last
lines. A worker that exits (with any code) before its slot registered with
the driver service, while others wait in rendezvous, fails the job at once
instead of at the start timeout: the service says which slots registered.
Ctrl-C stops every worker.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hora.driver.job import Job
from hora.driver.service import DriverService
from hora.runner.config import LaunchConfig
from hora.runner.failure import Diagnosis, diagnose, exited_unregistered, how_it_ended
from hora.runner.hosts import is_local, slots_for
from hora.runner.rank_env import rank_variables
from hora.runner.worker import Worker, guard_header, worker_argv
from hora.settings import interface_address

__all__ = ["guarded_argv", "job_env", "launch", "listen_addresses", "stop_workers"]

_STOP_GRACE_SECONDS = 5.0
# After the first failure, how long the other workers get to fail or be found stopped.
_DIAGNOSIS_GRACE_SECONDS = 1.0


def guarded_argv(config: LaunchConfig, host: str) -> list[str]:
    """The command line of the worker on ``host``; it holds neither the job secret nor any other variable."""
    return worker_argv(
        config.command,
        host,
        local=is_local(host),
        ssh_port=config.ssh_port,
        ssh_identity_file=config.ssh_identity_file,
    )


def job_env(config: LaunchConfig) -> dict[str, str]:
    """The environment every worker shares, besides the job contract (:class:`~hora.driver.contract.WorkerEnv`).

    The secret is not in it: it goes over the guard's standard input.
    """
    env = {name: value for name, value in os.environ.items() if name != "HORA_SECRET"}
    env.update(config.env)
    env["PYTHONUNBUFFERED"] = "1"
    if config.network_interface:
        env["HORA_NETWORK_INTERFACE"] = config.network_interface
    if config.bind_cores:
        env["HORA_BIND_CORES"] = "1"  # the guard binds (hora.runner.guard)
    env.update(config.engine_env)
    return env


def listen_addresses(config: LaunchConfig, hosts: Sequence[str]) -> tuple[str, str | None]:
    """Where the job's driver service listens, and the address every worker's peer listener binds.

    With ``--network-interface``: the driver on that interface's address here, and each worker on
    its own host's address of that interface (None: the worker resolves it, from
    ``HORA_NETWORK_INTERFACE``). Otherwise loopback when every host is this one for good (fixed
    hosts, all local), else every address (the workers then advertise their host name): hosts that a
    discovery script adds later must reach the driver and the workers already there.
    """
    if config.network_interface:
        return interface_address(config.network_interface), None
    discovered = config.elastic is not None and config.elastic.discovery_script is not None
    address = "127.0.0.1" if hosts and not discovered and all(is_local(host) for host in hosts) else "0.0.0.0"
    return address, address


def launch(config: LaunchConfig) -> int:
    """Runs the job described by ``config`` and returns its exit code.

    0 when every worker succeeded; otherwise the exit code of the worker
    blamed for the failure (128 + N when signal N killed it; 130 after Ctrl-C).
    """
    placement = slots_for(list(config.hosts), config.num_proc)
    driver_host, bind = listen_addresses(config, placement)
    job = Job(config.num_proc, host=driver_host, start_timeout=config.start_timeout,
              expected_hosts=dict(enumerate(placement)))  # fmt: skip
    advertised_driver = job.service.address
    if advertised_driver[0] == "0.0.0.0":
        advertised_driver = (socket.gethostname(), advertised_driver[1])
    output_dir = Path(config.output_filename) if config.output_filename else None
    base_env = job_env(config)
    workers: list[Worker] = []
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with job.service:
            for index, (host, place) in enumerate(zip(placement, rank_variables(placement), strict=True)):
                env = dict(base_env, **job.contract(index, place, driver=advertised_driver, bind=bind).to_env())
                argv = guarded_argv(config, host)
                rank = int(place["HORA_RANK"])  # the slot index, unless a host is listed twice
                if config.verbose:
                    print(f"horarun: rank {rank} on {host}: {shlex.join(argv[:8])}", file=sys.stderr)
                header = guard_header(job.secret, env, local=is_local(host))
                workers.append(
                    Worker(rank, index, host, argv, env, header, output_dir, config.prefix_output_with_timestamp)
                )
            return _supervise(workers, job.service)
    except KeyboardInterrupt:
        print("horarun: interrupted; stopping every worker.", file=sys.stderr)
        stop_workers(workers)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        stop_workers(workers)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _supervise(workers: list[Worker], service: DriverService) -> int:
    while True:
        for worker in workers:
            worker.poll()
        # Read after polling: a worker seen to have exited made its registration (if any) before it exited.
        # The latest round is the one workers may be waiting in (shutdown() then init() opens the next); if a
        # newer one starts between the two calls, the one read here has filled and reports every slot.
        registered = service.registered(service.latest_round())
        gone = sorted((w for w in workers if w.exit_code is not None), key=lambda w: w.exited_at or 0.0)
        # Workers that never call init (`horarun -np 2 hostname`) may exit in any order; but once a worker
        # waits in rendezvous, one that exited without registering in that round means it can never fill.
        unregistered = [w for w in gone if w.slot not in registered]
        if registered and unregistered:
            return _report(workers, exited_unregistered(unregistered[0]), unregistered[0])
        failed = [w for w in gone if w.exit_code]
        if failed:
            return _fail(workers, failed[0])
        if len(gone) == len(workers):
            break
        time.sleep(0.05)
    for worker in workers:
        worker.join_output(5.0)
    return 0


def _fail(workers: list[Worker], first: Worker) -> int:
    """Blames the right worker for the failure that ``first`` reported, stops every worker, says why."""
    deadline = time.monotonic() + _DIAGNOSIS_GRACE_SECONDS
    while time.monotonic() < deadline and any(worker.poll() is None for worker in workers):
        time.sleep(0.05)
    diagnosis = diagnose(workers, first)  # before _report stops them: stopping kills a stopped worker
    return _report(workers, diagnosis, first)


def _report(workers: list[Worker], diagnosis: Diagnosis, first: Worker) -> int:
    """Stops every worker and says who is to blame (and who failed first, if someone else); returns the exit code."""
    stop_workers(workers)
    culprit = diagnosis.culprit
    culprit.join_output(2.0)
    text = f"horarun: rank {culprit.rank} {diagnosis.what}; stopped the other workers."
    if culprit is not first:
        assert first.exit_code is not None
        first.join_output(2.0)
        text += f" Rank {first.rank} was the first to fail: it {how_it_ended(first.exit_code)}."
    text += f" Last lines of rank {culprit.rank}:\n{culprit.last_lines()}"
    if culprit is not first:
        text += f"\nLast lines of rank {first.rank}:\n{first.last_lines()}"
    print(text, file=sys.stderr)
    return diagnosis.exit_code


def stop_workers(workers: list[Worker]) -> None:
    """Stops every worker: closes its guard's stdin and sends SIGTERM, then SIGKILL to those still there after 5 s."""
    for worker in workers:
        worker.stop()
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for worker in workers:
        try:
            worker.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.process.wait(timeout=5)
