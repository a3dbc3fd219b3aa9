"""The documentation's code cannot rot: its complete scripts run, and every other Python block compiles.

A Python block is a complete script when its first line names it and says how it is run::

    # train.py (horarun -np 2 python train.py)

The suite writes it to a directory of its own and runs that command there, as a user would with Hora
installed (the environment's ``bin`` first on ``PATH``, so Spark's executors find the same Python). A
script that appears on several pages (the README repeats the pages' first examples) runs once.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs._docs import ROOT, CodeBlock, code_blocks, pages

SCRIPT_HEADER = re.compile(r"# (?P<file>[\w-]+\.py) \((?P<command>[^()]+)\)")
LAUNCHERS = {"python": [sys.executable], "horarun": [sys.executable, "-m", "hora.runner"]}


def _python_blocks() -> list[CodeBlock]:
    return [block for page in pages() for block in code_blocks(page) if block.language == "python"]


def _scripts() -> dict[str, list[CodeBlock]]:
    """Each distinct complete script, with every place it appears."""
    found: dict[str, list[CodeBlock]] = {}
    for block in _python_blocks():
        if SCRIPT_HEADER.fullmatch(block.text.partition("\n")[0]):
            found.setdefault(block.text, []).append(block)
    return found


SCRIPTS = _scripts()


def test_the_pages_have_complete_scripts() -> None:
    # The getting-started job, one per front end (torch, TensorFlow, Keras, JAX), Spark and Ray.
    assert len(SCRIPTS) >= 7, [blocks[0].where for blocks in SCRIPTS.values()]


def test_every_fragment_compiles() -> None:
    failures = []
    for block in _python_blocks():
        try:
            compile(block.text, block.where, "exec")
        except SyntaxError as error:
            failures.append(f"{block.where}: {error}")
    assert not failures, "\n".join(failures)


def _command(header: str) -> tuple[str, list[str], dict[str, str]]:
    match = SCRIPT_HEADER.fullmatch(header)
    assert match, header
    words = shlex.split(match["command"])
    variables: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, _, value = words.pop(0).partition("=")
        variables[name] = value
    if words[0] == "horarun":
        assert "python" in words, f"{header}: horarun must start the script with python"
        at = words.index("python")
        words = [*LAUNCHERS["horarun"], *words[1:at], sys.executable, *words[at + 1 :]]
    else:
        words = [*LAUNCHERS[words[0]], *words[1:]]
    assert match["file"] in words, f"{header}: the command does not run {match['file']}"
    return match["file"], words, variables


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SCRIPTS), ids=[blocks[0].where for blocks in SCRIPTS.values()])
def test_complete_script_runs(script: str, tmp_path: Path) -> None:
    header = script.partition("\n")[0]
    file, command, variables = _command(header)
    (tmp_path / file).write_text(script)
    environment = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "RAY_AUTH_MODE": "disabled",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        **variables,
    }
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=240)
    where = ", ".join(block.where for block in SCRIPTS[script])
    assert result.returncode == 0, f"{where}: {header}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stdout + result.stderr, f"{where}\n{result.stderr[-3000:]}"


def test_complete_scripts_are_lint_clean(tmp_path: Path) -> None:
    # The house's lint and format rules hold for the scripts users copy, as for the code.
    ruff = Path(sys.executable).parent / "ruff"
    for number, script in enumerate(SCRIPTS):
        (tmp_path / f"script_{number}.py").write_text(script)
    config = ["--config", str(ROOT / "pyproject.toml")]
    for command in ([str(ruff), "check", *config, "."], [str(ruff), "format", "--check", "--diff", *config, "."]):
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
