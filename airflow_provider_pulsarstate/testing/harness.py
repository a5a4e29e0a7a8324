"""Fault injection and polling helpers for tests of code built on the state engine."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from airflow_provider_pulsarstate.engine.backends.base import EARLIEST, AcquireMode, Backend, RawEntry, RawReader, RawWriter
from airflow_provider_pulsarstate.engine.errors import OperationTimeoutError, UnknownOutcomeError


def wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned); OperationTimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise OperationTimeoutError(f"{what} did not hold within {timeout:.1f}s")
        time.sleep(interval)


class FaultInjectingBackend(Backend):
    """Wraps a real back end; the next appends can be made to fail in chosen ways.

    The log underneath stays real: a "lost acknowledgement" really appends, then reports an
    unknown outcome, exactly as a send time-out after the broker persisted the entry would.

    Example::

        faulty = FaultInjectingBackend(open_backend(config))
        faulty.lose_next_ack()            # the next append lands, but the caller hears a time-out
        faulty.crash_next_append(after_frames=2)  # the next append stops after 2 frames
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self._faults: list[tuple[str, int]] = []
        self._then: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self.injected: list[str] = []

    def lose_next_ack(self, *, then: Callable[[], None] | None = None) -> None:
        """The next append is persisted, then raises UnknownOutcomeError.

        :param then: runs after the append landed and before the error is raised (to make
            something happen while the writer does not know its outcome).
        """
        with self._lock:
            self._faults.append(("lose_ack", 0))
            self._then = then

    def fail_next_append(self) -> None:
        """The next append persists nothing and raises UnknownOutcomeError."""
        with self._lock:
            self._faults.append(("fail", 0))

    def crash_next_append(self, *, after_frames: int) -> None:
        """The next append persists only its first ``after_frames`` frames, then raises."""
        with self._lock:
            self._faults.append(("partial", after_frames))

    def _take_fault(self) -> tuple[str, int] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def acquire_writer(self, topic: str, *, mode: AcquireMode, timeout: float) -> RawWriter:
        return _FaultyWriter(self, self.inner.acquire_writer(topic, mode=mode, timeout=timeout))

    def open_shared_writer(self, topic: str, *, compress: bool = False) -> RawWriter:
        return self.inner.open_shared_writer(topic, compress=compress)

    def delete_topic(self, topic: str) -> None:
        self.inner.delete_topic(topic)

    def create_reader(self, topic: str, *, start: Any = EARLIEST) -> RawReader:
        return self.inner.create_reader(topic, start=start)

    def read_last(self, topic: str, *, timeout: float) -> RawEntry | None:
        return self.inner.read_last(topic, timeout=timeout)

    def read_at(self, topic: str, position: Any, *, timeout: float) -> RawEntry | None:
        return self.inner.read_at(topic, position, timeout=timeout)

    def ensure_durable(self, topic: str) -> None:
        self.inner.ensure_durable(topic)

    def encode_position(self, position: Any) -> bytes:
        return self.inner.encode_position(position)

    def decode_position(self, data: bytes) -> Any:
        return self.inner.decode_position(data)

    def topic_url(self, topic: str) -> str:
        return self.inner.topic_url(topic)

    def close(self) -> None:
        self.inner.close()


class _FaultyWriter(RawWriter):
    def __init__(self, owner: FaultInjectingBackend, inner: RawWriter) -> None:
        self.owner = owner
        self.inner = inner
        self.topic = inner.topic
        self.epoch = inner.epoch

    def append(self, payloads: Sequence[bytes], *, timeout: float) -> list[Any]:
        fault = self.owner._take_fault()
        if fault is None:
            return self.inner.append(payloads, timeout=timeout)
        kind, frames = fault
        self.owner.injected.append(kind)
        if kind == "lose_ack":
            self.inner.append(payloads, timeout=timeout)
            then, self.owner._then = self.owner._then, None
            if then is not None:
                then()
        elif kind == "partial" and frames:
            self.inner.append(payloads[:frames], timeout=timeout)
        self.inner.close()
        raise UnknownOutcomeError(f"injected fault {kind!r} on {self.topic}")

    def close(self) -> None:
        self.inner.close()
