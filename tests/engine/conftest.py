"""Fixtures shared by the engine tests."""

from __future__ import annotations

from typing import Any, Iterator

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
