"""Offset-based consumption of any topic, on both back ends (Kafka semantics, PCIP-5).

* :class:`PullConsumer`: pull by offset, commit on a durable subscription, beginning/end offsets,
  time search, lag;
* :class:`OffsetLog`: what each back end implements (:mod:`.pulsar`, :mod:`.embedded`);
* :class:`TopicPublisher`: plain messages to any topic; :func:`create_topic`;
* :class:`AsyncOffsetProbe`: offsets read without blocking an event loop (triggers).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_pulsarstate.engine.backends import Backend, backend_offers
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.offsets.base import (
    AsyncOffsetProbe,
    OffsetLog,
    PulledMessage,
    PullResult,
    StoredMessage,
    TopicPublisher,
)
from airflow_provider_pulsarstate.engine.offsets.consumer import PullConsumer


def open_offset_log(backend: Backend, topic: str, **options: Any) -> OffsetLog:
    """The back end's :class:`OffsetLog` of ``topic`` (no I/O until first use).

    ``options``: ``reader_pool_size``, ``reader_idle_timeout``, ``position_cache_size`` (Pulsar;
    the embedded log reads by position and needs neither pool nor cache).
    """
    return backend.underlying().open_offset_log(topic, **options)


def open_publisher(
    backend: Backend, topic: str, *, batching: bool = True, chunking: bool = False, create: bool = False
) -> TopicPublisher:
    """A :class:`TopicPublisher` for ``topic`` (``batching``: Pulsar batches messages into entries;
    ``chunking``: Pulsar splits a message over the broker's size limit into chunks, without batching;
    the embedded log has no message size limit and ignores both). ``create``: a missing topic is
    created (non-partitioned) instead of raising UnknownTopicError; on Pulsar without an admin call
    when the broker creates topics on first use."""
    return backend.underlying().open_publisher(topic, batching=batching, chunking=chunking, create=create)


def create_topic(backend: Backend, topic: str, *, partitions: int = 0) -> None:
    """Create ``topic`` (``partitions`` > 0: a partitioned topic); an identical existing one is fine.

    :raises ConfigurationError: it exists with another partition count.
    """
    backend.underlying().create_topic(topic, partitions=partitions)


def last_position(backend: Backend, topic: str, *, timeout: float) -> bytes | None:
    """The encoded position of ``topic``'s last entry (None: empty or missing): what
    :func:`delete_topic_if_unchanged` compares."""
    entry = backend.read_last(topic, timeout=timeout)
    return None if entry is None else backend.encode_position(entry.position)


def delete_topic_if_unchanged(backend: Backend, topic: str, *, last: bytes | None, timeout: float) -> bool:
    """Delete a non-partitioned topic only if nothing was appended since :func:`last_position`
    answered ``last`` (compare-and-delete). Embedded: the check and the deletion are one transaction.
    Pulsar: the check, then a non-forced deletion, which the broker refuses while a producer or
    reader is connected (a process that just published keeps its producer open). Returns whether
    it was deleted."""
    return backend.underlying().delete_topic_if_last(topic, last, timeout=timeout)


def open_async_probe(config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncOffsetProbe:
    """An :class:`AsyncOffsetProbe` for the back end ``config`` selects (no I/O until first use);
    ``freshness``: see :class:`~airflow_provider_pulsarstate.engine.offsets.pulsar_async.PulsarAsyncOffsetProbe`."""
    return backend_offers(config).open_async_offset_probe(config, freshness=freshness)


__all__ = [
    "AsyncOffsetProbe",
    "OffsetLog",
    "PullConsumer",
    "PullResult",
    "PulledMessage",
    "StoredMessage",
    "TopicPublisher",
    "create_topic",
    "delete_topic_if_unchanged",
    "last_position",
    "open_async_probe",
    "open_offset_log",
    "open_publisher",
]
