"""The reference pages name what the code has: every setting, every launcher flag, every Horovod equivalent."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from hora.driver import contract
from hora.runner.cli import make_parser

from tests.docs._docs import DOCS, ROOT

SOURCES = ("core", "spark_backend", "ray_backend", "estimators", "native")
CODE = [
    ROOT / "setup.py",
    ROOT / "tests" / "worker.py",
    *(path for folder in SOURCES for path in sorted((ROOT / folder).rglob("*")) if path.suffix in (".py", ".cc", ".h")),
]
# hora._env's readers take the name without its prefix: number(env, "CYCLE_TIME", ...) reads HORA_CYCLE_TIME.
READER_CALL = re.compile(r"\b(?:lookup|flag|number|_choice|_tristate)\(\s*\w+,\s*\"([A-Z0-9_]+)\"")
VARIABLE = re.compile(r"\bHORA_[A-Z0-9_]*[A-Z0-9]\b")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def variables_in_code() -> set[str]:
    """Every ``HORA_*`` variable the code reads or sets."""
    names = {name for name in contract._PLACE if name.startswith("HORA_")}
    for path in CODE:
        text = path.read_text()
        names |= set(VARIABLE.findall(text))
        names |= {f"HORA_{name}" for name in READER_CALL.findall(text)}
    return names


def _inline_code(page: Path) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", page.read_text()))


def test_every_variable_is_on_the_settings_page() -> None:
    documented = {name for code in _inline_code(DOCS / "settings.md") for name in VARIABLE.findall(code)}
    in_code = variables_in_code()
    assert in_code - documented == set(), "variables the code reads that docs/settings.md does not name"
    assert documented - in_code == set(), "variables docs/settings.md names that the code never reads"


def _parser_flags() -> set[str]:
    return {option for action in make_parser()._actions for option in action.option_strings}


def test_every_launcher_flag_is_on_the_launcher_page() -> None:
    text = (DOCS / "horarun.md").read_text()
    flags = _parser_flags()
    missing = {flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)}
    assert missing == set(), "horarun flags docs/horarun.md does not describe"
    unknown = set(FLAG.findall(text)) - flags
    assert unknown == set(), "flags docs/horarun.md names that horarun does not have"


def _table_rows(page: Path) -> list[list[str]]:
    rows = []
    for line in page.read_text().splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[\s:|-]+\|?", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _resolve(name: str) -> Any:
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            value = getattr(value, attribute)
        return value
    raise ImportError(name)


MIGRATION = DOCS / "migrating-from-horovod.md"


def test_migration_guide_names_only_what_hora_has() -> None:
    rows = [row for row in _table_rows(MIGRATION) if len(row) >= 2 and row[0] != "Horovod"]
    assert len(rows) > 150, f"only {len(rows)} rows: the guide maps every Horovod name"
    flags, variables, problems = _parser_flags(), variables_in_code(), []
    for row in rows:
        for code in re.findall(r"`([^`]+)`", row[1]):
            token = code.split("(")[0].split()[0] if code.split() else code
            if token.startswith("hora."):
                try:
                    _resolve(token)
                except (ImportError, AttributeError) as error:
                    problems.append(f"{row[0]} -> {token}: {error!r}")
            elif token.startswith("--") and token not in flags:
                problems.append(f"{row[0]} -> {token}: horarun has no such flag")
            elif VARIABLE.fullmatch(token) and token not in variables:
                problems.append(f"{row[0]} -> {token}: the code never reads it")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", ["settings.md", "horarun.md", "migrating-from-horovod.md"])
def test_the_checks_see_the_pages(page: str) -> None:
    # The checks above parse inline code and tables: a page rewritten in another form must not pass empty.
    assert len(_inline_code(DOCS / page)) > 30
