"""Giving a message up: publishing it to the dead-letter topic, retried, never wedging the stream.

pulsar-client's ``DeadLetterPolicy`` only works on ``Shared`` subscriptions, so a topic stream
(``Failover``) publishes its dead letters itself, with this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.retry import Backoff
from airflow_provider_pulsarstate.engine.streams.clients import bytes_schema
from airflow_provider_pulsarstate.engine.streams.message import TopicMessage, TopicStreamError
from airflow_provider_pulsarstate.engine.streams.options import TopicStreamOptions

log = logging.getLogger(__name__)

DEAD_LETTER_PROPERTY_PREFIX = "pulsarstate-dead-letter-"


class DeadLetterPublisher:
    """Publishes messages to ``options.dead_letter_topic`` with the client ``client()`` returns
    (the stream's, made at open); the producer is made on first use and remade after a failure."""

    def __init__(self, config: ConnectionConfig, options: TopicStreamOptions, client: Callable[[], Any]) -> None:
        self.config = config
        self.options = options
        self._client = client
        self._producer: Any = None

    async def send(self, message: TopicMessage, reason: str) -> bool:
        """Publish ``message`` (payload, key, event time and properties kept;
        ``pulsarstate-dead-letter-{topic,message-id,reason}`` added), retrying
        ``dead_letter_attempts`` times; False (logged) when every attempt failed."""
        target = self.options.dead_letter_topic
        kwargs = _send_options(message, reason)
        backoff = Backoff(initial=self.options.dead_letter_retry_delay, maximum=30.0)
        attempts = self.options.dead_letter_attempts
        for attempt in range(1, attempts + 1):
            try:
                producer = await self._producer_now()
                await asyncio.wait_for(producer.send(message.payload, **kwargs), self.config.operation_timeout)
            except Exception as exc:
                await self.aclose()
                if attempt == attempts:
                    log.error(
                        "skipping message %s of %s: dead-lettering it to %s failed %d times (last: %s: %s); reason "
                        "it was given up: %s",
                        message.id_text,
                        message.topic,
                        target,
                        attempts,
                        type(exc).__name__,
                        exc,
                        reason,
                    )
                    return False
                delay = backoff.next_delay()
                log.warning(
                    "dead-lettering message %s of %s to %s failed (%s: %s); retrying in %.1fs",
                    message.id_text,
                    message.topic,
                    target,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
            else:
                log.warning("dead-lettered message %s of %s to %s: %s", message.id_text, message.topic, target, reason)
                return True
        return False

    async def _producer_now(self) -> Any:
        if self._producer is None:
            assert self.options.dead_letter_topic is not None
            try:
                self._producer = await asyncio.wait_for(
                    self._client().create_producer(
                        self.options.dead_letter_topic, schema=bytes_schema(), batching_enabled=False
                    ),
                    self.config.operation_timeout,
                )
            except Exception as exc:
                raise TopicStreamError(
                    f"dead_letter_topic: cannot publish to {self.options.dead_letter_topic}: {type(exc).__name__}: {exc}"
                ) from exc
        return self._producer

    async def aclose(self) -> None:
        """Close the producer (a later :meth:`send` makes a new one); never raises."""
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(producer.close(), self.config.operation_timeout)
            except Exception:
                log.debug(
                    "closing the dead-letter producer of %s failed", self.options.dead_letter_topic, exc_info=True
                )


def _send_options(message: TopicMessage, reason: str) -> dict[str, Any]:
    properties = {
        **message.properties,
        f"{DEAD_LETTER_PROPERTY_PREFIX}topic": message.topic,
        f"{DEAD_LETTER_PROPERTY_PREFIX}message-id": message.id_text,
        f"{DEAD_LETTER_PROPERTY_PREFIX}reason": reason[:1000],
    }
    kwargs: dict[str, Any] = {"properties": properties}
    if message.key is not None:
        kwargs["partition_key"] = message.key
    if message.event_time is not None:
        kwargs["event_timestamp"] = message.event_time
    return kwargs


__all__ = ["DEAD_LETTER_PROPERTY_PREFIX", "DeadLetterPublisher"]
