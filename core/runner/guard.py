"""Runs one worker command and stops it when the launcher goes away.

Every worker of ``horarun``, local or remote, runs under this guard:

    python -m hora.runner.guard [--grace SECONDS] COMMAND [ARGS...]

The launcher talks to the guard over the guard's standard input only:

1. The first line is the job header, a JSON object: ``secret``, the job
   secret in hex (empty for none), which the guard puts into COMMAND's
   environment as ``HORA_SECRET``, and ``env``, variables to set in it (a
   remote worker gets the launcher's environment this way). Both travel
   here, not on a command line, because any local user can read every
   process's arguments (``ps``, ``/proc/<pid>/cmdline``); a process's
   environment is readable only by its owner, and the launcher's may hold
   other secrets (cloud credentials) besides the job's.
2. Then the launcher keeps standard input open for the whole job. End-of-file
   means the launcher closed it or died (even by SIGKILL, which it cannot
   catch), and the guard stops COMMAND: SIGTERM to its process group, then
   SIGKILL to whatever is left of the group after ``--grace`` seconds (even
   if COMMAND itself exited at once: what it started may ignore SIGTERM). ssh without a terminal does not signal a
   remote command when the local ssh dies, and a local child outlives a
   killed parent, so this pipe is the one signal that always arrives.

COMMAND runs in its own process group (so the guard can stop all of it) and
with ``PR_SET_PDEATHSIG`` on Linux, so that even a guard killed outright
takes its worker along. With ``HORA_BIND_CORES=1`` in its environment
(``horarun --bind-cores``), COMMAND runs bound to its local rank's share of
the cores the guard may use (:func:`share_of_cores`), and so does every
thread it starts. The guard exits as COMMAND did: with its exit code,
or killed by the same signal, so the launcher can tell a crash from an error.

This file imports nothing from Hora: a launcher runs it by path, which is
faster than importing the package in every worker's guard.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["main", "share_of_cores"]

DEFAULT_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _stop_group(group: int, grace: float) -> None:
    """SIGTERM to the worker's process group, then, ``grace`` seconds later, SIGKILL to whatever is left of it.

    The group, not the direct child: what the worker started (DataLoader
    workers, the children of ``sh -c``) is in it too, and may ignore SIGTERM
    or outlive a child that exits at once. The group is polled, not the
    child waited for: the main thread waits for the child.
    """
    try:
        os.killpg(group, signal.SIGTERM)
        os.killpg(group, signal.SIGCONT)  # a stopped process handles SIGTERM only once it runs again
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return  # every member is gone
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def _die_with_parent(guard: int) -> None:
    """Runs in the child before exec: ask the kernel to SIGKILL it when the guard dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The request covers only deaths from now on: a guard that died between fork and prctl left this child
    # to init (or a subreaper), and nobody would stop it.
    if os.getppid() != guard:
        os._exit(1)


def share_of_cores(allowed: Sequence[int], local_rank: int, local_size: int) -> list[int]:
    """The cores of local rank ``local_rank`` of ``local_size`` when they split the ``allowed`` cores.

    Each rank gets ``len(allowed) // local_size`` consecutive cores of the sorted
    list (what is left over goes unused, so that every rank gets the same);
    with more ranks than cores, rank ``r`` gets core ``r mod len(allowed)``
    alone, as MPI launchers bind an oversubscribed host.
    """
    cores = sorted(allowed)
    if not cores or not 0 <= local_rank < local_size:
        raise ValueError(f"No share of cores {cores} for local rank {local_rank} of {local_size}.")
    share = len(cores) // local_size
    if share == 0:
        return [cores[local_rank % len(cores)]]
    return cores[local_rank * share : (local_rank + 1) * share]


def _bound_cores(env: dict[str, str]) -> list[int] | None:
    """The cores COMMAND is to be bound to under ``HORA_BIND_CORES`` (None: not bound); ValueError, quoting
    the value, for a setting it cannot follow."""
    # hora._env.flag's values and message: this file imports nothing from Hora (see above).
    setting = env.get("HORA_BIND_CORES", "").strip().lower()
    if setting in ("", "0", "false", "no", "off"):
        return None
    if setting not in ("1", "true", "yes", "on"):
        raise ValueError(
            f"HORA_BIND_CORES={env['HORA_BIND_CORES']!r} is not a boolean; expected 1/0, true/false, yes/no or on/off."
        )
    try:
        local_rank, local_size = int(env["HORA_LOCAL_RANK"]), int(env["HORA_LOCAL_SIZE"])
    except (KeyError, ValueError) as error:
        raise ValueError(f"HORA_BIND_CORES needs the worker's HORA_LOCAL_RANK and HORA_LOCAL_SIZE ({error}).") from None
    return share_of_cores(list(os.sched_getaffinity(0)), local_rank, local_size)


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
    line = _read_header()
    if line is None:
        print("hora.runner.guard: the launcher closed standard input before the job header; not starting.",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        header = json.loads(line)
        env = dict(os.environ, **{str(name): str(value) for name, value in header.get("env", {}).items()})
        secret = str(header.get("secret", ""))
    except (ValueError, AttributeError) as error:
        print(f"hora.runner.guard: the job header is not a JSON object with 'secret' and 'env' ({error}); "
              "the launcher and this host may run different Hora versions. Not starting.", file=sys.stderr)  # fmt: skip
        return 1
    if secret:
        env["HORA_SECRET"] = secret
    try:
        cores = _bound_cores(env)
        if cores is not None:
            os.sched_setaffinity(0, cores)  # the guard's own, which COMMAND and all its threads inherit
    except (ValueError, OSError) as error:
        print(f"hora.runner.guard: {error} Not starting.", file=sys.stderr)
        return 1
    process = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
    )

    stopping = threading.Lock()
    stoppers: list[threading.Thread] = []

    def stop() -> None:
        # Once, and never on the main thread: a signal handler runs there, between the main thread's steps.
        if stopping.acquire(blocking=False):
            stopper = threading.Thread(target=_stop_group, args=(process.pid, grace), daemon=True)
            stoppers.append(stopper)
            stopper.start()

    def watch_stdin() -> None:
        while os.read(0, 4096):
            pass
        stop()

    threading.Thread(target=watch_stdin, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop())
    code = process.wait()
    for stopper in list(stoppers):  # the child is gone, but the rest of its group may still need the SIGKILL
        stopper.join(grace + 5.0)
    return _exit_like(code)


if __name__ == "__main__":
    sys.exit(main())
