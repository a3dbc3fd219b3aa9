"""Runs one worker command and stops it when the launcher goes away.

Every worker of ``horarun``, local or remote, runs under this guard:

    python -m hora.runner.guard [--grace SECONDS] COMMAND [ARGS...]

The launcher talks to the guard over the guard's standard input only:

1. The first line is the job secret in hex (an empty line for none). The
   guard puts it into COMMAND's environment as ``HORA_SECRET``. The secret
   travels this way, not on a command line, because any local user can read
   every process's arguments (``ps``, ``/proc/<pid>/cmdline``); a process's
   environment is readable only by its owner.
2. Then the launcher keeps standard input open for the whole job. End-of-file
   means the launcher closed it or died (even by SIGKILL, which it cannot
   catch), and the guard stops COMMAND: SIGTERM to its process group, then
   SIGKILL after ``--grace`` seconds. ssh without a terminal does not signal a
   remote command when the local ssh dies, and a local child outlives a
   killed parent, so this pipe is the one signal that always arrives.

COMMAND runs in its own process group (so the guard can stop all of it) and
with ``PR_SET_PDEATHSIG`` on Linux, so that even a guard killed outright
takes its worker along. The guard exits as COMMAND did: with its exit code,
or killed by the same signal, so the launcher can tell a crash from an error.

This file imports nothing from Hora: a launcher runs it by path, which is
faster than importing the package in every worker's guard.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["main"]

DEFAULT_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _stop_group(process: subprocess.Popen, grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            if sig == signal.SIGTERM:  # a stopped process handles SIGTERM only once it runs again
                os.killpg(process.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel to SIGKILL it when the guard dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _read_header() -> str | None:
    """The first line of standard input, or None when it closed before a whole line came."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 4096)  # raw reads: nothing buffered that the watcher would miss
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0].decode().strip()


def _exit_like(code: int) -> int:
    """Returns ``code`` for an exit; for a death by signal, dies of the same signal (without a core)."""
    if code >= 0:
        return code
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's action cannot be set, nor needs to be
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    return 128 - code  # for a signal whose default action is not to end the process


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command in ``argv`` until it exits or standard input closes; returns its exit code."""
    command = list(sys.argv[1:] if argv is None else argv)
    grace = DEFAULT_GRACE_SECONDS
    if command[:1] == ["--grace"] and len(command) > 1:
        grace, command = float(command[1]), command[2:]
    if not command:
        print("hora.runner.guard: no command given.", file=sys.stderr)
        return 2
    secret = _read_header()
    if secret is None:
        print("hora.runner.guard: the launcher closed standard input before the job header; not starting.",
              file=sys.stderr)  # fmt: skip
        return 1
    env = dict(os.environ)
    if secret:
        env["HORA_SECRET"] = secret
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent
    )

    stopping = threading.Lock()

    def stop() -> None:
        # Once, and never on the main thread: its process.wait() holds the lock a waiting stopper needs.
        if stopping.acquire(blocking=False):
            threading.Thread(target=_stop_group, args=(process, grace), daemon=True).start()

    def watch_stdin() -> None:
        while os.read(0, 4096):
            pass
        stop()

    threading.Thread(target=watch_stdin, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop())
    return _exit_like(process.wait())


if __name__ == "__main__":
    sys.exit(main())
