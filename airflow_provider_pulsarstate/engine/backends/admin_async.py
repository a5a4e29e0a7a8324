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
from airflow_provider_pulsarstate.engine.backends.pulsar_compat import preload_async_http_transport
from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import ClosedError
from airflow_provider_pulsarstate.engine.loop_shared import made_once


@functools.lru_cache(maxsize=8)
def _ssl_context(cafile: str | None) -> ssl.SSLContext:
    """One TLS context per CA bundle per process, shared by every probe.

    Building one loads the CA store (about 40 ms of blocking work): a context per probe stalled a
    triggerer's event loop for seconds when 200 offset triggers started at once. An explicit CA
    bundle wins over ``$SSL_CERT_FILE`` & co., as in PulsarAdmin.
    """
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


CONNECTIONS_PER_CLIENT = 2
"""Connections the one HTTP client of a loop and admin endpoint keeps at most: requests of many
probes are shared (:data:`SHARED_METHODS`), so a thousand probes need no more."""

SHARED_METHODS = ("GET", "HEAD")
"""Requests that read only: equal ones of a loop's probes share one round trip (see AsyncPulsarAdmin)."""

MAX_KEPT_ANSWERS = 256
"""Answered requests a shared client keeps for later probes at most (the finished ones go first)."""

_ClientKey = tuple[str, "str | None", "str | None", float]
_RequestKey = tuple[str, str, tuple[tuple[str, str], ...]]


class _Shared:
    """The HTTP client of one loop and admin endpoint, its users and its requests under way."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.users = 0
        # request -> (loop time it was sent, None while not yet sent; the request's task)
        self.answers: dict[_RequestKey, tuple[float | None, asyncio.Task[httpx.Response]]] = {}


# event loop -> admin endpoint and credentials -> the shared client
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_ClientKey, _Shared]] = weakref.WeakKeyDictionary()


def _client_key(config: ConnectionConfig) -> _ClientKey:
    return (
        config.resolved_admin_url,
        config.auth_token,
        config.tls_trust_certs_file_path,
        float(config.operation_timeout),
    )


# event loop -> admin endpoint and credentials -> the client being made (awaited by every probe)
_MAKING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_ClientKey, asyncio.Future[httpx.AsyncClient]]] = (
    weakref.WeakKeyDictionary()
)


def _make_client(config: ConnectionConfig) -> httpx.AsyncClient:
    """The HTTP client of ``config``'s admin endpoint. Blocking (loading the CA store takes 40-200 ms
    of CPU, the first request's transport modules as long to import): run off the loop."""
    preload_async_http_transport()

    headers = {"Authorization": f"Bearer {config.auth_token}"} if config.auth_token else {}
    return httpx.AsyncClient(
        base_url=f"{config.resolved_admin_url}/admin/v2/",
        headers=headers,
        limits=httpx.Limits(max_connections=CONNECTIONS_PER_CLIENT, max_keepalive_connections=CONNECTIONS_PER_CLIENT),
        verify=_ssl_context(config.tls_trust_certs_file_path),
        timeout=config.operation_timeout,
    )


async def _acquire_client(config: ConnectionConfig) -> _Shared:
    """The running loop's HTTP client for ``config``'s admin endpoint (made off the loop once, the
    probes asking meanwhile waiting for it), one more user."""
    loop = asyncio.get_running_loop()
    key = _client_key(config)
    clients = _CLIENTS.setdefault(loop, {})
    shared = await made_once(clients, _MAKING.setdefault(loop, {}), key, lambda: _make_client(config), _Shared)
    shared.users += 1
    return shared


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: its callers raise it (or were all cancelled)


async def _release_client(config: ConnectionConfig, shared: _Shared) -> None:
    """Drop one probe's use of a shared client; the last one out closes it."""
    shared.users -= 1
    if shared.users > 0:
        return
    clients = _CLIENTS.get(asyncio.get_running_loop(), {})
    if clients.get(_client_key(config)) is shared:
        del clients[_client_key(config)]
    await shared.client.aclose()


