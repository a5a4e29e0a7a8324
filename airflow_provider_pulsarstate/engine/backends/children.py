"""What a back end opened and closes with it: writers, readers, offset logs, publishers.

Both back ends keep their open resources here, so that closing the back end closes them, and a
resource that closes itself is forgotten (nothing grows with the number opened over time).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class Children:
    """A thread-safe set of open resources."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[Any] = set()

    def track(self, child: C) -> C:
        """Remember ``child``; returns it."""
        with self._lock:
            self._open.add(child)
        return child

    def untrack(self, child: object) -> None:
        """Forget ``child`` (it closed itself); a child not tracked is fine."""
        with self._lock:
            self._open.discard(child)

    def close_all(self) -> None:
        """Close every tracked child (each forgotten first, so one closing itself finds nothing)."""
        with self._lock:
            children, self._open = self._open, set()
        for child in children:
            child.close()

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            return iter(list(self._open))

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
