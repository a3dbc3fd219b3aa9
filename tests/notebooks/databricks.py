"""Databricks notebooks in a local Jupyter kernel: the source format read into cells, and what Databricks injects.

A Databricks source notebook (``# Databricks notebook source``; cells
separated by ``# COMMAND ----------``; ``# MAGIC %md`` and ``# MAGIC %pip``
cells) becomes an nbformat notebook: ``%md`` cells are markdown, ``%pip``
cells are kept as raw cells and not run (the test environment has the
packages; a kernel must not install anything). jupytext reads the format
only as plain comments, so it is parsed here.

:func:`execute` runs one in a Jupyter kernel (nbclient). In the kernel,
:func:`inject` defines ``spark`` (a local SparkSession, loopback
only), ``dbutils`` (widgets with the test's values) and ``display`` (prints a
DataFrame), each only where the name is undefined, as on Databricks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import nbformat

from tests.local_spark import local_spark

__all__ = ["DBUtils", "NotebookError", "display", "execute", "inject", "read_databricks_source"]

HEADER = "# Databricks notebook source\n"
SEPARATOR = "\n# COMMAND ----------\n"


def read_databricks_source(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` (Databricks source format) as an nbformat notebook."""
    text = path.read_text()
    if not text.startswith(HEADER):
        raise ValueError(f"{path} is not a Databricks source notebook: it does not begin with {HEADER!r}.")
    cells = []
    for chunk in text[len(HEADER) :].split(SEPARATOR):
        lines = chunk.strip("\n").splitlines()
        if not lines:
            continue
        if all(line.startswith("# MAGIC") for line in lines):
            body = [line[len("# MAGIC ") :] if line.startswith("# MAGIC ") else "" for line in lines]
            magic, _, first = body[0].partition(" ")
            if magic == "%md":
                cells.append(nbformat.v4.new_markdown_cell("\n".join([first, *body[1:]]).strip()))
            elif magic == "%pip":
                cells.append(nbformat.v4.new_raw_cell("\n".join(body)))
            else:
                raise ValueError(f"{path}: a cell with the magic {magic!r}; expected %md or %pip.")
        else:
            cells.append(nbformat.v4.new_code_cell("\n".join(lines)))
    return nbformat.v4.new_notebook(
        cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    )


class _Widgets:
    def __init__(self, values: dict[str, str]) -> None:
        self._values = dict(values)
        self._defaults: dict[str, str] = {}

    def text(self, name: str, defaultValue: str, label: str | None = None) -> None:  # noqa: N803 - Databricks'
        self._defaults[name] = defaultValue

    def get(self, name: str) -> str:
        if name in self._values:
            return self._values[name]
        if name in self._defaults:
            return self._defaults[name]
        raise ValueError(f"No input widget named {name!r} is defined.")


class DBUtils:
    """What the notebooks use of Databricks' ``dbutils``: text widgets, whose values the test sets."""

    def __init__(self, widgets: dict[str, str]) -> None:
        self.widgets = _Widgets(widgets)


def display(value: Any) -> None:
    """Databricks' ``display``: a DataFrame is shown as a table (here, printed)."""
    if hasattr(value, "toPandas"):
        print(value.toPandas().to_string())
    else:
        print(value)


def inject(namespace: dict[str, Any], widgets: dict[str, str]) -> bool:
    """Defines ``spark``, ``dbutils`` and ``display`` in ``namespace`` where undefined; True if it made ``spark``."""
    if "dbutils" not in namespace:
        namespace["dbutils"] = DBUtils(widgets)
    if "display" not in namespace:
        namespace["display"] = display
    if "spark" in namespace:
        return False
    namespace["spark"] = local_spark("hora-notebook")
    return True


class NotebookError(Exception):
    """A cell of a notebook failed; the message holds the cell's source and traceback."""


def execute(path: Path, widgets: dict[str, str], cwd: Path, timeout: float = 500.0) -> str:
    """Runs the notebook at ``path`` in a new Jupyter kernel working in ``cwd``; returns what it printed.

    A first cell injects ``spark``, ``dbutils`` (with ``widgets``) and
    ``display`` as Databricks would, a last one stops the ``spark`` it made.
    """
    import nbclient

    notebook = read_databricks_source(path)
    setup = f"from tests.notebooks.databricks import inject\n_made_spark = inject(globals(), {widgets!r})"
    teardown = "if _made_spark:\n    spark.stop()"
    notebook.cells = [nbformat.v4.new_code_cell(setup), *notebook.cells, nbformat.v4.new_code_cell(teardown)]
    client = nbclient.NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:  # the failing cell's source and traceback
        raise NotebookError(f"{path.name}: a cell failed:\n{error}") from None
    return "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )


if __name__ == "__main__":
    # python -m tests.notebooks.databricks NOTEBOOK WIDGETS_JSON CWD: what it printed, or the failure (exit 1).
    try:
        print(execute(Path(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3])), end="")
    except NotebookError as failure:
        sys.exit(str(failure))
