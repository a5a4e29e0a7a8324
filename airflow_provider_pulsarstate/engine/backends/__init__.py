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


def open_backend(config: ConnectionConfig) -> Backend:
    """The back end the config's URL selects (no network I/O happens here)."""
    if config.kind == "pulsar":
        from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend

        return PulsarBackend(config)
    from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend

    return EmbeddedBackend(config.embedded_path, busy_timeout=config.operation_timeout)


__all__ = ["EARLIEST", "AcquireMode", "Backend", "RawEntry", "RawReader", "RawWriter", "open_backend"]
