"""What a topic stream subscribes to and how it settles: :class:`TopicStreamOptions`, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_pulsarstate.engine.errors import ConfigurationError

INITIAL_POSITIONS = ("latest", "earliest")


@dataclass(frozen=True, kw_only=True)
class TopicStreamOptions:
    """How a :class:`TopicStream` subscribes and settles (checked on construction, errors name the field).

    :param topics: full topic names (``persistent://tenant/namespace/name``), at least one.
    :param subscription: the durable subscription's name.
    :param initial_position: where a new subscription starts: ``latest`` or ``earliest``.
    :param receiver_queue_size: messages the client prefetches per partition.
    :param redelivery_delay: seconds before a failed message comes again.
    :param dead_letter_topic: full topic name that takes messages given up on (None: never give up).
    :param max_redeliveries: failures of one message before it is given up: sent to
        ``dead_letter_topic``, or dropped with an error log without one.
    :param dead_letter_attempts: sends of one message to ``dead_letter_topic`` before it is
        skipped (logged, acknowledged, counted).
    :param dead_letter_retry_delay: seconds before the second send (doubling after each failure).
    :param consumer_name: the consumer's name on the broker (None: generated).
    """

    topics: tuple[str, ...]
    subscription: str
    initial_position: Literal["latest", "earliest"] = "latest"
    receiver_queue_size: int = 1000
    redelivery_delay: float = 1.0
    dead_letter_topic: str | None = None
    max_redeliveries: int = 3
    dead_letter_attempts: int = 3
    dead_letter_retry_delay: float = 1.0
    consumer_name: str | None = None

    def __post_init__(self) -> None:
        if not self.topics:
            raise ConfigurationError("topics: give at least one topic")
        for topic in self.topics:
            check_full_topic("topics", topic)
        if len(set(self.topics)) != len(self.topics):
            raise ConfigurationError(f"topics: {list(self.topics)} names a topic twice")
        if not isinstance(self.subscription, str) or not self.subscription.strip():
            raise ConfigurationError(f"subscription: must be a non-empty name, got {self.subscription!r}")
        if self.initial_position not in INITIAL_POSITIONS:
            raise ConfigurationError(
                f"initial_position: must be one of {', '.join(INITIAL_POSITIONS)}, got {self.initial_position!r}"
            )
        check_int("receiver_queue_size", self.receiver_queue_size, minimum=1)
        check_seconds("redelivery_delay", self.redelivery_delay, minimum=0.0)
        check_int("max_redeliveries", self.max_redeliveries, minimum=0)
        check_int("dead_letter_attempts", self.dead_letter_attempts, minimum=1)
        check_seconds("dead_letter_retry_delay", self.dead_letter_retry_delay, minimum=0.0)
        if self.dead_letter_topic is not None:
            check_full_topic("dead_letter_topic", self.dead_letter_topic)
            if self.dead_letter_topic in self.topics:
                raise ConfigurationError(f"dead_letter_topic: {self.dead_letter_topic!r} is one of the consumed topics")


def check_full_topic(name: str, topic: Any) -> None:
    if not isinstance(topic, str) or not topic.startswith("persistent://"):
        raise ConfigurationError(f"{name}: {topic!r} is not a full persistent://tenant/namespace/name topic")
    parts = topic[len("persistent://") :].split("/")
    if len(parts) != 3 or not all(parts):
        raise ConfigurationError(f"{name}: {topic!r} is not persistent://tenant/namespace/name")


def check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def check_seconds(name: str, value: Any, *, minimum: float, exclusive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value == float("inf"):
        raise ConfigurationError(f"{name}: must be a number of seconds, got {value!r}")
    if value < minimum or (exclusive and value == minimum):
        raise ConfigurationError(f"{name}: must be {'>' if exclusive else '>='} {minimum} seconds, got {value!r}")


__all__ = ["INITIAL_POSITIONS", "TopicStreamOptions", "check_full_topic", "check_int", "check_seconds"]
