"""Shared test helpers: loopback only, and every worker process cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local_spark import local_spark

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def _loopback_environment() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # MLflow would report usage over the network
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


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (2 task slots, loopback only) for the whole test session."""
    pytest.importorskip("pyspark.sql", reason="needs pyspark: pip install 'hora[spark]'")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter, which has hora
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = local_spark("hora-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray (2 CPUs) for the whole test session; shut down at its end, leaving no processes."""
    ray = pytest.importorskip("ray", reason="needs ray: pip install 'hora[ray]'")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", configure_logging=False)
    yield ray
    ray.shutdown()
