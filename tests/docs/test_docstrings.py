"""Every public name has a docstring: the API reference is generated from them."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from tests.docs._docs import reference_generator

hora_api = reference_generator()


def _own_doc(value: Any) -> str | None:
    if inspect.isclass(value) and "__doc__" not in vars(value):
        return None  # a class's __doc__ is never inherited, but check: pybind11 stores it as a property
    doc = getattr(value, "__doc__", None)
    if inspect.isclass(value) and isinstance(doc, str) and doc.startswith(f"{value.__name__}("):
        return None  # what dataclasses and named tuples write when the class has none: its signature
    return doc.strip() if isinstance(doc, str) and doc.strip() else None


def _undocumented_members(cls: type) -> list[str]:
    """Public methods and properties defined by Hora on ``cls`` (not inherited from a framework) without docs."""
    missing = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("hora"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in missing:
                continue
            # Python code only: the compiled core's classes are documented by their class docstring.
            function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if not inspect.isfunction(function):
                continue
            if not inspect.getdoc(getattr(cls, name)):
                missing.append(name)
    return missing


@pytest.mark.parametrize("module_name", hora_api.PUBLIC_MODULES)
def test_public_module_has_docstring_and_all(module_name: str) -> None:
    module = __import__(module_name, fromlist=["__all__"])
    assert _own_doc(module), f"{module_name} has no module docstring"
    assert module.__all__, f"{module_name}.__all__ is empty"


def test_every_public_name_is_documented() -> None:
    problems = []
    for entry in hora_api.public_names():
        if not entry.documented_here or inspect.ismodule(entry.value):
            continue
        value = entry.value
        if inspect.isclass(value):
            if not _own_doc(value):
                problems.append(f"{entry.qualified}: class without a docstring")
            problems += [f"{entry.qualified}.{name}: no docstring" for name in _undocumented_members(value)]
        elif callable(value):
            if not _own_doc(value):
                problems.append(f"{entry.qualified}: no docstring")
        elif not _own_doc(type(value)):
            problems.append(f"{entry.qualified}: a {type(value).__name__}, whose class has no docstring")
    assert not problems, "public names without documentation:\n" + "\n".join(problems)


def test_reference_pages_cover_every_public_module(tmp_path) -> None:
    written = {path.name for path in hora_api.write_pages(tmp_path)}
    assert written == {f"{name}.rst" for name in hora_api.PUBLIC_MODULES} | {"index.rst"}


def test_checker_flags_an_undocumented_function() -> None:
    def undocumented() -> None:
        pass

    class Documented:
        """Has a docstring, but one method without."""

        def method(self) -> None:
            pass

    Documented.__module__ = "hora.example"

    @dataclasses.dataclass
    class Fields:
        x: int = 1

    assert _own_doc(Fields) is None  # the signature dataclasses fill in is no documentation
    assert _own_doc(undocumented) is None
    assert _undocumented_members(Documented) == ["method"]
