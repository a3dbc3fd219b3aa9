"""Every notebook in notebooks/ runs, cell by cell, in a real Jupyter kernel with a local SparkSession as ``spark``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

nbclient = pytest.importorskip("nbclient", reason="needs nbclient and ipykernel: pip install 'hora[test]'")
pytest.importorskip("ipykernel", reason="needs ipykernel: pip install 'hora[test]'")

from tests.notebooks.databricks import read_databricks_source  # noqa: E402 - only once nbformat is there

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


def test_every_notebook_is_here() -> None:
    assert [p.stem for p in NOTEBOOKS] == ["01_torch_estimator", "02_spark_run", "04_keras_estimator"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat

    notebook = read_databricks_source(path)
    assert any(cell.cell_type == "code" for cell in notebook.cells)
    widgets = {"store": str(tmp_path / "store"), "num_proc": "2"}
    setup = f"from tests.notebooks.databricks import inject\n_made_spark = inject(globals(), {widgets!r})"
    teardown = "if _made_spark:\n    spark.stop()"
    notebook.cells = [nbformat.v4.new_code_cell(setup), *notebook.cells, nbformat.v4.new_code_cell(teardown)]
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    client = nbclient.NotebookClient(
        notebook, timeout=500, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:  # the failing cell's source and traceback
        pytest.fail(f"{path.name}: a cell failed:\n{error}", pytrace=False)
    printed = "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )
    assert "Traceback" not in printed, printed[-3000:]