class AsyncPulsarAdmin:
    """Admin requests of one probe, over the running loop's one client for its endpoint.

    Read-only requests (:data:`SHARED_METHODS`) equal in method, path and parameters are shared by
    the probes of the loop: a request is answered by one that was sent at most ``freshness``
    seconds before it was made, or by one not yet sent (those made in the same turn of the loop go
    out as one); a thousand probes polling one topic cost a few requests per ``freshness``
    seconds, not a thousand. ``freshness=0`` (the default): every answer was sent after the
    request was made. A shared request runs as a task of its own: a cancelled caller never cancels
    it for the others.

    Constructing it does no I/O; the first request joins the shared client, :meth:`aclose` leaves
    it (the last user closes it).

    :param config: a ``pulsar://`` connection (its admin URL, token, CA bundle and operation time-out).
    :param what: how errors name the owner (e.g. ``"offset probe"``).
    :param freshness: seconds an answer may have been sent before a request it serves.
    """

    def __init__(self, config: ConnectionConfig, *, what: str = "admin client", freshness: float = 0.0) -> None:
        self._config = config
        self.url = config.resolved_admin_url
        self.shown_url = redact_url(self.url)
        self._what = what
        self._freshness = max(0.0, float(freshness))
        self._shared: _Shared | None = None
        self._closed = False

    async def _http(self) -> _Shared:
        if self._closed:
            raise ClosedError(f"{self._what} of {self.shown_url} is closed")
        if self._shared is None:
            shared = await _acquire_client(self._config)
            if self._closed or self._shared is not None:  # closed, or another request joined, meanwhile
                await _release_client(self._config, shared)
            else:
                self._shared = shared
            if self._closed:
                raise ClosedError(f"{self._what} of {self.shown_url} is closed")
        assert self._shared is not None
        return self._shared

    async def request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200,), params: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        """One request (``path`` under ``/admin/v2/``); BackendUnavailableError naming URL and status otherwise."""
        try:
            shared = await self._http()
            if method in SHARED_METHODS:
                resp = await self._shared_request(shared, method, path, params)
            else:
                resp = await shared.client.request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise admin_unreachable(
                exc, method, path, url=self.url, shown_url=self.shown_url, origin=self._config.field_origin("admin_url")
            ) from None
        check_admin_status(method, path, resp.status_code, resp.text, ok=ok, shown_url=self.shown_url)
        return resp

    async def _shared_request(
        self, shared: _Shared, method: str, path: str, params: Mapping[str, Any] | None
    ) -> httpx.Response:
        loop = asyncio.get_running_loop()
        key: _RequestKey = (method, path, tuple(sorted((str(k), str(v)) for k, v in (params or {}).items())))
        held = shared.answers.get(key)
        # joinable: not sent yet, or sent at most ``freshness`` seconds ago (under way or answered)
        if held is None or (held[0] is not None and loop.time() - held[0] >= self._freshness):
            if len(shared.answers) > MAX_KEPT_ANSWERS:
                for k in [k for k, (_, t) in shared.answers.items() if t.done()]:
                    del shared.answers[k]
            task = loop.create_task(self._send(shared, key, method, path, params))
            task.add_done_callback(_retrieve)
            held = shared.answers[key] = (None, task)
        return await asyncio.shield(held[1])

    @staticmethod
    async def _send(
        shared: _Shared, key: _RequestKey, method: str, path: str, params: Mapping[str, Any] | None
    ) -> httpx.Response:
        task = asyncio.current_task()
        held = shared.answers.get(key)
        if held is not None and held[1] is task:
            shared.answers[key] = (asyncio.get_running_loop().time(), task)  # sent now: later requests may not join
        try:
            return await shared.client.request(method, path, params=params)
        except BaseException:
            held = shared.answers.get(key)
            if held is not None and held[1] is task:
                del shared.answers[key]  # a failure serves no later request
            raise

    async def aclose(self) -> None:
        """Leave the shared client (idempotent)."""
        self._closed = True
        shared, self._shared = self._shared, None
        if shared is not None:
            await _release_client(self._config, shared)
