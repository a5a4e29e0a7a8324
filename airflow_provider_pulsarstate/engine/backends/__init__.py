"""Back ends behind one contract (:mod:`.base`): a real Pulsar broker and the embedded log."""

from __future__ import annotations

from airflow_provider_pulsarstate.engine.backends.base import (
    EARLIEST,
    AcquireMode,
    Backend,
    RawEntry,
    RawReader,
    RawWriter,
)
from airflow_provider_pulsarstate.engine.config import ConnectionConfig


def backend_class(config: ConnectionConfig) -> type[Backend]:
    """The back end the config's URL selects, to ask what it offers before opening it."""
    if config.kind == "pulsar":
        from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend

        return PulsarBackend
    from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend

    return EmbeddedBackend


def open_backend(config: ConnectionConfig) -> Backend:
    """The back end the config's URL selects (no network I/O happens here)."""
    return backend_class(config).from_config(config)


__all__ = ["EARLIEST", "AcquireMode", "Backend", "RawEntry", "RawReader", "RawWriter", "backend_class", "open_backend"]
