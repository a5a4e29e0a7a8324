"""Small helpers shared by the manager's parts: deadlines, error text, internal signals."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

from airflow_provider_pulsarstate.engine.errors import OperationTimeoutError, PulsarStateError


class Restage(PulsarStateError):
    """Internal: the state was rebuilt (or the applier failed on a fresh op); take the writer and stage again."""


class ReplayPaused(OperationTimeoutError):
    """Internal: a catch-up reached its caller's deadline; what was applied stays applied."""


def deadline_of(timeout: float | None) -> float | None:
    """The monotonic time ``timeout`` seconds from now (None: no deadline)."""
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def time_left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (never negative; None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while building a large state: the objects made are not garbage, and CPython
    would otherwise traverse the young heap again and again (it doubled the load time of a
    1M-key image)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for logs and error texts."""
    return f"{type(exc).__name__}: {exc}"
