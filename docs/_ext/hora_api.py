"""The API reference, generated from the public modules' ``__all__`` and docstrings.

At ``builder-inited`` this writes ``api/<module>.rst`` for every module of :data:`PUBLIC_MODULES`: each
public name is documented once, on the page of the first module (in this order) that exports it, and
the later modules that re-export it link there. The same walk (:func:`public_names`) is what the
suite's docstring test checks, so a name that reaches the reference is a name that has a docstring.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# The public modules, the most general first: a name is documented where it first appears.
PUBLIC_MODULES = (
    "hora",
    "hora.exceptions",
    "hora.compression",
    "hora.mpi",
    "hora.elastic",
    "hora.torch",
    "hora.torch.elastic",
    "hora.tensorflow",
    "hora.tensorflow.elastic",
    "hora.keras",
    "hora.keras.callbacks",
    "hora.keras.elastic",
    "hora.tensorflow.keras",
    "hora.jax",
    "hora.spark",
    "hora.estimators",
    "hora.ray",
    "hora.ray.tune",
)


@dataclass(frozen=True)
class PublicName:
    """One name of a public module's ``__all__``, and where its documentation lives."""

    module: str
    name: str
    value: Any
    home: str  # the qualified name it is documented under: here, or in an earlier module

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def documented_here(self) -> bool:
        return self.home == self.qualified


def public_names() -> Iterator[PublicName]:
    """Every name of every public module, in module and ``__all__`` order."""
    homes: dict[int, str] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in _exported(module):
            value = getattr(module, name)
            home = homes.setdefault(id(value), f"{module_name}.{name}")
            yield PublicName(module_name, name, value, home)


def _exported(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        raise RuntimeError(f"public module {module.__name__} has no __all__")
    return list(names)


def _directive(entry: PublicName) -> str:
    value, target = entry.value, entry.qualified
    if inspect.ismodule(value):
        if value.__name__ not in PUBLIC_MODULES:
            raise RuntimeError(f"{target} is the module {value.__name__}, which has no page of its own")
        return f"``{entry.name}``: the module :doc:`{value.__name__}`.\n"
    if inspect.isclass(value) and issubclass(value, BaseException):
        return f".. autoexception:: {target}\n   :members:\n   :show-inheritance:\n"
    if inspect.isclass(value):
        return f".. autoclass:: {target}\n   :members:\n   :show-inheritance:\n"
    if callable(value):
        return f".. autofunction:: {target}\n"
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return f".. py:data:: {target}\n\n   ``{value!r}``, an instance of :py:class:`{kind}`.\n"


def _page(module_name: str, entries: list[PublicName]) -> str:
    lines = [module_name, "=" * len(module_name), "", f".. automodule:: {module_name}", ""]
    here = [entry for entry in entries if entry.documented_here]
    elsewhere = [entry for entry in entries if not entry.documented_here]
    lines += [_directive(entry) for entry in here]
    if elsewhere:
        links = ", ".join(f":py:obj:`{entry.name} <{entry.home}>`" for entry in elsewhere)
        lines += ["Also exported here, documented where first exported: " + links + ".", ""]
    return "\n".join(lines)


def write_pages(directory: Path) -> list[Path]:
    """Writes the reference's pages (an index and one per module) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    by_module: dict[str, list[PublicName]] = {name: [] for name in PUBLIC_MODULES}
    for entry in public_names():
        by_module[entry.module].append(entry)
    written = []
    for module_name, entries in by_module.items():
        written.append(_write(directory / f"{module_name}.rst", _page(module_name, entries)))
    toctree = "\n".join(f"   {name}" for name in PUBLIC_MODULES)
    index = f"API reference\n=============\n\n.. toctree::\n   :maxdepth: 1\n\n{toctree}\n"
    written.append(_write(directory / "index.rst", index))
    for stale in set(directory.glob("*.rst")) - set(written):  # a module no longer public
        stale.unlink()
    return written


def _write(path: Path, text: str) -> Path:
    # Rewritten only when changed, so an incremental build reads only what changed.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", lambda app: write_pages(Path(app.srcdir) / "api"))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
