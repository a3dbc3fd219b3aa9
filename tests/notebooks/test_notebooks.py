"""Every notebook in notebooks/ runs, cell by cell, in a real Jupyter kernel with a local SparkSession as ``spark``.

Each runs in a process of its own, inside a network namespace with loopback
only where this machine can make one: there 127.0.0.1 is the only address
even software that picks the host's address itself can find (Ray on Spark
registers its nodes at it and binds its dashboard to 0.0.0.0), and every
process a notebook leaves behind is killed with the namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.background import BackgroundRuns, Program
from tests.conftest import ROOT

pytest.importorskip("nbclient", reason="needs nbclient and ipykernel: pip install 'hora[test]'")
pytest.importorskip("ipykernel", reason="needs ipykernel: pip install 'hora[test]'")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
# Notebooks that may run only where loopback is the only network (see above).
LOOPBACK_ONLY = {"03_ray_tune_on_spark"}


def test_every_notebook_is_here() -> None:
    assert [p.stem for p in NOTEBOOKS] == [
        "01_torch_estimator",
        "02_spark_run",
        "03_ray_tune_on_spark",
        "04_keras_estimator",
    ]


@pytest.fixture(scope="module")
def notebook_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundRuns]:
    """Every notebook that can run here, two at a time, the longest (Ray's fixed start-up sleeps) first."""
    isolation = netns.unavailable()
    # No Ray dashboard: its dependencies (ray[default]) are not installed, and Ray would wait a minute for it.
    # Ray on Spark holds its port-allocation lock this many seconds after starting each worker node of one machine
    # (10 by default), so that the next node starts after it; 2 s is plenty with one Ray notebook at a time.
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        TF_CPP_MIN_LOG_LEVEL="3",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # Ray's CLI
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        RAY_ON_SPARK_RAY_WORKER_NODE_STARTUP_INTERVAL="2",
    )
    with contextlib.ExitStack() as stack:
        programs = {}
        for path in sorted(NOTEBOOKS, key=lambda p: p.stem not in LOOPBACK_ONLY):
            if isolation is not None and path.stem in LOOPBACK_ONLY:
                continue
            workdir = tmp_path_factory.mktemp(path.stem)
            widgets = {"store": str(workdir / "store"), "num_proc": "2", "ray_dashboard": "false"}
            argv = [sys.executable, "-m", "tests.notebooks.databricks", str(path), json.dumps(widgets), str(ROOT)]
            if isolation is None:
                argv = stack.enter_context(netns.LoopbackHost()).command(argv)
            programs[path.stem] = Program(argv, workdir, env, timeout=560)
        runs = BackgroundRuns(programs, tmp_path_factory.mktemp("notebook-output"), parallel=2)
        stack.callback(runs.close)  # before the namespaces go
        yield runs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, notebook_runs: BackgroundRuns) -> None:
    isolation = netns.unavailable()
    if isolation is not None and path.stem in LOOPBACK_ONLY:
        pytest.skip(f"{path.stem} runs only in a network namespace with loopback only: {isolation}")
    result = notebook_runs.result(path.stem)
    assert result.returncode == 0, result.stderr[-6000:]  # the failing cell's source and traceback
    assert "Traceback" not in result.stdout, result.stdout[-3000:]
