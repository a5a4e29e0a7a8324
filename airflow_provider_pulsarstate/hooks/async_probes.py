"""The hook's asynchronous side: every object a trigger polls without blocking its event loop.

Each factory does no I/O; the caller owns what it gets and closes it (``await x.aclose()``).
Inside a running event loop pass the config read by ``await hook.aget_config()``: the default,
:meth:`get_config`, reads the connection synchronously.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.leadership import (
    AsyncLeadershipProbe,
    AsyncLeaseObserver,
    open_async_leadership_probe,
)
from airflow_provider_pulsarstate.engine.offsets import AsyncOffsetProbe, open_async_probe
from airflow_provider_pulsarstate.engine.recipes.lease import DEFAULT_LEASE_TOPIC
from airflow_provider_pulsarstate.engine.recipes.shared_table_feed import AsyncTableFeed
from airflow_provider_pulsarstate.engine.topic_stream import TopicStream, open_topic_stream


class AsyncHookMethods:
    """The async probes, streams and feeds of :class:`~airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook`."""

    if TYPE_CHECKING:
        pulsarstate_conn_id: str

        def get_config(self) -> ConnectionConfig: ...

    def get_async_offset_probe(
        self, *, config: ConnectionConfig | None = None, freshness: float = 0.0
    ) -> AsyncOffsetProbe:
        """An :class:`~airflow_provider_pulsarstate.engine.offsets.base.AsyncOffsetProbe` for this
        connection: end and committed offsets read without blocking an event loop (no I/O here).

        :param config: the connection as read by ``await hook.aget_config()`` (inside a running
            event loop, e.g. a trigger); default: :meth:`get_config`, which reads it synchronously.

        :param freshness: seconds an answer may have been sent before a request it serves: the
            probes of one loop share equal admin requests (Pulsar; 0: each answer sent after the request).

        The caller owns the probe and closes it with ``await probe.aclose()``; topics passed to it
        are full names (``config.topic_name(short)``).
        """
        return open_async_probe(config if config is not None else self.get_config(), freshness=freshness)

    def get_async_topic_stream(
        self,
        topics: str | list[str] | tuple[str, ...],
        subscription: str,
        *,
        config: ConnectionConfig | None = None,
        dead_letter_topic: str | None = None,
        **options: Any,
    ) -> TopicStream:
        """A :class:`~airflow_provider_pulsarstate.engine.topic_stream.TopicStream`: messages of
        ``topics`` on the durable ``subscription``, received and settled without blocking an event
        loop (no I/O here: ``await stream.open()`` or ``async with``). The caller closes it.

        :param topics: a name or a list; short names use the connection's tenant/namespace.
        :param config: as :meth:`get_async_offset_probe` (pass ``await hook.aget_config()`` in a loop).
        :param dead_letter_topic: a short or full name (see TopicStreamOptions).
        :param options: ``initial_position``, ``receiver_queue_size``, ``redelivery_delay``,
            ``max_redeliveries``, ``consumer_name``.
        :raises ConfigurationError: the connection is embedded (named), or a topic name or option is invalid.
        """
        config = config if config is not None else self.get_config()
        names = [topics] if isinstance(topics, str) else list(topics)
        if not config.has_subscriptions:  # refused by open_topic_stream, naming the connection
            return open_topic_stream(config, topics=names, subscription=subscription, conn_id=self.pulsarstate_conn_id)
        return open_topic_stream(
            config,
            topics=[config.topic_name(t) for t in names],
            subscription=subscription,
            conn_id=self.pulsarstate_conn_id,
            dead_letter_topic=config.topic_name(dead_letter_topic) if dead_letter_topic else None,
            **options,
        )

    def get_async_leadership_probe(
        self, *, config: ConnectionConfig | None = None, freshness: float = 0.0
    ) -> AsyncLeadershipProbe:
        """An :class:`~airflow_provider_pulsarstate.engine.leadership.AsyncLeadershipProbe`:
        :meth:`get_leadership` without blocking an event loop (no I/O here). As
        :meth:`get_async_offset_probe`: pass the config read by ``await hook.aget_config()``
        inside a loop; the caller closes the probe (``await probe.aclose()``); topics are full names;
        ``freshness`` as there."""
        return open_async_leadership_probe(config if config is not None else self.get_config(), freshness=freshness)

    def get_async_lease_observer(
        self, topic: str | None = None, *, config: ConnectionConfig | None = None, freshness: float = 0.0
    ) -> AsyncLeaseObserver:
        """An :class:`~airflow_provider_pulsarstate.engine.leadership.AsyncLeaseObserver` on the
        lease log ``topic`` (default: :meth:`get_leases`'s): ``await observer.describe(name)``
        without acquiring and without blocking an event loop. No I/O here; the caller closes it
        (``await observer.aclose()``). ``freshness``: seconds a read of the log shared with the
        loop's other observers may have started before a describe."""
        config = config if config is not None else self.get_config()
        return AsyncLeaseObserver(config, config.topic_name(topic or DEFAULT_LEASE_TOPIC), freshness=freshness)

    def get_async_table_feed(
        self,
        topic: str,
        *,
        after: int | None,
        key_prefix: str | None = None,
        freshness: float = 0.0,
        config: ConnectionConfig | None = None,
    ) -> AsyncTableFeed:
        """:meth:`get_table_feed` for a trigger: never blocking an event loop, and through one
        reader of the table shared by every feed of the process (each with its own watermark; see
        :mod:`~airflow_provider_pulsarstate.engine.recipes.shared_table_feed`). No I/O here. Pass
        the config read by ``await hook.aget_config()`` inside a loop; the caller closes the feed
        (``await feed.aclose()``).

        :param freshness: seconds a poll may be answered from a shared read started before it.
        """
        config = config if config is not None else self.get_config()
        return AsyncTableFeed(config, config.topic_name(topic), after=after, key_prefix=key_prefix, freshness=freshness)
