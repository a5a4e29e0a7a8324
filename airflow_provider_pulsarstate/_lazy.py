"""Names of a package loaded on first use (PEP 562): importing the package, or one module of it,
does not load the modules its public names come from."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``names`` maps a public name to the
    module (under ``package``) it is loaded from; a loaded name is stored in ``namespace`` (the
    package's globals), so later look-ups skip ``__getattr__``."""

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *names})

    return getattr_, dir_
