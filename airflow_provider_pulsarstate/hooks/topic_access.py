"""The hook's plain topics and messages: pull consumers, publishers, topic creation, and the
messages ``PulsarMessageTrigger`` refers to by id."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.backends import Backend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.offsets import PullConsumer, TopicPublisher, open_publisher
from airflow_provider_pulsarstate.engine.offsets import create_topic as _create_topic
from airflow_provider_pulsarstate.engine.topic_stream import TopicMessage
from airflow_provider_pulsarstate.lineage.hook import report_topic


class TopicMethods:
    """The topic and message methods of :class:`~airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook`;
    what they open is closed by its :meth:`close`."""

    if TYPE_CHECKING:
        pulsarstate_conn_id: str

        def _open(self) -> tuple[ConnectionConfig, Backend]: ...

        def _own(self, obj: Any) -> Any: ...

    def get_pull_consumer(self, topic: str, subscription: str | None = None, **options: Any) -> PullConsumer:
        """A :class:`~airflow_provider_pulsarstate.engine.offsets.consumer.PullConsumer` on ``topic``:
        Kafka-style pulls by offset, commits on the durable ``subscription``. Closed by :meth:`close`.

        :param topic: a short name (the connection's tenant/namespace) or a full ``persistent://...``.
        :param subscription: the durable subscription for ``commit``/``committed``/``lag`` (None: pull only).
        :param options: keyword options of PullConsumer (``auto_offset_reset``, ``reader_pool_size``,
            ``reader_idle_timeout``, ``position_cache_size``).
        :raises ConfigurationError: invalid connection, topic name or option.
        """
        config, backend = self._open()
        name = config.topic_name(topic)
        report_topic(self, config, name, direction="input")
        return self._own(PullConsumer(backend, name, subscription, **options))

    def get_publisher(self, topic: str, *, batching: bool = True) -> TopicPublisher:
        """A :class:`~airflow_provider_pulsarstate.engine.offsets.base.TopicPublisher` of plain
        messages to ``topic`` (not for state logs). Closed (flushed) by :meth:`close`.

        :param batching: Pulsar batches messages into entries (the embedded log ignores it).
        """
        config, backend = self._open()
        name = config.topic_name(topic)
        report_topic(self, config, name, direction="output")
        return self._own(open_publisher(backend, name, batching=batching))

    def create_topic(self, topic: str, *, partitions: int = 0) -> str:
        """Create ``topic`` (``partitions`` > 0: partitioned); an identical existing topic is fine.

        :return: the full topic name.
        :raises ConfigurationError: invalid name, or it exists with another partition count.
        """
        config, backend = self._open()
        name = config.topic_name(topic)
        _create_topic(backend, name, partitions=partitions)
        return name

    def read_message(self, reference: Mapping[str, Any], *, timeout: float | None = None) -> TopicMessage:
        """The message an event entry of ``PulsarMessageTrigger`` refers to (its payload was too
        large to carry: ``payload_encoding == "reference"``); ``.payload`` holds the bytes and
        ``.decode_payload("json")`` parses them. Readable while the namespace's retention keeps it.

        :param reference: the entry (or any mapping with its ``topic`` and base64 ``message_id``).
        :param timeout: seconds to wait for the message (None: the connection's operation time-out).
        :raises ConfigurationError: ``reference`` lacks ``topic`` or a base64 ``message_id``, or the
            connection is embedded (no Pulsar messages to read).
        :raises MessageUnavailableError: the message is gone (trimmed by retention) or did not come in time.
        """
        topic, message_id = reference.get("topic"), reference.get("message_id")
        if not isinstance(topic, str) or not topic.startswith("persistent://"):
            raise ConfigurationError(f"read_message: reference has no full topic name, got {topic!r}")
        try:
            raw_id = base64.b64decode(message_id, validate=True) if isinstance(message_id, str) else b""
        except ValueError:
            raw_id = b""
        if not raw_id:
            raise ConfigurationError(f"read_message: reference has no base64 message_id, got {message_id!r}")
        config, backend = self._open()
        if not config.has_subscriptions:
            raise ConfigurationError(
                f"read_message: connection {self.pulsarstate_conn_id!r} is embedded; referenced messages live on Pulsar"
            )
        wait = config.operation_timeout if timeout is None else timeout
        return backend.read_topic_message(topic, raw_id, timeout=wait)
