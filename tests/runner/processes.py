"""Helpers of the launcher tests: wait for worker pids, check that they are gone, clean them up."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def wait_for_pids(path: Path, count: int, timeout: float = 30.0) -> list[int]:
    """The pids that workers append to ``path``, once there are ``count`` of them (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (not path.exists() or len(path.read_text().split()) < count):
        time.sleep(0.1)
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def assert_gone(pids: list[int], within: float = 15.0) -> None:
    """Fails unless every pid has exited within ``within`` seconds."""
    deadline = time.monotonic() + within
    still = pids
    while still and time.monotonic() < deadline:
        still = [pid for pid in still if alive(pid)]
        time.sleep(0.1)
    assert not still, f"workers still running {within:g} s later: {still}"


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILLs whichever of ``pids`` still run: a test's cleanup, whatever happened."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
