"""Fault injection and polling helpers for tests of code built on the state engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from airflow_provider_pulsarstate.engine.backends.base import (
    EARLIEST,
    AcquireMode,
    Backend,
    RawEntry,
    RawReader,
    RawWriter,
)
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    OperationTimeoutError,
    UnknownOutcomeError,
)


def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned); OperationTimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise OperationTimeoutError(f"{what} did not hold within {timeout:.1f}s")
        time.sleep(interval)


class ForwardingBackend(Backend):
    """A back end that forwards every call to ``inner``; subclasses override what they change.

    :meth:`check` runs before every call that names a topic (a no-op here): override it to
    refuse some calls (an outage, a role without access to some topics).
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner

    def check(self, operation: str, topic: str) -> None:
        """Called with the method's name and topic before it is forwarded; raise to refuse it."""

    def underlying(self) -> Backend:
        return self.inner.underlying()

    def acquire_writer(self, topic: str, *, mode: AcquireMode, timeout: float, name: str | None = None) -> RawWriter:
        self.check("acquire_writer", topic)
        return self.inner.acquire_writer(topic, mode=mode, timeout=timeout, name=name)

    def current_epoch(self, topic: str) -> int:
        self.check("current_epoch", topic)
        return self.inner.current_epoch(topic)

    def open_shared_writer(self, topic: str, *, compress: bool = False, batching: bool = True) -> RawWriter:
        self.check("open_shared_writer", topic)
        return self.inner.open_shared_writer(topic, compress=compress, batching=batching)

    def delete_topic(self, topic: str) -> None:
        self.check("delete_topic", topic)
        self.inner.delete_topic(topic)

    def list_topics(self, prefix: str) -> list[str]:
        self.check("list_topics", prefix)
        return self.inner.list_topics(prefix)

    def create_reader(self, topic: str, *, start: Any = EARLIEST) -> RawReader:
        self.check("create_reader", topic)
        return self.inner.create_reader(topic, start=start)

    def read_last(self, topic: str, *, timeout: float) -> RawEntry | None:
        self.check("read_last", topic)
        return self.inner.read_last(topic, timeout=timeout)

    def read_at(self, topic: str, position: Any, *, timeout: float) -> RawEntry | None:
        self.check("read_at", topic)
        return self.inner.read_at(topic, position, timeout=timeout)

    def ensure_durable(self, topic: str) -> None:
        self.check("ensure_durable", topic)
        self.inner.ensure_durable(topic)

    def encode_position(self, position: Any) -> bytes:
        return self.inner.encode_position(position)

    def decode_position(self, data: bytes) -> Any:
        return self.inner.decode_position(data)

    def topic_url(self, topic: str) -> str:
        return self.inner.topic_url(topic)

    def close(self) -> None:
        self.inner.close()


