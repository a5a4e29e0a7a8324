"""Fixtures shared by the engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_pulsarstate import PulsarMap
from airflow_provider_pulsarstate.engine.backends.base import Backend


@pytest.fixture
def map_defaults() -> dict[str, Any]:
    """Options every map made by ``maps`` gets unless the call overrides them (override per module)."""
    return {"acquire_timeout": 20.0}


@pytest.fixture
def maps(backend: Backend, topic: str, map_defaults: dict[str, Any]) -> Iterator[Any]:
    """A factory of PulsarMaps on the test topic, closed at teardown."""
    made: list[PulsarMap] = []

    def make(*, on: Backend | None = None, **options: Any) -> PulsarMap:
        m = PulsarMap(on or backend, topic, **{**map_defaults, **options})
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


@pytest.fixture
def tables(backend: Backend, topic: str) -> Iterator[Any]:
    """``tables(**options)``: a StateTable on the test's topic (closed at the end)."""
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    made: list[StateTable] = []

    def make(**options: Any) -> StateTable:
        options.setdefault("acquire_timeout", 30.0)
        options.setdefault("writer_idle_timeout", 0.1)
        t = StateTable(backend, topic, **options)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()
