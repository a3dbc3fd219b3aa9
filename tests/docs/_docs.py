"""Shared access to the documentation's sources for the docs tests."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def reference_generator() -> ModuleType:
    """``docs/_ext/hora_api.py``, the generator of the API reference."""
    spec = importlib.util.spec_from_file_location("hora_api", DOCS / "_ext" / "hora_api.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("hora_api")
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["hora_api"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


def pages() -> list[Path]:
    """The hand-written pages of the site, and the README."""
    return [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


@dataclass(frozen=True)
class CodeBlock:
    """A fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_blocks(page: Path) -> list[CodeBlock]:
    """The fenced code blocks of a Markdown page, in order (directives such as ``{literalinclude}`` included)."""
    blocks, opening, language, body = [], 0, "", []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if not opening and line.startswith("```"):
            opening, language, body = number, line[3:].strip(), []
        elif opening and line.rstrip() == "```":
            blocks.append(CodeBlock(page, opening, language, "\n".join(body) + "\n"))
            opening = 0
        elif opening:
            body.append(line)
    if opening:
        raise ValueError(f"{page}:{opening}: a code block is never closed")
    return blocks
