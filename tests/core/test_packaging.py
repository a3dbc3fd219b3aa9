"""The distribution ships every package of the source tree: a wheel must import what the checkout does."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib comes with Python 3.11")

ROOT = Path(__file__).resolve().parents[2]


def _source_packages(package_dirs: dict[str, str]) -> set[str]:
    found = set()
    for package, directory in package_dirs.items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join([package, *relative.parts]))
    return found


def test_pyproject_lists_every_package() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dirs = setuptools["package-dir"]
    source = _source_packages(package_dirs)
    assert set(setuptools["packages"]) == source, (
        f"pyproject.toml's [tool.setuptools] packages must list every package of the tree: "
        f"missing {sorted(source - set(setuptools['packages']))}, "
        f"not in the tree {sorted(set(setuptools['packages']) - source)}"
    )
