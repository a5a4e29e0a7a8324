"""Offsets of a Pulsar topic read on an event loop (triggers): httpx on the admin API, never blocking.

The same answers as :class:`~airflow_provider_pulsarstate.engine.offsets.pulsar.PulsarOffsetLog`
(end offsets from the last entry's index, committed offsets from the subscription property), the
same auth token, CA bundle and per-request time-out as
:class:`~airflow_provider_pulsarstate.engine.backends.admin.PulsarAdmin`.
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
from airflow_provider_pulsarstate.engine.errors import ClosedError, UnknownTopicError
from airflow_provider_pulsarstate.engine.offsets.base import AsyncOffsetProbe
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import (
    cursor_positions,
    last_index_property,
    parse_committed,
    parse_entry_headers,
    partition_topic,
    subscription_path,
    topic_path,
)


@functools.lru_cache(maxsize=8)
def _ssl_context(cafile: str | None) -> ssl.SSLContext:
    """One TLS context per CA bundle per process, shared by every probe.

    Building one loads the CA store (about 40 ms of blocking work): a context per probe stalled a
    triggerer's event loop for seconds when 200 offset triggers started at once. An explicit CA
    bundle wins over ``$SSL_CERT_FILE`` & co., as in PulsarAdmin.
    """
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


PROBES_PER_CLIENT = 8
"""Probes on one loop share HTTP clients, up to this many each. One client per probe made 100
triggers starting together stall the loop ~0.5 s; one client for all made every poll cost ~40% more
CPU (a connection pool's bookkeeping grows with its connections and waiting requests)."""

_ClientKey = tuple[str, "str | None", "str | None", float]
# event loop -> admin endpoint and credentials -> [[client, probes using it], ...]
_CLIENTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_ClientKey, list[list[Any]]]]" = (
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


class PulsarAsyncOffsetProbe(AsyncOffsetProbe):
    """End and committed offsets of Pulsar topics, awaited (one probe per triggerer task).

    Constructing it does no I/O. On first use it joins an HTTP client of the running loop for its
    admin endpoint (shared by up to :data:`PROBES_PER_CLIENT` probes); the last probe to close a
    client closes it.

    :param config: a ``pulsar://`` connection (its admin URL, token, CA bundle and operation time-out).
    """

    def __init__(self, config: ConnectionConfig) -> None:
        self._config = config
        self._url = config.resolved_admin_url
        self._shown = redact_url(self._url)
        self._client: httpx.AsyncClient | None = None
        self._shared: list[list[Any]] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"PulsarAsyncOffsetProbe({self._shown!r})"

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise ClosedError(f"offset probe of {self._shown} is closed")
        if self._client is None:
            self._shared, self._client = _acquire_client(self._config)
        return self._client

    async def _request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200,), params: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        try:
            resp = await self._http().request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise admin_unreachable(exc, method, path, url=self._url, shown_url=self._shown) from None
        check_admin_status(method, path, resp.status_code, resp.text, ok=ok, shown_url=self._shown)
        return resp

    async def _partition_topics(self, topic: str) -> dict[int, str]:
        resp = await self._request("GET", f"{topic_path(topic)}/partitions", ok=(200, 404))
        if resp.status_code == 404:
            raise UnknownTopicError(f"topic {topic} does not exist on {self._shown}")
        count = int(resp.json().get("partitions", 0))
        return {p: partition_topic(topic, count, p) for p in (range(count) if count else [0])}

    async def _examine(self, pt: str, position: str) -> httpx.Response:
        """The first or last retained entry's headers (412: no message retained)."""
        return await self._request(
            "HEAD", f"{topic_path(pt)}/examinemessage", ok=(200, 412),
            params={"initialPosition": position, "messagePosition": 1},
        )

    async def _end(self, pt: str) -> int:
        resp = await self._examine(pt, "latest")
        if resp.status_code == 200:
            return parse_entry_headers(resp.headers, pt)[0] + 1
        stats = (await self._request("GET", f"{topic_path(pt)}/internalStats")).json()
        return last_index_property(stats) + 1

    async def _beginning(self, pt: str) -> int:
        resp = await self._examine(pt, "earliest")
        if resp.status_code == 200:
            last, count = parse_entry_headers(resp.headers, pt)
            return last - count + 1
        return await self._end(pt)

    async def _entry(self, pt: str, ledger: int, entry: int) -> tuple[int, int] | None:
        resp = await self._request("HEAD", f"{topic_path(pt)}/ledger/{ledger}/entry/{entry}", ok=(200, 404, 500))
        if resp.status_code != 200:
            return None
        last, count = parse_entry_headers(resp.headers, pt)
        return last - count + 1, last

    async def _committed(self, pt: str, subscription: str) -> int | None:
        resp = await self._request("GET", f"{subscription_path(pt, subscription)}/properties", ok=(200, 404))
        if resp.status_code == 404:
            return None
        value = parse_committed(resp.json() or {})
        if value is not None:
            return value
        # A subscription committed by other means: the offset after its mark-delete position.
        stats = (await self._request("GET", f"{topic_path(pt)}/internalStats")).json()
        mark, read = cursor_positions(stats, subscription)
        if mark is not None and (found := await self._entry(pt, *mark)) is not None:
            return found[1] + 1
        if read is not None and (found := await self._entry(pt, *read)) is not None:
            return found[0]
        return await self._beginning(pt)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        parts = await self._partition_topics(topic)
        ends = await asyncio.gather(*(self._end(pt) for pt in parts.values()))
        return dict(zip(parts, ends))

    async def committed(self, topic: str, subscription: str) -> dict[int, int | None]:
        parts = await self._partition_topics(topic)
        values = await asyncio.gather(*(self._committed(pt, subscription) for pt in parts.values()))
        return dict(zip(parts, values))

    async def aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None and self._shared is not None:
            await _release_client(self._shared, client)
