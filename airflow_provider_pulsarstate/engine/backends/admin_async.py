"""The Pulsar admin REST API awaited on an event loop (triggers): httpx clients shared per loop and endpoint.

The same auth token, CA bundle, per-request time-out and error messages as
:class:`~airflow_provider_pulsarstate.engine.backends.admin.PulsarAdmin`, never blocking the loop.
Used by the async offset probe and the async leadership probe.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import weakref
from collections.abc import Mapping
from typing import Any

import httpx

from airflow_provider_pulsarstate.engine.backends.admin import admin_unreachable, check_admin_status
from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import ClosedError


@functools.lru_cache(maxsize=8)
def _ssl_context(cafile: str | None) -> ssl.SSLContext:
    """One TLS context per CA bundle per process, shared by every probe.

    Building one loads the CA store (about 40 ms of blocking work): a context per probe stalled a
    triggerer's event loop for seconds when 200 offset triggers started at once. An explicit CA
    bundle wins over ``$SSL_CERT_FILE`` & co., as in PulsarAdmin.
    """
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


PROBES_PER_CLIENT = 32
"""Probes on one loop share HTTP clients, up to this many each, and a client keeps at most
:data:`CONNECTIONS_PER_CLIENT` connections: a thousand probes hold at most ~128 admin connections.
One client per probe made 100 triggers starting together stall the loop ~0.5 s and a thousand
probes hold a thousand sockets; one client for all made every poll cost ~40% more CPU (a
connection pool's bookkeeping grows with its connections and waiting requests)."""

CONNECTIONS_PER_CLIENT = 4

_ClientKey = tuple[str, "str | None", "str | None", float]
# event loop -> admin endpoint and credentials -> [[client, probes using it], ...]
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_ClientKey, list[list[Any]]]] = (
    weakref.WeakKeyDictionary()
)


def _acquire_client(config: ConnectionConfig) -> tuple[list[list[Any]], httpx.AsyncClient]:
    """An HTTP client of the running loop for ``config``'s admin endpoint, shared with at most
    :data:`PROBES_PER_CLIENT` - 1 other probes. Synchronous: probes starting at once cannot race."""
    key: _ClientKey = (config.resolved_admin_url, config.auth_token, config.tls_trust_certs_file_path,
                       float(config.operation_timeout))
    entries = _CLIENTS.setdefault(asyncio.get_running_loop(), {}).setdefault(key, [])
    entry = next((e for e in entries if e[1] < PROBES_PER_CLIENT), None)
    if entry is None:
        headers = {"Authorization": f"Bearer {config.auth_token}"} if config.auth_token else {}
        client = httpx.AsyncClient(
            base_url=f"{config.resolved_admin_url}/admin/v2/", headers=headers,
            limits=httpx.Limits(max_connections=CONNECTIONS_PER_CLIENT, max_keepalive_connections=CONNECTIONS_PER_CLIENT),
            verify=_ssl_context(config.tls_trust_certs_file_path), timeout=config.operation_timeout,
        )
        entry = [client, 0]
        entries.append(entry)
    entry[1] += 1
    return entries, entry[0]


async def _release_client(entries: list[list[Any]], client: httpx.AsyncClient) -> None:
    """Drop one probe's use of a shared client; the last one out closes it."""
    for i, entry in enumerate(entries):
        if entry[0] is client:
            entry[1] -= 1
            if entry[1] > 0:
                return
            del entries[i]
            break
    await client.aclose()


class AsyncPulsarAdmin:
    """Admin requests of one probe, over the running loop's shared client for its endpoint.

    Constructing it does no I/O; the first request joins the shared client, :meth:`aclose` leaves
    it (the last user closes it).

    :param config: a ``pulsar://`` connection (its admin URL, token, CA bundle and operation time-out).
    :param what: how errors name the owner (e.g. ``"offset probe"``).
    """

    def __init__(self, config: ConnectionConfig, *, what: str = "admin client") -> None:
        self._config = config
        self.url = config.resolved_admin_url
        self.shown_url = redact_url(self.url)
        self._what = what
        self._client: httpx.AsyncClient | None = None
        self._shared: list[list[Any]] | None = None
        self._closed = False

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise ClosedError(f"{self._what} of {self.shown_url} is closed")
        if self._client is None:
            self._shared, self._client = _acquire_client(self._config)
        return self._client

    async def request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200,), params: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        """One request (``path`` under ``/admin/v2/``); BackendUnavailableError naming URL and status otherwise."""
        try:
            resp = await self._http().request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise admin_unreachable(
                exc, method, path, url=self.url, shown_url=self.shown_url, origin=self._config.field_origin("admin_url")
            ) from None
        check_admin_status(method, path, resp.status_code, resp.text, ok=ok, shown_url=self.shown_url)
        return resp

    async def aclose(self) -> None:
        """Leave the shared client (idempotent)."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None and self._shared is not None:
            await _release_client(self._shared, client)
