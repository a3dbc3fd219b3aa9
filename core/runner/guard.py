"""Runs a worker command on a remote host and stops it when the launcher goes away.

ssh without a terminal does not signal the remote command when the local
ssh process dies, so a Ctrl-C on the launcher would leave remote workers
running. The launcher therefore keeps each ssh's standard input open for
the whole job; this guard runs the worker in its own process group and stops
that group as soon as its standard input reaches end-of-file, which happens
when the launcher closes it or dies.

    python -m hora.runner.guard COMMAND [ARGS...]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["main"]

_GRACE_SECONDS = 5.0


def _stop_group(process: subprocess.Popen, grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``argv`` until it exits or standard input closes; returns its exit code."""
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        print("hora.runner.guard: no command given.", file=sys.stderr)
        return 2
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)

    def watch_stdin() -> None:
        while os.read(0, 4096):  # raw reads: no buffer lock held at interpreter exit
            pass
        _stop_group(process, _GRACE_SECONDS)

    threading.Thread(target=watch_stdin, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: _stop_group(process, _GRACE_SECONDS))
    code = process.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
