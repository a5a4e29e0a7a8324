"""Offsets of a Pulsar topic read on an event loop (triggers): httpx on the admin API, never blocking.

The same answers as :class:`~airflow_provider_pulsarstate.engine.offsets.pulsar.PulsarOffsetLog`
(end offsets from the last entry's index, committed offsets from the subscription property), the
same auth token, CA bundle and per-request time-out as
:class:`~airflow_provider_pulsarstate.engine.backends.admin.PulsarAdmin`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from airflow_provider_pulsarstate.engine.backends.admin_async import AsyncPulsarAdmin
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.offsets.base import AsyncOffsetProbe
from airflow_provider_pulsarstate.engine.offsets.checks import unknown_topic
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import (
    cursor_positions,
    last_index_property,
    parse_committed,
    parse_entry_headers,
    partition_topic,
    subscription_path,
    topic_path,
)


class PulsarAsyncOffsetProbe(AsyncOffsetProbe):
    """End and committed offsets of Pulsar topics, awaited (one probe per triggerer task).

    Constructing it does no I/O. On first use it joins the running loop's HTTP client for its admin
    endpoint (one connection pool per loop and endpoint, however many probes); the last probe to
    close closes the client.

    :param config: a ``pulsar://`` connection (its admin URL, token, CA bundle and operation time-out).
    :param freshness: seconds an answer shared with the loop's other probes may have been sent
        before a request (see :class:`~airflow_provider_pulsarstate.engine.backends.admin_async.AsyncPulsarAdmin`).
    """

    def __init__(self, config: ConnectionConfig, *, freshness: float = 0.0) -> None:
        self._admin = AsyncPulsarAdmin(config, what="offset probe", freshness=freshness)
        self._shown = self._admin.shown_url

    def __repr__(self) -> str:
        return f"PulsarAsyncOffsetProbe({self._shown!r})"

    async def _request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200,), params: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        return await self._admin.request(method, path, ok=ok, params=params)

    async def _partition_topics(self, topic: str) -> dict[int, str]:
        resp = await self._request("GET", f"{topic_path(topic)}/partitions", ok=(200, 404))
        if resp.status_code == 404:
            raise unknown_topic(f"{topic} (broker {self._shown})")
        count = int(resp.json().get("partitions", 0))
        return {p: partition_topic(topic, count, p) for p in (range(count) if count else [0])}

    async def _examine(self, pt: str, position: str) -> httpx.Response:
        """The first or last retained entry's headers (412: no message retained)."""
        return await self._request(
            "HEAD",
            f"{topic_path(pt)}/examinemessage",
            ok=(200, 412),
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
        await self._admin.aclose()
