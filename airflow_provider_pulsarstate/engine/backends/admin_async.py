"""The Pulsar admin REST API awaited on an event loop (triggers): one shared httpx client per loop and endpoint.

The same auth token, CA bundle, per-request time-out and error messages as
:class:`~airflow_provider_pulsarstate.engine.backends.admin.PulsarAdmin`, never blocking the loop.
Used by the async offset probe and the async leadership probe.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import weakref
from typing import Any, Mapping

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


_ClientKey = tuple[str, "str | None", "str | None", float]
# event loop -> admin endpoint and credentials -> [client, probes using it]
_CLIENTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_ClientKey, list[Any]]]" = weakref.WeakKeyDictionary()


def _acquire_client(config: ConnectionConfig) -> tuple[dict[_ClientKey, list[Any]], _ClientKey, httpx.AsyncClient]:
    """The running loop's HTTP client for ``config``'s admin endpoint, shared by every probe on it.

    A triggerer runs hundreds of probes on one loop: one client each cost a connection pool, an
    environment scan and a keep-alive connection per trigger, and starting them together stalled
    the loop. Synchronous, so two probes starting at once cannot both create one.
    """
    key: _ClientKey = (config.resolved_admin_url, config.auth_token, config.tls_trust_certs_file_path,
                       float(config.operation_timeout))
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    entry = per_loop.get(key)
    if entry is None:
        headers = {"Authorization": f"Bearer {config.auth_token}"} if config.auth_token else {}
        client = httpx.AsyncClient(
            base_url=f"{config.resolved_admin_url}/admin/v2/", headers=headers,
            verify=_ssl_context(config.tls_trust_certs_file_path), timeout=config.operation_timeout,
        )
        entry = per_loop[key] = [client, 0]
    entry[1] += 1
    return per_loop, key, entry[0]


async def _release_client(per_loop: dict[_ClientKey, list[Any]], key: _ClientKey, client: httpx.AsyncClient) -> None:
    """Drop one probe's use of a shared client; the last one out closes it."""
    entry = per_loop.get(key)
    if entry is None or entry[0] is not client:
        await client.aclose()
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del per_loop[key]
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
        self._shared: tuple[dict[_ClientKey, list[Any]], _ClientKey] | None = None
        self._closed = False

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise ClosedError(f"{self._what} of {self.shown_url} is closed")
        if self._client is None:
            per_loop, key, self._client = _acquire_client(self._config)
            self._shared = (per_loop, key)
        return self._client

    async def request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200,), params: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        """One request (``path`` under ``/admin/v2/``); BackendUnavailableError naming URL and status otherwise."""
        try:
            resp = await self._http().request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise admin_unreachable(exc, method, path, url=self.url, shown_url=self.shown_url) from None
        check_admin_status(method, path, resp.status_code, resp.text, ok=ok, shown_url=self.shown_url)
        return resp

    async def aclose(self) -> None:
        """Leave the shared client (idempotent)."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None and self._shared is not None:
            await _release_client(*self._shared, client)
