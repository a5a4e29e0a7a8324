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
from airflow_provider_pulsarstate.engine.backends.embedded_offers import EmbeddedOffers
from airflow_provider_pulsarstate.engine.backends.pulsar_offers import PulsarOffers
from airflow_provider_pulsarstate.engine.config import ConnectionConfig


def backend_class(config: ConnectionConfig) -> type[Backend]:
    """The back end the config's URL selects, to ask what it offers before opening it."""
    if config.kind == "pulsar":
        from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend

        return PulsarBackend
    from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend

    return EmbeddedBackend


def backend_offers(config: ConnectionConfig) -> type[PulsarOffers] | type[EmbeddedOffers]:
    """What the back end the config selects offers before one is opened: its reachability check,
    async probes and HTTP message path. Asked without importing the back end's client library, so
    a task process pushing small XComs, or a triggerer starting probes on its loop, never loads
    ``pulsar``."""
    return PulsarOffers if config.kind == "pulsar" else EmbeddedOffers


def open_backend(config: ConnectionConfig) -> Backend:
    """The back end the config's URL selects (no network I/O happens here)."""
    return backend_class(config).from_config(config)


__all__ = [
    "EARLIEST",
    "AcquireMode",
    "Backend",
    "RawEntry",
    "RawReader",
    "RawWriter",
    "backend_class",
    "backend_offers",
    "open_backend",
]
