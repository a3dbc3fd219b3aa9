"""What ``/proc`` says about a job's processes and connections.

A worker that got SIGSTOP (or SIGTSTP, or sits under a debugger) neither
runs nor exits: its peers time out waiting for it and fail first, each
naming whichever neighbour it was waiting on. The launcher looks here for a
stopped process under each worker it started, to name the real culprit.

A worker waiting in rendezvous holds a connection to the driver service
open until every worker has registered. The launcher counts those
connections to tell a job whose workers wait for one that already exited
(it can never start) from workers that never call ``init`` at all.

Linux only; elsewhere nothing is ever found stopped or connected.
"""

from __future__ import annotations

import os

__all__ = ["connections_to_port", "stopped_process"]

_STOPPED_STATES = ("T", "t")  # stopped by a signal; stopped by a tracer
_TCP_ESTABLISHED = "01"  # the "st" column of /proc/net/tcp


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


def connections_to_port(port: int) -> int:
    """How many established TCP connections this host accepted on local ``port`` (IPv4 and IPv6)."""
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()  # fields[1] is "ADDRESS:PORT" in hex, fields[3] the state
                    if len(fields) > 3 and fields[3] == _TCP_ESTABLISHED:
                        count += int(fields[1].rpartition(":")[2], 16) == port
        except OSError:
            continue
    return count
