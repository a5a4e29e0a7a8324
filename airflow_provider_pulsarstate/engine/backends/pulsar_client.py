"""What every Pulsar client of the engine shares: its options, error groups, and quiet release."""

from __future__ import annotations

import logging
from typing import Any

import pulsar

from airflow_provider_pulsarstate.engine.config import ConnectionConfig

log = logging.getLogger(__name__)

BUSY_ERRORS = (pulsar.ProducerFenced, pulsar.ProducerBusy)
"""Another producer holds the topic."""
UNREACHABLE_ERRORS = (pulsar.ConnectError, pulsar.Timeout, pulsar.LookupError, pulsar.ServiceUnitNotReady)
"""The broker could not be reached (or did not answer in time)."""


def client_options(cfg: ConnectionConfig) -> dict[str, Any]:
    """The keyword arguments of ``pulsar.Client`` (and ``pulsar.asyncio.Client``) for ``cfg``:
    time-outs, auth token, TLS trust and hostname verification; one place for every client."""
    kwargs: dict[str, Any] = dict(
        operation_timeout_seconds=max(1, round(cfg.operation_timeout)),
        connection_timeout_ms=max(1, int(cfg.operation_timeout * 1000)),
        # The client's own logger, not a Python one: a pulsar.Client holding a Python
        # logger can abort the process at exit (apache/pulsar-client-python#256),
        # which would fail an Airflow task that succeeded.
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        tls_validate_hostname=cfg.tls_hostname_verification,
    )
    if cfg.auth_token:
        kwargs["authentication"] = pulsar.AuthenticationToken(cfg.auth_token)
    if cfg.tls_trust_certs_file_path:
        kwargs["tls_trust_certs_file_path"] = cfg.tls_trust_certs_file_path
    return kwargs


def shutdown_quietly(client: pulsar.Client | None) -> None:
    """Drop a client's connections at once, without waiting for anything in flight."""
    if client is not None:
        try:
            client.shutdown()
        except pulsar.PulsarException as exc:
            log.debug("shutting a Pulsar client down: %s", exc)


def close_quietly(resource: pulsar.Client | pulsar.Producer | pulsar.Reader | None) -> None:
    """Close a pulsar-client object; one that is already closed or disconnected is fine."""
    if resource is not None:
        try:
            resource.close()
        except pulsar.PulsarException:
            pass
