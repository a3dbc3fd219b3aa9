"""A dead peer makes every survivor fail fast with HoraInternalError, never hang."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys

import pytest
from hora.driver import DriverService

from tests.conftest import ROOT


def start_workers(
    size: int, argv: list[str], service: DriverService, secret: bytes, timeout: float, transport: str = "auto"
) -> list:
    procs = []
    for index in range(size):
        env = dict(
            os.environ,
            HORA_DRIVER_ADDR=f"{service.address[0]}:{service.address[1]}",
            HORA_SECRET=secret.hex(),
            HORA_WORKER_INDEX=str(index),
            HORA_HOSTNAME="localhost",
            HORA_TIMEOUT=str(timeout),
            HORA_TRANSPORT=transport,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    return procs


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize(("size", "victim"), [(2, 1), (3, 1), (4, 0)])
def test_sigkilled_worker_fails_every_survivor(size: int, victim: int, transport: str) -> None:
    secret = secrets.token_bytes(32)
    timeout = 20.0
    before = shm_entries()
    with DriverService(size, secret, start_timeout=30) as service:
        procs = start_workers(
            size, ["-m", "tests.core.killed_worker", str(victim)], service, secret, timeout, transport
        )
        try:
            outputs = [p.communicate(timeout=90)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
    assert procs[victim].returncode == -9
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        if rank == victim:
            continue
        assert proc.returncode == 0, out
        links = re.search(r"links: (\S+)", out)
        assert links and ("shm" in links.group(1)) == (transport == "auto"), out
        match = re.search(r"HoraInternalError after ([\d.]+) s: (.*)", out)
        assert match, out
        assert float(match.group(1)) < timeout, out  # failed through the closed connection, not the timeout
        assert "lost its connection" in match.group(2), out
    # Shared memory is anonymous: nothing of the job is left in /dev/shm.
    assert shm_entries() <= before
