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
import subprocess
import sys
from pathlib import Path

import pytest

from tests import netns
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


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    isolation = netns.unavailable()
    if isolation is not None and path.stem in LOOPBACK_ONLY:
        pytest.skip(f"{path.stem} runs only in a network namespace with loopback only: {isolation}")
    # No Ray dashboard: its dependencies (ray[default]) are not installed, and Ray would wait a minute for it.
    widgets = {"store": str(tmp_path / "store"), "num_proc": "2", "ray_dashboard": "false"}
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        TF_CPP_MIN_LOG_LEVEL="3",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # Ray's CLI
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    argv = [sys.executable, "-m", "tests.notebooks.databricks", str(path), json.dumps(widgets), str(ROOT)]
    with contextlib.ExitStack() as stack:
        if isolation is None:
            argv = stack.enter_context(netns.LoopbackHost()).command(argv)
        result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560)
    assert result.returncode == 0, result.stderr[-6000:]  # the failing cell's source and traceback
    assert "Traceback" not in result.stdout, result.stdout[-3000:]
