"""One worker process of a horarun job: how it is started, its output relay, how it is stopped.

Every worker, local or remote, runs under :mod:`hora.runner.guard`: locally
as ``python .../guard.py COMMAND``, remotely as ``ssh host '... python -m
hora.runner.guard COMMAND'``. The launcher writes the job header (the
secret and, for a remote worker, its environment) as the first line of the
guard's standard input and keeps that pipe open; the worker stops when the
pipe closes, which also happens when the launcher is killed outright. So
neither the secret nor anything else of the environment is on a command
line, and no worker outlives its launcher.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = ["GUARD_GRACE_SECONDS", "Worker", "guard_header", "worker_argv"]

TAIL_LINES = 20
# Not imported: ``python -m hora.runner.guard`` on a remote host imports this package first, and a guard
# module already loaded there would make runpy warn on every worker.
_GUARD = str(Path(__file__).with_name("guard.py"))
# The guard's SIGTERM-to-SIGKILL grace; shorter than the launcher's, so the
# guard has stopped its worker before the launcher gives up on the guard.
GUARD_GRACE_SECONDS = 3.0
# Variables that describe the launching shell rather than the job, and the
# secret, which reaches the guard on its standard input instead.
_NOT_FORWARDED = frozenset(
    {"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "DISPLAY", "HOME", "USER", "LOGNAME", "SHELL", "HORA_SECRET"}
)


def worker_argv(
    command: Sequence[str],
    host: str,
    *,
    local: bool,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
) -> list[str]:
    """The command line that starts one worker under its guard; it holds no environment variable (see guard_header).

    Args:
        command: what the worker runs.
        host: where it runs.
        local: run here, without ssh.
        ssh_port: the remote hosts' ssh port.
        ssh_identity_file: the ssh identity file.
    """
    grace = ["--grace", f"{GUARD_GRACE_SECONDS:g}"]
    if local:
        return [sys.executable, _GUARD, *grace, *command]
    guarded = shlex.join([sys.executable, "-m", "hora.runner.guard", *grace, *command])
    remote = f"cd {shlex.quote(os.getcwd())} && {guarded}"
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"]
    if ssh_port:
        argv += ["-p", str(ssh_port)]
    if ssh_identity_file:
        argv += ["-i", ssh_identity_file]
    return [*argv, host, remote]


def guard_header(secret: bytes, env: Mapping[str, str], *, local: bool) -> bytes:
    """The first line the guard reads (see :mod:`hora.runner.guard`): the secret, and a remote worker's environment.

    A local guard inherits ``env`` from its launcher (as its process environment); a remote one gets it here,
    without the secret's variable and the launching shell's own variables.
    """
    forwarded = {} if local else {name: value for name, value in env.items() if name not in _NOT_FORWARDED}
    return json.dumps({"secret": secret.hex(), "env": forwarded}).encode() + b"\n"


class Worker:
    """One worker process (its guard, or the ssh running its guard) and the threads relaying its output.

    Args:
        rank: the worker's rank, as the driver will assign it.
        slot: the worker's slot index (``HORA_WORKER_INDEX``).
        host: the host it runs on.
        argv: from :func:`worker_argv`.
        env: the environment of the local process (the guard or ssh); any
            ``HORA_SECRET`` in it is left out.
        header: from :func:`guard_header`, sent to the guard on its standard input.
        output_dir: where to keep ``rank.N/{stdout,stderr}``, if anywhere.
        timestamps: start each relayed line with the time it arrived (``time.asctime()``, as horovodrun's
            ``--prefix-output-with-timestamp``).
    """

    def __init__(
        self,
        rank: int,
        slot: int,
        host: str,
        argv: list[str],
        env: Mapping[str, str],
        header: bytes,
        output_dir: Path | None,
        timestamps: bool = False,
    ) -> None:
        self.rank = rank
        self.timestamps = timestamps
        self.slot = slot
        self.host = host
        self.exit_code: int | None = None
        self.exited_at: float | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._tail_lock = threading.Lock()
        self.process = subprocess.Popen(
            argv,
            env={name: value for name, value in env.items() if name != "HORA_SECRET"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # a guard that died at once is reported by its exit code
            self.process.stdin.write(header)
            self.process.stdin.flush()
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
            if self.timestamps:
                prefix = f"{time.asctime()}[{self.rank}]<{name}>:"
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

    def poll(self) -> int | None:
        """The exit code once the process has exited (negative: killed by that signal), remembering when."""
        if self.exit_code is None:
            code = self.process.poll()
            if code is not None:
                self.exit_code, self.exited_at = code, time.monotonic()
        return self.exit_code

    def last_lines(self) -> str:
        with self._tail_lock:
            return "\n".join(self.tail) or "(no output)"

    def stop(self) -> None:
        """Closes the guard's standard input (it stops the worker) and sends SIGTERM to the guard's group."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        """Sends SIGKILL to the guard's group; the kernel then kills the worker (see the guard)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def join_output(self, timeout: float) -> None:
        for pump in self._pumps:
            pump.join(timeout)
