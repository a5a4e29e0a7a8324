"""Other projects' private names are reached only from the adapter modules.

An AST scan of the package: outside ``ADAPTERS`` no module imports a private module or name of
another project (``airflow._shared``, ``from x import _y``), touches a private attribute of an
imported module (``sys._getframe``), names a private attribute in ``getattr``/``hasattr``/``setattr``
on anything but ``self``/``cls``, or reads a private attribute no class of this package defines
(``hook._build_spark_submit_command``). The adapters each say why they reach in and are tested
against the installed versions (tests/airflow/test_airflow_internals.py,
tests/engine/test_pulsar_compat.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "airflow_provider_pulsarstate"

ADAPTERS = {"hooks/airflow_internals.py", "engine/backends/pulsar_compat.py"}

PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
"""Underscore names that are public API (namedtuple's)."""


@functools.cache
def _parse(path: Path, extra: str) -> tuple[ast.AST, ...]:
    """Every node of the module at ``path`` with ``extra`` appended (parsed once per test session)."""
    return tuple(ast.walk(ast.parse(path.read_text() + extra, str(path))))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_private_names(package: Path, extra: dict[str, str]) -> set[str]:
    """Every private name a module of this package defines: functions, methods, class and
    instance attributes (``self._x = ...``), annotated fields, ``__slots__`` entries."""
    names: set[str] = set()
    for path in package.rglob("*.py"):
        if path.relative_to(package).as_posix() in ADAPTERS:
            continue  # what they name is other projects' private names
        for node in _parse(path, extra.get(path.relative_to(package).as_posix(), "")):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value):
                names.add(node.value)  # __slots__ entries, namedtuple fields
    return {name for name in names if _private(name)}


def _foreign(module: str | None) -> bool:
    return module is not None and module.split(".")[0] not in {PACKAGE, "__future__"}


def find_reaches(package: Path, extra: dict[str, str] | None = None) -> list[str]:
    """Every reach outside the adapters, as ``module:line what``; ``extra`` appends source to modules."""
    extra = extra or {}
    own = _own_private_names(package, extra)
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative in ADAPTERS:
            continue
        nodes = _parse(path, extra.get(relative, ""))
        imported: set[str] = set()  # local names bound to foreign modules or their members
        for node in nodes:
            where = f"{relative}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _foreign(alias.name):
                        if any(_private(part) for part in alias.name.split(".")):
                            found.append(f"{where} imports {alias.name}")
                        imported.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and _foreign(node.module):
                assert node.module is not None
                if any(_private(part) for part in node.module.split(".")):
                    found.append(f"{where} imports from {node.module}")
                for alias in node.names:
                    if _private(alias.name):
                        found.append(f"{where} imports {node.module}.{alias.name}")
                    imported.add(alias.asname or alias.name)
        for node in nodes:
            where = f"{relative}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in PUBLIC_UNDERSCORE:
                base = node.value
                if isinstance(base, ast.Name) and base.id in {"self", "cls"}:
                    continue
                root = base
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in imported:
                    found.append(f"{where} reads {ast.unparse(node)}")
                elif node.attr not in own:
                    found.append(f"{where} reads {ast.unparse(node)} (no class here defines {node.attr})")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"getattr", "hasattr", "setattr", "delattr"}
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in {"self", "cls"})
            ):
                found.append(f"{where} {ast.unparse(node)}")
    return found


def test_only_the_adapters_reach_into_other_projects() -> None:
    assert find_reaches(ROOT / PACKAGE) == []


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("xcom/backend.py", "from airflow._shared.state import BaseStoreBackend\n"),
        ("state_store/backend.py", "import airflow.sdk._shared.module_loading\n"),
        ("operators/views.py", "from airflow.sdk.module_loading import _private_helper\n"),
        ("engine/manager.py", "import sys\nFRAME = sys._getframe(0)\n"),
        ("engine/offsets/pulsar.py", "def _f(reader):\n    return getattr(reader, '_reader', reader)\n"),
        ("operators/spark_submit.py", "def _f(hook):\n    return hook._build_spark_submit_command('x')\n"),
        ("triggers/state_change.py", "def _f(store):\n    return store._by_name\n"),
    ],
)
def test_an_injected_private_reach_breaks_the_build(module: str, line: str) -> None:
    found = find_reaches(ROOT / PACKAGE, {module: "\n" + line})
    assert len(found) == 1 and found[0].startswith(module), found


def test_the_adapters_are_the_ones_listed() -> None:
    for relative in ADAPTERS:
        assert (ROOT / PACKAGE / relative).is_file(), relative
