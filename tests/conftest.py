"""Shared test helpers: loopback only, and every worker process cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def _loopback_environment() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for name in [n for n in os.environ if n.startswith(("HORA_", "HOROVOD_"))]:
        del os.environ[name]


def horarun(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs horarun with this interpreter and returns the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "hora.runner", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
