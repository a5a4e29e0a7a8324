"""Plain messages to a Pulsar topic, and creating or deleting one (the Pulsar half of
:func:`~airflow_provider_pulsarstate.engine.offsets.open_publisher`,
:func:`~airflow_provider_pulsarstate.engine.offsets.create_topic` and
:func:`~airflow_provider_pulsarstate.engine.offsets.delete_topic_if_unchanged`)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Mapping
from typing import Any

import pulsar

from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, OperationTimeoutError
from airflow_provider_pulsarstate.engine.offsets.base import TopicPublisher, format_address
from airflow_provider_pulsarstate.engine.offsets.checks import (
    check_partition_count,
    check_topic,
    publisher_closed,
    topic_exists_differently,
    unknown_topic,
)
from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PULSAR_ADDRESS


class PulsarTopicPublisher(TopicPublisher):
    """Plain messages to an existing topic (partitioned: routed by key, round robin without one).

    :param batching: let the client batch messages into entries (several offsets per entry).
    :param chunking: split a message over the broker's size limit into chunks (no batching then);
        :meth:`OffsetLog.read_at` reads it whole.
    :param create: create a missing (non-partitioned) topic instead of raising; the existence check
        over the admin API is skipped (the broker creates the topic on first use, or it is created
        over the admin API when the namespace forbids that).
    :raises UnknownTopicError: the topic does not exist (create it with ``create_topic``).
    """

    def __init__(
        self, backend: PulsarBackend, topic: str, *, batching: bool = True, chunking: bool = False, create: bool = False
    ) -> None:
        check_topic(topic)
        self.topic = topic
        self._backend = backend
        if not create and backend.admin.partition_count(topic) is None:
            raise unknown_topic(backend.topic_url(topic))
        self._cond = threading.Condition()
        self._pending = 0
        self._error: str | None = None
        options: dict[str, Any] = dict(
            batching_enabled=batching and not chunking,
            chunking_enabled=chunking,
            batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
            send_timeout_millis=max(1, int(backend.config.operation_timeout * 1000)),
        )
        try:
            try:
                self._producer: pulsar.Producer | None = backend.client.create_producer(topic, **options)
            except pulsar.TopicNotFound:
                if not create:
                    raise
                # The namespace does not create topics on first use: create it over the admin API.
                create_pulsar_topic(backend, topic)
                self._producer = backend.client.create_producer(topic, **options)
        except pulsar.PulsarException as exc:
            raise backend._unreachable("creating a producer of", topic, exc) from exc

    def _send(self, value: bytes, *, key: str | None, properties: Mapping[str, str] | None) -> None:
        producer = self._producer
        if producer is None:
            raise publisher_closed(self.topic)
        with self._cond:
            if self._error is not None:
                raise BackendUnavailableError(f"an earlier send to {self.topic} failed: {self._error}")
            self._pending += 1
        kwargs: dict[str, Any] = {}
        if key is not None:
            kwargs["partition_key"] = key
        if properties:
            kwargs["properties"] = dict(properties)
        try:
            producer.send_async(bytes(value), self._sent, **kwargs)
        except pulsar.PulsarException as exc:
            self._sent(None, None)
            raise self._backend._unreachable("sending to", self.topic, exc) from exc

    def _publish(self, value: bytes, *, key: str | None, properties: Mapping[str, str] | None, timeout: float) -> str:
        producer = self._producer
        if producer is None:
            raise publisher_closed(self.topic)
        done = threading.Event()
        outcome: list[Any] = []

        def sent(result: Any, msg_id: Any) -> None:  # must not raise: the client would abort the process
            outcome[:] = [result, msg_id]
            done.set()

        kwargs: dict[str, Any] = {"partition_key": key} if key is not None else {}
        if properties:
            kwargs["properties"] = dict(properties)
        try:
            producer.send_async(bytes(value), sent, **kwargs)
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("sending to", self.topic, exc) from exc
        if not done.wait(timeout):
            raise OperationTimeoutError(f"a message to {self.topic} was not acknowledged within {timeout:.1f}s")
        result, msg_id = outcome
        if result == pulsar.Result.Timeout:
            raise OperationTimeoutError(f"a message to {self.topic} was not acknowledged in time (it may still land)")
        if result != pulsar.Result.Ok:
            raise BackendUnavailableError(f"sending to {self.topic} failed: {result}")
        partition = max(int(msg_id.partition()), 0)
        return format_address(PULSAR_ADDRESS, partition, base64.b64encode(msg_id.serialize()).decode())

    def _sent(self, result: Any, _msg_id: Any) -> None:
        with self._cond:
            self._pending -= 1
            if result != pulsar.Result.Ok and self._error is None:
                self._error = str(result)
            self._cond.notify_all()

    def flush(self, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(
                        f"{self._pending} messages to {self.topic} not acknowledged within {timeout:.1f}s"
                    )
                self._cond.wait(remaining)
            if self._error is not None:
                raise BackendUnavailableError(f"a send to {self.topic} failed: {self._error}")

    def close(self) -> None:
        producer = self._producer
        if producer is None:
            return
        try:
            self.flush(timeout=self._backend.config.operation_timeout)
        finally:
            self._producer = None
            close_quietly(producer)


def delete_pulsar_topic_if_last(backend: PulsarBackend, topic: str, last: bytes | None, *, timeout: float) -> bool:
    """Delete a non-partitioned topic only if its last entry is still ``last`` (None: empty) and no
    producer or reader is connected to it (the broker refuses a non-forced deletion then: a process
    that just published keeps its producer open, so its message is not lost). Returns whether deleted."""
    entry = backend.read_last(topic, timeout=timeout)
    now = None if entry is None else backend.encode_position(entry.position)
    if now != last:
        return False
    resp = backend.admin.request(
        "DELETE", backend.admin.topic_path(topic), ok=(200, 204, 404, 412), params={"force": "false"}
    )
    return resp.status_code != 412


def create_pulsar_topic(backend: PulsarBackend, topic: str, *, partitions: int = 0) -> None:
    """Create ``topic`` (``partitions`` > 0: partitioned); an identical existing one is fine.

    :raises ConfigurationError: it exists with another partition count, or ``partitions`` < 0.
    """
    check_topic(topic)
    check_partition_count(partitions, topic)
    admin = backend.admin
    for _attempt in range(2):
        existing = admin.partition_count(topic)
        if existing is not None:
            if existing != partitions:
                raise topic_exists_differently(topic, existing, partitions)
            return
        if partitions:
            created = admin.create_partitioned_topic(topic, partitions)
        else:
            created = admin.create_non_partitioned_topic(topic)
        if created:
            return


def close_quietly(resource: Any) -> None:
    try:
        resource.close()
    except pulsar.PulsarException:
        pass


__all__ = ["PulsarTopicPublisher", "close_quietly", "create_pulsar_topic", "delete_pulsar_topic_if_last"]
