"""What ``/proc`` says about a job's processes.

A worker that got SIGSTOP (or SIGTSTP, or sits under a debugger) neither
runs nor exits: its peers time out waiting for it and fail first, each
naming whichever neighbour it was waiting on. The launcher looks here for a
stopped process under each worker it started, to name the real culprit.

Linux only; elsewhere nothing is ever found stopped.
"""

from __future__ import annotations

import os

__all__ = ["stopped_process"]

_STOPPED_STATES = ("T", "t")  # stopped by a signal; stopped by a tracer


def _process_table() -> dict[int, tuple[int, str]]:
    """``pid -> (parent pid, state)`` of every process we can read."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:  # it exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = text.rpartition(")")[2].split()
        if len(fields) >= 2:
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


def stopped_process(root: int) -> tuple[int, str] | None:
    """The first stopped process among ``root`` and its descendants, as ``(pid, state)``; None if none is."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    pending = [root]
    while pending:
        pid = pending.pop(0)
        state = table.get(pid, (0, ""))[1]
        if state in _STOPPED_STATES:
            return pid, state
        pending.extend(sorted(children.get(pid, ())))
    return None
