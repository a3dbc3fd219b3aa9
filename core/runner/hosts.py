"""Host lists (``-H a:2,b:2`` and hostfiles) and the slots they give."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostSlots", "is_local", "parse_hostfile", "parse_hosts", "slots_for"]


@dataclass(frozen=True)
class HostSlots:
    """A host and how many processes it may run."""

    host: str
    slots: int


def parse_hosts(text: str) -> list[HostSlots]:
    """Parses ``host:slots,host:slots`` (slots default to 1)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, _, slots = item.partition(":")
        if not host or (slots and not slots.isdigit()) or slots == "0":
            raise ValueError(f"Bad host entry {item!r} in {text!r}; expected host or host:slots with slots >= 1.")
        hosts.append(HostSlots(host, int(slots) if slots else 1))
    if not hosts:
        raise ValueError(f"No hosts in {text!r}; expected host:slots[,host:slots...].")
    return hosts


def parse_hostfile(path: str) -> list[HostSlots]:
    """Parses a hostfile: one ``host slots=N`` (or ``host:N``) per line, ``#`` comments."""
    hosts = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+?)(?::(\d+)|\s+slots\s*=\s*(\d+))?", line)
        if not match:
            raise ValueError(f"{path}:{number}: cannot parse {raw!r}; expected 'host slots=N' or 'host:N'.")
        slots = int(match.group(2) or match.group(3) or 1)
        hosts.append(HostSlots(match.group(1), slots))
    if not hosts:
        raise ValueError(f"The hostfile {path} lists no hosts.")
    return hosts


def slots_for(hosts: list[HostSlots], num_proc: int) -> list[str]:
    """Returns the host of each of ``num_proc`` slots, filling hosts in order."""
    total = sum(h.slots for h in hosts)
    if num_proc > total:
        listing = ",".join(f"{h.host}:{h.slots}" for h in hosts)
        raise ValueError(f"-np {num_proc} asks for more processes than the {total} slots of {listing}.")
    placed: list[str] = []
    for h in hosts:
        placed.extend([h.host] * min(h.slots, num_proc - len(placed)))
    return placed


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine (so no ssh is needed)."""
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())
