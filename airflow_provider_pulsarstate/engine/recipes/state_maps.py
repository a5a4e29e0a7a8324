"""Where a state store gets the map of each scope topic: the :class:`MapSource` protocol and
:class:`OwnedMaps`, the source of plain scripts and tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap

__all__ = ["MapSource", "OwnedMaps"]


class MapSource(Protocol):
    """Where a :class:`StateStore` gets the map of a topic: opened on demand, never closed while borrowed."""

    def borrow(self, topic: str) -> AbstractContextManager[PulsarMap[str, Any]]: ...

    def list_topics(self, prefix: str) -> list[str]: ...

    @property
    def backend(self) -> Backend: ...


class OwnedMaps:
    """A :class:`MapSource` for plain scripts and tests: each topic's map is opened on first use
    and kept until :meth:`close` (not bounded: a long-lived process uses the hook's pool).

    :param backend: where the logs live (not closed here).
    :param map_options: PulsarMap / manager options of every map.
    """

    def __init__(self, backend: Backend, **map_options: Any) -> None:
        self._backend = backend
        self._options = map_options
        self._maps: dict[str, PulsarMap[str, Any]] = {}
        self._lock = threading.Lock()

    @property
    def backend(self) -> Backend:
        return self._backend

    @contextlib.contextmanager
    def borrow(self, topic: str) -> Iterator[PulsarMap[str, Any]]:
        with self._lock:
            table = self._maps.get(topic)
            if table is None:
                table = self._maps[topic] = PulsarMap(self._backend, topic, **self._options)
        yield table

    def opened(self) -> list[str]:
        """The topics whose maps are open."""
        with self._lock:
            return sorted(self._maps)

    def list_topics(self, prefix: str) -> list[str]:
        return self._backend.list_topics(prefix)

    def close(self) -> None:
        with self._lock:
            maps, self._maps = list(self._maps.values()), {}
        for table in maps:
            table.close()

    def __enter__(self) -> OwnedMaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
