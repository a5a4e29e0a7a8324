"""Scope predicates of views: ``(key) -> bool`` functions registered in code, named in the log.

A view records only a predicate's *name*; every process that creates, plans or applies the view
resolves it here. Nothing named in the log is ever imported or executed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError, UnknownScopePredicateError

__all__ = ["register_scope_predicate", "resolve_predicate"]

_PREDICATE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_SCOPE_PREDICATES: dict[str, Callable[[str], Any]] = {}


def register_scope_predicate(name: str, fn: Callable[[str], Any] | None = None) -> Any:
    """Register ``fn`` (a ``(key) -> bool``) as the scope predicate ``name`` in this process.

    Use it directly (``register_scope_predicate("even", is_even)``) or as a decorator
    (``@register_scope_predicate("even")``). Views record only the name; every process that
    creates, plans or applies such a view must run the registration (put it in a module that
    the DAG file and the Spark job both import). Registering the same name again replaces it.

    :raises ConfigurationError: a bad name (1-128 characters of ``[A-Za-z0-9_.-]``) or a non-callable.
    """
    if not isinstance(name, str) or not _PREDICATE_NAME.match(name):
        raise ConfigurationError(f"scope predicate name {name!r} must be 1-128 characters of [A-Za-z0-9_.-]")

    def register(target: Callable[[str], Any]) -> Callable[[str], Any]:
        if not callable(target):
            raise ConfigurationError(f"scope predicate {name!r} must be callable, got {type(target).__name__}")
        _SCOPE_PREDICATES[name] = target
        return target

    return register if fn is None else register(fn)


def resolve_predicate(name: str, *, view_id: str | None = None) -> Callable[[str], Any]:
    """The scope predicate registered as ``name`` in this process (never imported from anywhere).

    :raises UnknownScopePredicateError: nothing is registered under that name.
    """
    target = _SCOPE_PREDICATES.get(name) if isinstance(name, str) else None
    if target is None:
        where = f"view {view_id!r}: " if view_id else ""
        raise UnknownScopePredicateError(
            f"{where}scope predicate {name!r} is not registered in this process; register it in code that "
            f"every process using the view imports: register_scope_predicate({name!r}, fn) "
            "(from airflow_provider_pulsarstate.engine.recipes.table); names are never imported from the log"
        )
    return target
