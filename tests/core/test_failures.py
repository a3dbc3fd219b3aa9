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


def start_workers(size: int, argv: list[str], service: DriverService, secret: bytes, timeout: float) -> list:
    procs = []
    for index in range(size):
        env = dict(
            os.environ,
            HORA_DRIVER_ADDR=f"{service.address[0]}:{service.address[1]}",
            HORA_SECRET=secret.hex(),
            HORA_WORKER_INDEX=str(index),
            HORA_HOSTNAME="localhost",
            HORA_TIMEOUT=str(timeout),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    return procs


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("size", "victim"), [(2, 1), (3, 1), (4, 0)])
def test_sigkilled_worker_fails_every_survivor(size: int, victim: int) -> None:
    secret = secrets.token_bytes(32)
    timeout = 20.0
    with DriverService(size, secret, start_timeout=30) as service:
        procs = start_workers(size, ["-m", "tests.core.killed_worker", str(victim)], service, secret, timeout)
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
        match = re.search(r"HoraInternalError after ([\d.]+) s: (.*)", out)
        assert match, out
        assert float(match.group(1)) < timeout, out  # failed through the closed connection, not the timeout
        assert "lost its connection" in match.group(2), out
