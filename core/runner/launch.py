"""Starting, watching and stopping the worker processes of one job.

The launcher starts the driver service, then one process per slot (a local
subprocess, or ``ssh host command`` for a remote host), each told the
driver's address, the job secret and its slot index through ``HORA_*``
variables. Output lines are relayed with a ``[rank]<stream>:`` prefix. When
a worker exits with an error the others are stopped and the launcher exits
with that worker's code, showing its last lines; Ctrl-C stops every worker.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from hora.driver.service import DriverService
from hora.runner.config import LaunchConfig
from hora.runner.hosts import is_local, slots_for
from hora.settings import interface_address

__all__ = ["launch"]

_TAIL_LINES = 20
_STOP_GRACE_SECONDS = 5.0
# Variables that describe the launching shell rather than the job.
_NOT_FORWARDED = {"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "DISPLAY", "HOME", "USER", "LOGNAME", "SHELL"}


class _Worker:
    """One worker process and the threads relaying its output."""

    def __init__(
        self, rank: int, argv: list[str], env: dict[str, str], output_dir: Path | None, *, guarded: bool
    ) -> None:
        self.rank = rank
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._tail_lock = threading.Lock()
        self.process = subprocess.Popen(
            argv,
            env=env,
            # A guarded (remote) worker stops when this pipe closes; see hora.runner.guard.
            stdin=subprocess.PIPE if guarded else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        logs: dict[str, IO[str] | None] = {"stdout": None, "stderr": None}
        if output_dir is not None:
            rank_dir = output_dir / f"rank.{rank}"
            rank_dir.mkdir(parents=True, exist_ok=True)
            logs = {name: open(rank_dir / name, "w") for name in logs}  # noqa: SIM115 - closed by the pump
        self._pumps = [
            threading.Thread(
                target=self._pump, args=(self.process.stdout, "stdout", sys.stdout, logs["stdout"]), daemon=True
            ),
            threading.Thread(
                target=self._pump, args=(self.process.stderr, "stderr", sys.stderr, logs["stderr"]), daemon=True
            ),
        ]
        for pump in self._pumps:
            pump.start()

    def _pump(self, stream: IO[bytes], name: str, sink: IO[str], log: IO[str] | None) -> None:
        prefix = f"[{self.rank}]<{name}>:"
        sink_open = True
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._tail_lock:
                self.tail.append(f"{prefix}{line}")
            if sink_open:
                try:
                    sink.write(f"{prefix}{line}\n")
                    sink.flush()
                except BrokenPipeError:  # the reader went away (`horarun ... | head`): keep draining the worker
                    sink_open = False
            if log is not None:
                log.write(line + "\n")
                log.flush()
        if log is not None:
            log.close()

    def stop(self) -> None:
        """Closes a guarded worker's stdin and sends SIGTERM to the worker's process group."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        """Sends SIGKILL to the worker's process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def join_output(self, timeout: float) -> None:
        for pump in self._pumps:
            pump.join(timeout)


def _worker_argv(config: LaunchConfig, host: str, env: dict[str, str]) -> list[str]:
    if is_local(host):
        return list(config.command)
    exports = " ".join(
        f"{name}={shlex.quote(value)}"
        for name, value in env.items()
        if name not in _NOT_FORWARDED and name.isidentifier()
    )
    guarded = shlex.join([sys.executable, "-m", "hora.runner.guard", *config.command])
    remote = f"cd {shlex.quote(os.getcwd())} && env {exports} {guarded}"
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"]
    if config.ssh_port:
        argv += ["-p", str(config.ssh_port)]
    if config.ssh_identity_file:
        argv += ["-i", config.ssh_identity_file]
    return [*argv, host, remote]


def _job_env(config: LaunchConfig, driver: tuple[str, int], secret: bytes) -> dict[str, str]:
    env = dict(os.environ)
    env.update(config.env)
    env.update(
        HORA_DRIVER_ADDR=f"{driver[0]}:{driver[1]}",
        HORA_SECRET=secret.hex(),
        HORA_START_TIMEOUT=str(config.start_timeout),
        PYTHONUNBUFFERED="1",
    )
    if config.network_interface:
        env["HORA_NETWORK_INTERFACE"] = config.network_interface
    env.update(config.engine_env)
    return env


def launch(config: LaunchConfig) -> int:
    """Runs the job described by ``config`` and returns its exit code.

    0 when every worker succeeded; otherwise the exit code of the first
    worker that failed (130 after Ctrl-C).
    """
    placement = slots_for(list(config.hosts), config.num_proc)
    all_local = all(is_local(host) for host in placement)
    if config.network_interface:
        driver_host = interface_address(config.network_interface)
    else:
        driver_host = "127.0.0.1" if all_local else "0.0.0.0"
    secret = secrets.token_bytes(32)
    service = DriverService(
        config.num_proc,
        secret,
        host=driver_host,
        start_timeout=config.start_timeout,
        expected_hosts=dict(enumerate(placement)),
    )
    advertised_driver = service.address
    if advertised_driver[0] == "0.0.0.0":
        advertised_driver = (socket.gethostname(), advertised_driver[1])
    output_dir = Path(config.output_filename) if config.output_filename else None
    base_env = _job_env(config, advertised_driver, secret)
    workers: list[_Worker] = []
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with service:
            for index, host in enumerate(placement):
                env = dict(base_env, HORA_WORKER_INDEX=str(index), HORA_HOSTNAME=host)
                if is_local(host) and not config.network_interface:
                    env["HORA_BIND_ADDR"] = "127.0.0.1" if all_local else "0.0.0.0"
                argv = _worker_argv(config, host, env)
                if config.verbose:
                    print(f"horarun: rank {index} on {host}: {shlex.join(argv[:8])}", file=sys.stderr)
                workers.append(_Worker(index, argv, env, output_dir, guarded=not is_local(host)))
            return _supervise(workers)
    except KeyboardInterrupt:
        print("horarun: interrupted; stopping every worker.", file=sys.stderr)
        _stop_all(workers)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        _stop_all(workers)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _supervise(workers: list[_Worker]) -> int:
    running = list(workers)
    while running:
        for worker in list(running):
            code = worker.process.poll()
            if code is None:
                continue
            running.remove(worker)
            if code != 0:
                _stop_all(workers)
                worker.join_output(2.0)
                lines = "\n".join(worker.tail) or "(no output)"
                print(
                    f"horarun: rank {worker.rank} exited with code {code}; stopped the other workers. "
                    f"Last lines of rank {worker.rank}:\n{lines}",
                    file=sys.stderr,
                )
                return code if code > 0 else 128 - code
        time.sleep(0.05)
    for worker in workers:
        worker.join_output(5.0)
    return 0


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop()
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    for worker in workers:
        try:
            worker.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.process.wait(timeout=5)
