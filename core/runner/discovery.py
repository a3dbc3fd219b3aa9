"""Where an elastic job may run: host discovery and the blacklist, as in Horovod.

A host discovery script prints one available host per line, ``host`` or
``host:slots``; horarun runs it about once a second. Fixed hosts (``-H``)
are a discovery that never changes. A host whose worker fails is
blacklisted (every slot of it); with ``--blacklist-cooldown-range MIN MAX``
it comes back after a cooldown that doubles each time it is blacklisted again
(never shorter than MIN, never longer than MAX seconds), otherwise never.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hora.driver.elastic import HostUpdateResult
from hora.runner.hosts import HostSlots

__all__ = ["DiscoveryError", "HostManager", "ScriptDiscovery"]

# Seconds the discovery script may run before its call counts as failed.
_SCRIPT_TIMEOUT_SECONDS = 30.0


class DiscoveryError(RuntimeError):
    """The host discovery script failed or printed something that is not a host list."""


class ScriptDiscovery:
    """Runs a host discovery script and parses what it prints.

    Args:
        script: the command (run by the shell, as Horovod does).
        default_slots: the slots of a host printed without ``:slots``.
    """

    def __init__(self, script: str, default_slots: int) -> None:
        self.script = script
        self.default_slots = default_slots

    def __call__(self) -> dict[str, int]:
        """The hosts available now and their slots, in the order printed.

        Raises:
            DiscoveryError: the script failed, timed out or printed a bad line.
        """
        try:
            done = subprocess.run(
                self.script, shell=True, capture_output=True, text=True, timeout=_SCRIPT_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired:
            raise DiscoveryError(
                f"The host discovery script {self.script!r} did not finish within {_SCRIPT_TIMEOUT_SECONDS:g} s."
            ) from None
        if done.returncode != 0:
            raise DiscoveryError(
                f"The host discovery script {self.script!r} failed with exit code {done.returncode}: "
                f"{done.stderr.strip()[-500:] or '(no output on stderr)'}"
            )
        return parse_discovered(done.stdout, self.default_slots, self.script)


def parse_discovered(text: str, default_slots: int, source: str) -> dict[str, int]:
    """Parses ``host`` / ``host:slots`` lines (blank lines skipped; a host listed twice keeps its last slots)."""
    hosts: dict[str, int] = {}
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        host, sep, slots = line.partition(":")
        if not host or (sep and not slots.isdigit()) or (sep and int(slots) < 1):
            raise DiscoveryError(f"{source} printed {line!r}; expected 'host' or 'host:slots' with slots >= 1.")
        hosts[host] = int(slots) if sep else default_slots
    return hosts


def fixed_hosts(hosts: tuple[HostSlots, ...]) -> Callable[[], dict[str, int]]:
    """A discovery that always finds ``hosts`` (``-H`` or a hostfile in an elastic job)."""
    found = {h.host: h.slots for h in hosts}
    return lambda: dict(found)


@dataclass
class _Host:
    slots: int = 0
    present: bool = False
    blacklisted: bool = False
    times_blacklisted: int = 0
    cooldown_ends: float | None = None  # None while blacklisted: forever


class HostManager:
    """The hosts an elastic job knows, in the order first seen, and which are blacklisted.

    Args:
        cooldown_range: ``(min, max)`` seconds a blacklisted host stays out,
            or None to keep it out for good.
        clock: the time source (for tests).
    """

    def __init__(
        self, cooldown_range: tuple[int, int] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if cooldown_range is not None:
            low, high = cooldown_range
            if not 1 <= low <= high <= 3600:
                raise ValueError(f"--blacklist-cooldown-range {low} {high}: expected 1 <= MIN <= MAX <= 3600 seconds.")
        self._cooldown_range = cooldown_range
        self._clock = clock
        self._hosts: dict[str, _Host] = {}
        # The launcher's thread updates the hosts; the driver's threads describe them in a failed round's message.
        self._lock = threading.Lock()

    def update(self, found: dict[str, int]) -> HostUpdateResult:
        """Takes the hosts discovered now; says what changed among the hosts the job may use."""
        with self._lock:
            return self._update(found)

    def _update(self, found: dict[str, int]) -> HostUpdateResult:
        before = self._available()
        now = self._clock()
        for host in self._hosts.values():
            host.present = False
        for name, slots in found.items():
            host = self._hosts.setdefault(name, _Host())
            host.slots, host.present = slots, True
        for host in self._hosts.values():
            if host.blacklisted and host.cooldown_ends is not None and now >= host.cooldown_ends:
                host.blacklisted, host.cooldown_ends = False, None
        after = self._available()
        result = HostUpdateResult.no_update
        for name, slots in before.items():
            if after.get(name, 0) < slots:
                result |= HostUpdateResult.removed
        for name, slots in after.items():
            if before.get(name, 0) < slots:
                result |= HostUpdateResult.added
        return result

    def available(self) -> dict[str, int]:
        """The hosts discovered now and not blacklisted, with their slots, oldest first."""
        with self._lock:
            return self._available()

    def _available(self) -> dict[str, int]:
        return {name: h.slots for name, h in self._hosts.items() if h.present and not h.blacklisted}

    def blacklist(self, name: str) -> float | None:
        """Blacklists a host; returns its cooldown in seconds, or None when it stays out for good."""
        with self._lock:
            return self._blacklist(name)

    def _blacklist(self, name: str) -> float | None:
        host = self._hosts.setdefault(name, _Host())
        host.blacklisted = True
        host.times_blacklisted += 1
        if self._cooldown_range is None:
            host.cooldown_ends = None
            return None
        low, high = self._cooldown_range
        delay = low * (1 << host.times_blacklisted) + random.uniform(0, 1) * low
        cooldown = max(low, min(high, delay))
        host.cooldown_ends = self._clock() + cooldown
        return cooldown

    def may_come_back(self) -> bool:
        """Whether any blacklisted host will come back after its cooldown."""
        with self._lock:
            return any(h.blacklisted and h.cooldown_ends is not None for h in self._hosts.values())

    def describe(self) -> str:
        """The hosts for a message: ``a:2, b:1 (blacklisted), c:1 (not discovered)``."""
        with self._lock:
            hosts = list(self._hosts.items())
        parts = []
        for name, host in hosts:
            note = ""
            if host.blacklisted:
                note = " (blacklisted)" if host.cooldown_ends is None else " (blacklisted, cooling down)"
            elif not host.present:
                note = " (no longer discovered)"
            parts.append(f"{name}:{host.slots}{note}")
        return ", ".join(parts) or "none discovered"
