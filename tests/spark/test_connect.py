"""``hora.spark.run`` and the estimators on a real local Spark Connect server, in a process of their own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# Spark Connect's client needs grpcio (in hora[spark]; the legacy Spark 3.5 stack has none, and skips this).
pytest.importorskip("grpc", reason="needs Spark Connect's dependencies: pip install 'hora[spark]'")


@pytest.mark.timeout(420)
def test_spark_connect_cases() -> None:
    # A process holds either a classic SparkSession (this one's) or a local Connect one: the cases run apart.
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-m", "tests.spark.connect_cases"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=400)  # fmt: skip
    summary = re.search(r"connect: (\d+) of (\d+) cases passed", result.stdout)
    assert summary is not None and result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert summary.group(1) == summary.group(2) == "6", result.stdout[-3000:]
