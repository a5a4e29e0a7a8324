"""Fence administration on any state log (a PulsarMap's, a StateTable's, a bare manager's).

:func:`reset_fence` replays the log with an applier that keeps nothing (the rows are not needed,
only the fences) and appends the reset record through the log's writer, like any write.
"""

from __future__ import annotations

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import TableNotFoundError
from airflow_provider_pulsarstate.engine.fencing import FenceKey
from airflow_provider_pulsarstate.engine.genesis import read_beginning
from airflow_provider_pulsarstate.engine.manager import SharedStateManager


def reset_fence(
    backend: Backend,
    topic: str,
    name: str,
    *,
    lease_log: str | None = None,
    operation_timeout: float = 30.0,
    acquire_timeout: float = 30.0,
) -> dict[FenceKey, int]:
    """Remove the fence of lease ``name`` from the state log ``topic``, with a record in the log
    (:meth:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager.reset_fence`).

    :param lease_log: the lease log whose fence goes (a topic, or a ``topic#id`` key); None: every one.
    :returns: the fences removed ((lease log, name) -> token).
    :raises TableNotFoundError: the log is empty (nothing is written to it).
    :raises ConfigurationError: a bad name or lease log (names the field).
    """
    if read_beginning(backend, topic, timeout=operation_timeout).empty:
        raise TableNotFoundError(topic=topic)
    manager: SharedStateManager[None, bytes] = SharedStateManager(
        backend,
        topic,
        initializer=_nothing,
        applier=_ignore,
        op_serializer=bytes,
        op_deserializer=bytes,
        operation_timeout=operation_timeout,
        acquire_timeout=acquire_timeout,
        writer_idle_timeout=None,
    )
    with manager:
        return manager.reset_fence(name, lease_log=lease_log)


def _nothing() -> None:
    return None


def _ignore(state: None, op: bytes) -> None:
    return None