class FaultInjectingBackend(ForwardingBackend):
    """Wraps a real back end; the next appends can be made to fail in chosen ways, and the whole
    back end can be made unreachable for a while (an outage).

    The log underneath stays real: a "lost acknowledgement" really appends, then reports an
    unknown outcome, exactly as a send time-out after the broker persisted the entry would.

    Example::

        faulty = FaultInjectingBackend(open_backend(config))
        faulty.lose_next_ack()            # the next append lands, but the caller hears a time-out
        faulty.crash_next_append(after_frames=2)  # the next append stops after 2 frames
        faulty.lose_next_ack(then=faulty.start_outage)  # ... and then nothing can be read any more
        faulty.end_outage()
    """

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self._faults: list[tuple[str, float, Callable[[], None] | None]] = []
        self._lock = threading.Lock()
        self._outage_until: float | None = None
        self._outage_error: Callable[[str], BaseException] | None = None
        self._close_failures = 0
        self.injected: list[str] = []

    # -- append faults ------------------------------------------------------------------------
    def lose_next_ack(self, *, then: Callable[[], None] | None = None) -> None:
        """The next append is persisted, then raises UnknownOutcomeError.

        :param then: runs after the append landed and before the error is raised (to make
            something happen while the writer does not know its outcome).
        """
        self._add("lose_ack", 0, then)

    def fail_next_append(self, *, then: Callable[[], None] | None = None) -> None:
        """The next append persists nothing and raises UnknownOutcomeError (``then`` runs first)."""
        self._add("fail", 0, then)

    def crash_next_append(self, *, after_frames: int) -> None:
        """The next append persists only its first ``after_frames`` frames, then raises."""
        self._add("partial", after_frames, None)

    def delay_next_append(self, seconds: float) -> None:
        """The next append waits ``seconds`` before it is sent (then lands normally)."""
        self._add("delay", seconds, None)

    def fail_next_close(self, count: int = 1) -> None:
        """The next ``count`` closes of an exclusive writer raise RuntimeError (a driver bug); the
        writer underneath is closed all the same."""
        with self._lock:
            self._close_failures += count

    def _add(self, kind: str, arg: float, then: Callable[[], None] | None) -> None:
        with self._lock:
            self._faults.append((kind, arg, then))

    def _take_fault(self) -> tuple[str, float, Callable[[], None] | None] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _take_close_failure(self) -> bool:
        with self._lock:
            if self._close_failures:
                self._close_failures -= 1
                return True
            return False

    # -- outages ------------------------------------------------------------------------------
    def start_outage(
        self, *, duration: float | None = None, error: Callable[[str], BaseException] | None = None
    ) -> None:
        """From now on (for ``duration`` seconds, or until :meth:`end_outage`), taking a writer,
        appending, creating readers and reading fail: with BackendUnavailableError, or with
        ``error(message)`` (e.g. a raw driver exception). Appends fail without writing anything."""
        with self._lock:
            self._outage_until = time.monotonic() + duration if duration is not None else float("inf")
            self._outage_error = error
        self.injected.append("outage")

    def end_outage(self) -> None:
        with self._lock:
            self._outage_until = None

    @property
    def in_outage(self) -> bool:
        with self._lock:
            return self._outage_until is not None and time.monotonic() < self._outage_until

    def _check_outage(self, what: str) -> None:
        if self.in_outage:
            message = f"injected outage: {what} failed"
            raise self._outage_error(message) if self._outage_error is not None else BackendUnavailableError(message)

    # -- the Backend contract -----------------------------------------------------------------
    _OUTAGE_CHECKED: ClassVar[dict[str, str]] = {
        "acquire_writer": "taking the writer of",
        "current_epoch": "reading the epoch of",
        "create_reader": "creating a reader of",
        "read_last": "reading the last entry of",
    }

    def check(self, operation: str, topic: str) -> None:
        if operation in self._OUTAGE_CHECKED:
            self._check_outage(f"{self._OUTAGE_CHECKED[operation]} {topic}")

    def acquire_writer(self, topic: str, *, mode: AcquireMode, timeout: float, name: str | None = None) -> RawWriter:
        return _FaultyWriter(self, super().acquire_writer(topic, mode=mode, timeout=timeout, name=name))

    def create_reader(self, topic: str, *, start: Any = EARLIEST) -> RawReader:
        return _FaultyReader(self, super().create_reader(topic, start=start))


class _FaultyWriter(RawWriter):
    def __init__(self, owner: FaultInjectingBackend, inner: RawWriter) -> None:
        self.owner = owner
        self.inner = inner
        self.topic = inner.topic
        self.epoch = inner.epoch

    def append(self, payloads: Sequence[bytes], *, timeout: float) -> list[Any]:
        if self.owner.in_outage:
            self.inner.close()
            raise UnknownOutcomeError(f"injected outage: no acknowledgement from {self.topic}")
        fault = self.owner._take_fault()
        if fault is None:
            return self.inner.append(payloads, timeout=timeout)
        kind, arg, then = fault
        self.owner.injected.append(kind)
        if kind == "delay":
            time.sleep(arg)
            return self.inner.append(payloads, timeout=timeout)
        if kind == "lose_ack":
            self.inner.append(payloads, timeout=timeout)
        elif kind == "partial" and arg:
            self.inner.append(payloads[: int(arg)], timeout=timeout)
        if then is not None:
            then()
        self.inner.close()
        raise UnknownOutcomeError(f"injected fault {kind!r} on {self.topic}")

    def has_waiters(self) -> bool:
        return self.inner.has_waiters()

    def close(self) -> None:
        self.inner.close()
        if self.owner._take_close_failure():
            self.owner.injected.append("close")
            raise RuntimeError(f"injected failure closing the writer of {self.topic}")


class _FaultyReader(RawReader):
    def __init__(self, owner: FaultInjectingBackend, inner: RawReader) -> None:
        self.owner = owner
        self.inner = inner
        self.topic = inner.topic

    def read_next(self, *, timeout: float) -> RawEntry | None:
        self.owner._check_outage(f"reading {self.topic}")
        return self.inner.read_next(timeout=timeout)

    def has_next(self) -> bool:
        self.owner._check_outage(f"reading {self.topic}")
        return self.inner.has_next()

    def close(self) -> None:
        self.inner.close()
