"""Change listeners: called once per applied op, in log order, after it is committed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airflow_provider_pulsarstate.engine.state.stats import ManagerStats
from airflow_provider_pulsarstate.engine.state.support import describe

log = logging.getLogger(__name__)

O = TypeVar("O")


@dataclass(frozen=True, slots=True)
class Change(Generic[O]):
    """One applied op, as change listeners receive it."""

    offset: int
    op: O
    publish_time: float


ListenerErrorHandler = Callable[[BaseException, "Change[Any]"], None]
Registration = tuple[Callable[[Change[O]], None], ListenerErrorHandler | None]


class Listeners(Generic[O]):
    """The registered listeners and the last offset they were told about.

    :meth:`notify` runs under the state lock (``state_lock``); :meth:`remove` takes it too, so that
    once it returns the listener sees no op applied afterwards.
    """

    def __init__(self, topic: str, stats: ManagerStats, state_lock: threading.RLock) -> None:
        self.topic = topic
        self.stats = stats
        self._state_lock = state_lock
        self._lock = threading.Lock()
        self.registered: list[Registration[O]] = []
        self.notified_offset = -1

    def __bool__(self) -> bool:
        return bool(self.registered)

    def add(self, listener: Callable[[Change[O]], None], on_error: ListenerErrorHandler | None) -> None:
        with self._lock:
            self.registered = [*self.registered, (listener, on_error)]  # copied: notify iterates the old list

    def remove(self, listener: Callable[[Change[O]], None]) -> bool:
        """Remove one registration of ``listener``; False if it was not registered."""
        with self._state_lock, self._lock:
            for i, (registered, _) in enumerate(self.registered):
                if registered is listener or registered == listener:
                    self.registered = self.registered[:i] + self.registered[i + 1 :]
                    return True
        return False

    def skip_to(self, offset: int) -> None:
        """Records up to ``offset`` were applied with nobody listening (or are in a loaded checkpoint)."""
        self.notified_offset = max(self.notified_offset, offset)

    def notify(self, offset: int, ops: list[O], publish_time: float) -> None:
        """Tell every listener about the ops of the record at ``offset`` (once per offset)."""
        if offset <= self.notified_offset:
            return
        self.notified_offset = offset
        for listener, on_error in self.registered:
            for op in ops:
                change = Change(offset, op, publish_time)
                try:
                    listener(change)
                except Exception as exc:
                    self._failed(listener, on_error, change, exc)

    def _failed(
        self,
        listener: Callable[[Change[O]], None],
        on_error: ListenerErrorHandler | None,
        change: Change[O],
        exc: Exception,
    ) -> None:
        self.stats.listener_errors += 1
        log.error(
            "%s: change listener %r failed at offset %d: %s",
            self.topic,
            listener,
            change.offset,
            describe(exc),
            exc_info=exc,
        )
        if on_error is not None:
            try:
                on_error(exc, change)
            except Exception:
                log.exception(
                    "%s: the error handler of listener %r failed at offset %d", self.topic, listener, change.offset
                )
