"""``core/_native.pyi`` documents the compiled module: every name, member and parameter list must match it."""

from __future__ import annotations

import ast
import enum
import inspect
from pathlib import Path

import pytest
from hora import _native

STUB = Path(_native.__file__).with_name("_native.pyi")
if not STUB.exists():  # an installed tree keeps the stub beside the sources
    STUB = Path(__file__).resolve().parents[2] / "core" / "_native.pyi"


def _stub() -> ast.Module:
    return ast.parse(STUB.read_text())


def _top_level_params(signature: str) -> list[str]:
    """Parameter names of a pybind11 signature line ``name(a: T, b: U = x) -> R``, without ``self``."""
    inner = signature[signature.index("(") + 1 :]
    depth, parts, current = 0, [], ""
    for char in inner:
        if char in "([<{":
            depth += 1
        elif char in ")]>}":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    names = [part.split(":")[0].split("=")[0].strip() for part in parts if part.strip()]
    return [name for name in names if name not in ("self", "*args", "**kwargs")]


def _compiled_params(function: object) -> list[str]:
    doc = inspect.getdoc(function) or ""
    return _top_level_params(doc.splitlines()[0])


def _stub_params(node: ast.FunctionDef) -> list[str]:
    names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
    return [name for name in names if name != "self"]


def _public(names: object) -> set[str]:
    return {name for name in names if not name.startswith("_")}  # type: ignore[attr-defined]


def _members(cls: type) -> set[str]:
    if issubclass(cls, BaseException):
        return set()
    if isinstance(getattr(cls, "__members__", None), dict):  # a bound enum
        return set(cls.__members__)
    return _public(vars(cls))


def _stub_members(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return _public(names)


def test_every_compiled_name_is_in_the_stub_and_back() -> None:
    stub_names = _public(node.name for node in _stub().body if isinstance(node, (ast.FunctionDef, ast.ClassDef)))
    compiled = _public(dir(_native))
    assert compiled == stub_names, (
        f"missing from the stub: {sorted(compiled - stub_names)}; "
        f"not in the compiled module: {sorted(stub_names - compiled)}"
    )


CLASSES = [node for node in _stub().body if isinstance(node, ast.ClassDef)]


@pytest.mark.parametrize("node", CLASSES, ids=[node.name for node in CLASSES])
def test_each_class_has_the_stubs_members(node: ast.ClassDef) -> None:
    cls = getattr(_native, node.name)
    compiled = _members(cls)
    if isinstance(getattr(cls, "__members__", None), dict):
        stub = {item.targets[0].id for item in node.body if isinstance(item, ast.Assign)}  # type: ignore[attr-defined]
        assert stub == compiled, f"{node.name}: the stub's values {sorted(stub)} differ from {sorted(compiled)}"
        return
    stub = _stub_members(node) - {"__init__"}
    assert compiled - {"__init__"} == stub, (
        f"{node.name}: missing from the stub: {sorted(compiled - stub)}; not compiled: {sorted(stub - compiled)}"
    )


FUNCTIONS = [
    (f"{owner.name}.{item.name}" if owner else item.name, item)
    for owner, items in [(None, _stub().body)] + [(c, c.body) for c in CLASSES]
    for item in items
    if isinstance(item, ast.FunctionDef)
    and (item.name == "__init__" or not item.name.startswith("_"))
    and not any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)
]


@pytest.mark.parametrize(("path", "node"), FUNCTIONS, ids=[path for path, _ in FUNCTIONS])
def test_each_function_takes_the_stubs_parameters(path: str, node: ast.FunctionDef) -> None:
    target: object = _native
    for part in path.split("."):
        target = getattr(target, part)
    owner = getattr(_native, path.split(".")[0])
    if isinstance(owner, type) and (issubclass(owner, (BaseException, enum.Enum)) or owner.__init__ is object.__init__):
        pytest.skip("not a bound function")
    assert _compiled_params(target) == _stub_params(node), f"{path}: the stub's parameters differ from the module's"
