"""What the topic streams of one event loop share: one ``pulsar.asyncio`` client per connection,
and the check that a topic exists (asked once per loop, remembered for a while)."""

from __future__ import annotations

import asyncio
import functools
import weakref
from typing import Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.loop_shared import made_once

TOPIC_CHECK_TTL = 30.0
"""Seconds a topic found to exist is not asked about again by the streams of one loop."""

# event loop -> (connection, topic) -> when found to exist (loop time) / the check under way
_TOPICS_FOUND: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[ConnectionConfig, str], float]] = (
    weakref.WeakKeyDictionary()
)
_TOPIC_CHECKS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[ConnectionConfig, str], asyncio.Task[None]]
] = weakref.WeakKeyDictionary()


def _forget_check(checks: dict[Any, Any], key: Any, done: asyncio.Task[None]) -> None:
    if checks.get(key) is done:
        del checks[key]
    if not done.cancelled():
        done.exception()  # retrieved: its waiters raise it (or were all cancelled)


async def _check_topic(config: ConnectionConfig, topic: str) -> None:
    """Raise ConfigurationError when ``topic`` does not exist (asked of the admin API)."""
    from airflow_provider_pulsarstate.engine.backends.admin_async import AsyncPulsarAdmin
    from airflow_provider_pulsarstate.engine.offsets.pulsar_index import topic_path

    admin = AsyncPulsarAdmin(config, what="topic stream")
    try:
        partitioned = await admin.request("GET", f"{topic_path(topic)}/partitions", ok=(200, 404))
        if partitioned.status_code == 200 and int(partitioned.json().get("partitions", 0)) > 0:
            return
        stats = await admin.request("GET", f"{topic_path(topic)}/stats", ok=(200, 404))
        if stats.status_code == 404:
            raise ConfigurationError(
                f"topics: {topic} does not exist on {redact_url(config.url)} (create it first; "
                "subscribing never creates it)"
            )
    finally:
        await admin.aclose()


async def require_topic(config: ConnectionConfig, topic: str) -> None:
    """Refuse a topic that does not exist (a subscribe would create it). Streams of one loop
    share the check: a thousand watchers of one topic ask the admin API once, not a thousand
    times; a topic found is not asked about again for :data:`TOPIC_CHECK_TTL` seconds.

    :raises ConfigurationError: ``topic`` does not exist (named).
    """
    loop = asyncio.get_running_loop()
    key = (config, topic)
    found = _TOPICS_FOUND.setdefault(loop, {})
    if loop.time() - found.get(key, -TOPIC_CHECK_TTL) < TOPIC_CHECK_TTL:
        return
    checks = _TOPIC_CHECKS.setdefault(loop, {})
    check = checks.get(key)
    if check is None:
        check = checks[key] = loop.create_task(_check_topic(config, topic), name=f"check {topic}")
        check.add_done_callback(lambda done: _forget_check(checks, key, done))
    await asyncio.shield(check)  # a caller cancelled meanwhile leaves the check to the others
    found[key] = loop.time()


# event loop -> connection -> [client, streams using it]: one client (one broker connection, one
# set of client threads) per connection and loop, however many streams a triggerer runs.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ConnectionConfig, list[Any]]] = (
    weakref.WeakKeyDictionary()
)


# event loop -> connection -> the client being made (the first stream's, awaited by the others)
_MAKING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ConnectionConfig, asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _make_client(config: ConnectionConfig) -> Any:
    """A ``pulsar.asyncio`` client of ``config``. Blocking (importing the client library takes ~0.5 s
    of CPU, making a client tens of ms): run off the loop."""
    import pulsar.asyncio as pa

    from airflow_provider_pulsarstate.engine.backends.pulsar_client import client_options

    return pa.Client(config.url, **client_options(config))


@functools.cache
def bytes_schema() -> Any:
    """The one bytes schema every consumer and producer of the process passes: without it,
    ``pulsar.asyncio`` makes one per call, ~30 objects of garbage in reference cycles each (its
    JSON encoding), 30,000 for a thousand watchers subscribing together, which bring the process's
    next full garbage collection closer. It holds no per-consumer state."""
    import pulsar.schema

    return pulsar.schema.BytesSchema()


async def acquire_client(config: ConnectionConfig) -> Any:
    """The running loop's ``pulsar.asyncio`` client of ``config`` (made off the loop by the first
    stream, the others waiting for it); one more user."""
    loop = asyncio.get_running_loop()
    clients = _CLIENTS.setdefault(loop, {})
    entry = await made_once(
        clients, _MAKING.setdefault(loop, {}), config, lambda: _make_client(config), lambda c: [c, 0]
    )
    entry[1] += 1
    return entry[0]


def release_client(config: ConnectionConfig, client: Any) -> bool:
    """One user of ``client`` fewer; True when it was the last (the caller closes it)."""
    try:
        clients = _CLIENTS.get(asyncio.get_running_loop(), {})
    except RuntimeError:  # no running loop: nobody else can use it
        return True
    entry = clients.get(config)
    if entry is None or entry[0] is not client:
        return True
    entry[1] -= 1
    if entry[1] > 0:
        return False
    del clients[config]
    return True


__all__ = ["TOPIC_CHECK_TTL", "acquire_client", "release_client", "require_topic"]
