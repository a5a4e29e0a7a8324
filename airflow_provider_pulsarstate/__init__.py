"""airflow-provider-pulsarstate: shared state for pipelines, kept in an Apache Pulsar topic.

The engine (this package's top level, ``backends``, ``recipes``) imports nothing from Airflow;
the Airflow layer lives in ``hooks``, ``operators``, ``sensors``, ``triggers`` and ``xcom``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from airflow_provider_pulsarstate.backends import AcquireMode, Backend, open_backend
from airflow_provider_pulsarstate.config import ConnectionConfig
from airflow_provider_pulsarstate.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    CorruptEntryError,
    OperationTimeoutError,
    PulsarStateError,
    SerializationError,
    UnknownOutcomeError,
    ValueTooLargeError,
    WriterBusyError,
    WriterFencedError,
)
from airflow_provider_pulsarstate.manager import Change, SharedStateManager
from airflow_provider_pulsarstate.recipes.map import MapChange, PulsarMap


def get_provider_info() -> dict:
    """Airflow provider metadata (entry point ``apache_airflow_provider``)."""
    from airflow_provider_pulsarstate.provider_info import provider_info

    return provider_info()


__all__ = [
    "AcquireMode", "Backend", "BackendUnavailableError", "Change", "ClosedError", "ConfigurationError",
    "ConnectionConfig", "CorruptEntryError", "MapChange", "OperationTimeoutError", "PulsarMap",
    "PulsarStateError", "SerializationError", "SharedStateManager", "UnknownOutcomeError",
    "ValueTooLargeError", "WriterBusyError", "WriterFencedError", "open_backend", "get_provider_info",
]
