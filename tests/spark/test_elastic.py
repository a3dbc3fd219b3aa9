"""hora.spark.run_elastic: a task's Python worker dies, Spark retries it, and training goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.elastic import linear

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("session", ["classic", "connect"])
def test_a_killed_task_is_retried_and_rejoins_while_the_others_go_on_from_their_last_commit(session: str) -> None:
    pytest.importorskip("pyspark")
    if session == "connect":
        pytest.importorskip("grpc", reason="needs Spark Connect's dependencies: pip install 'hora[spark]'")
    # Its own Spark (the shared session does not retry tasks), in a process of its own.
    argv = [sys.executable, "-m", "tests.spark.elastic_cases", *(["--connect"] if session == "connect" else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=200, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    results = json.loads(lines[0][len("RESULT ") :])
    assert len(results) == 3 and all(r == results[0] for r in results)  # the retried task is back
    # Three workers, two after the kill (the fifth step lost and taken again), three once the retry joined.
    assert results[0]["sizes"] == [3, 2, 3] and results[0]["steps"] == 16 and results[0]["pair"] == 1
    np.testing.assert_allclose(results[0]["weights"], linear.reference(), rtol=1e-9)


def test_bad_arguments_are_refused_quoting_them(spark) -> None:
    import hora.spark

    with pytest.raises(ValueError, match=r"expected min_np <= num_proc <= max_np, got 3, 2 and 2"):
        hora.spark.run_elastic(print, num_proc=2, min_np=3, spark=spark)
    with pytest.raises(ValueError, match="num_proc must be a positive integer, got 0"):
        hora.spark.run_elastic(print, num_proc=0, spark=spark)


def test_horovods_aliases_must_agree() -> None:
    pytest.importorskip("pyspark")
    import hora.spark

    with pytest.raises(ValueError, match=r"min_np=2 and Horovod's min_num_proc=3 differ"):
        hora.spark.run_elastic(lambda: None, num_proc=3, min_np=2, min_num_proc=3)
