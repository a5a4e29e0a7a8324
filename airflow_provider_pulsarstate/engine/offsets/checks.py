"""The checks and error texts of the offset API, written once for both back ends.

Every back end raises these errors with these texts (tests/engine/test_offset_conformance.py
asserts it on both): the base classes of :mod:`.base` call the argument checks before any I/O,
and the back ends build their errors here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import partition_topic_name
from airflow_provider_pulsarstate.engine.errors import (
    ClosedError,
    ConfigurationError,
    MessageNotFoundError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)

LATEST_SECONDS = 1e11
"""Year 5138 in seconds; any later "seconds" value is almost surely milliseconds (Kafka's unit)."""
LOG_OPTIONS = ("reader_pool_size", "reader_idle_timeout", "position_cache_size")
"""Options every back end's offset log accepts (the embedded one needs none of them)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_topic(topic: object) -> None:
    """A topic name: a non-empty str."""
    if not isinstance(topic, str) or not topic:
        raise ConfigurationError(f"topic must be a non-empty str, got {topic!r}")


def check_offset(value: object, name: str, topic: str) -> None:
    """An offset argument: a non-negative int (not a bool)."""
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise ConfigurationError(f"{name} must be a non-negative int, got {value!r} for topic {topic}")


def check_partition_arg(partition: object, topic: str) -> None:
    """A partition argument: an int (whether the topic has it, :func:`partition_error`, is asked later)."""
    if not _is_int(partition):
        raise UnknownPartitionError(f"partition must be an int, got {partition!r} for topic {topic}")


def check_read_limits(topic: str, *, max_messages: object, max_bytes: object, timeout: object) -> None:
    """``max_messages`` and ``max_bytes`` at least 1, ``timeout`` a non-negative number of seconds."""
    for name, value in (("max_messages", max_messages), ("max_bytes", max_bytes)):
        if not _is_int(value) or value < 1:  # type: ignore[operator]
            raise ConfigurationError(f"{name} must be at least 1, got {value!r} for topic {topic}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ConfigurationError(f"timeout must not be negative, got {timeout!r} for topic {topic}")


def check_timestamp(timestamp: object, topic: str) -> None:
    """A time to search for: finite seconds since the epoch (a value past the year 5000 is taken for
    Kafka's milliseconds and refused rather than answered with None)."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not math.isfinite(timestamp):
        raise ConfigurationError(f"timestamp must be seconds since the epoch, got {timestamp!r} for topic {topic}")
    if timestamp > LATEST_SECONDS:
        raise ConfigurationError(
            f"timestamp {timestamp!r} looks like milliseconds: pass seconds since the epoch "
            f"({timestamp / 1000!r}) for topic {topic}"
        )


def check_subscription(subscription: object, topic: str) -> None:
    """A subscription name: a str that is not blank."""
    if not isinstance(subscription, str) or not subscription.strip():
        raise ConfigurationError(f"subscription must not be empty, got {subscription!r} for topic {topic}")


def check_log_options(topic: str, options: Mapping[str, Any]) -> None:
    """The options of an offset log (:data:`LOG_OPTIONS`): known names, pool and cache sizes at
    least 1, a positive idle time-out."""
    unknown = sorted(set(options) - set(LOG_OPTIONS))
    if unknown:
        raise ConfigurationError(f"unknown option(s) for the offset log of {topic}: {', '.join(unknown)}")
    for name in ("reader_pool_size", "position_cache_size"):
        value = options.get(name, 1)
        if not _is_int(value) or value < 1:
            raise ConfigurationError(f"{name} must be at least 1, got {value!r} for topic {topic}")
    idle = options.get("reader_idle_timeout", 1.0)
    if isinstance(idle, bool) or not isinstance(idle, (int, float)) or not idle > 0:
        raise ConfigurationError(f"reader_idle_timeout must be positive, got {idle!r} for topic {topic}")


def check_partition_count(partitions: object, topic: str) -> None:
    """The partition count of a topic to create: a non-negative int (0: non-partitioned)."""
    if not _is_int(partitions) or partitions < 0:  # type: ignore[operator]
        raise ConfigurationError(f"partitions must be a non-negative int, got {partitions!r} for topic {topic}")


def check_message(topic: str, value: object, key: object, properties: object) -> None:
    """A message to publish: bytes-like ``value``, str or None ``key``, str-to-str ``properties`` or None."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ConfigurationError(f"message value must be bytes, got {type(value).__name__} for topic {topic}")
    if key is not None and not isinstance(key, str):
        raise ConfigurationError(f"message key must be a str or None, got {type(key).__name__} for topic {topic}")
    if properties is not None and (
        not isinstance(properties, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items())
    ):
        raise ConfigurationError(f"message properties must map str to str, got {properties!r} for topic {topic}")


def unknown_topic(where: str) -> UnknownTopicError:
    """The topic does not exist; ``where``: the back end's ``topic_url`` (names topic and store)."""
    return UnknownTopicError(f"topic {where} does not exist; create it first (create_topic), nothing here creates it")


def partition_error(topic: str, count: int, partition: int) -> UnknownPartitionError | None:
    """The error for ``partition`` of a topic with ``count`` partitions (0: non-partitioned), or
    None when the topic has it."""
    if count == 0:
        if partition == 0:
            return None
        return UnknownPartitionError(f"topic {topic} is not partitioned (use partition 0): no partition {partition}")
    if 0 <= partition < count:
        return None
    return UnknownPartitionError(f"topic {topic} has partitions 0..{count - 1}: no partition {partition}")


def stored_topic(topic: str, count: int, partition: int) -> str:
    """The topic ``partition`` of ``topic`` (``count`` partitions, 0: non-partitioned) is stored
    under: ``topic`` itself when not partitioned, else ``topic-partition-K`` as Pulsar names it.

    :raises UnknownPartitionError: the topic has no such partition.
    """
    error = partition_error(topic, count, partition)
    if error is not None:
        raise error
    return topic if count == 0 else partition_topic_name(topic, partition)


def check_commit_range(topic: str, partition: int, next_offset: int, beginning: int, end: int) -> None:
    """A committed offset lies in ``[beginning, end]`` (the end itself: everything consumed)."""
    if not beginning <= next_offset <= end:
        raise out_of_range(topic, partition, next_offset, beginning, end, commit=True)


def partition_needed(topic: str, count: int) -> UnknownPartitionError:
    """A partitioned topic addressed without a partition."""
    return UnknownPartitionError(f"topic {topic} has {count} partitions: pass partition= (0..{count - 1})")


def out_of_range(
    topic: str, partition: int, offset: int, beginning: int, end: int, *, commit: bool = False
) -> OffsetOutOfRangeError:
    """``offset`` outside ``[beginning, end]``; a read's error says how to reset (a commit has no reset)."""
    where = "below the first retained offset (trimmed)" if offset < beginning else "past the end"
    what = "commit offset" if commit else "offset"
    hint = "" if commit else " (pass auto_offset_reset='earliest' or 'latest' to reset)"
    return OffsetOutOfRangeError(
        f"{what} {offset} of topic {topic} partition {partition} is {where}: "
        f"the retained range is [{beginning}, {end}]{hint}",
        topic=topic,
        partition=partition,
        offset=offset,
        beginning=beginning,
        end=end,
    )


def topic_exists_differently(topic: str, existing: int, partitions: int) -> ConfigurationError:
    """``create_topic`` of a topic that exists with another partition count."""
    return ConfigurationError(f"topic {topic} exists with {existing} partitions, not {partitions}")


def not_an_address(address: object, store: str, expected: str) -> ConfigurationError:
    """``address`` is not a message address of ``store`` (``expected``: the form it has there)."""
    return ConfigurationError(f"{address!r} is not a message address of {store} (expected {expected!r})")


NOTHING_THERE = "nothing there (never written, topic deleted, or trimmed)"
"""Why :meth:`~.base.OffsetLog.read_at` found no message at an address the topic does not hold."""


def message_not_found(topic: str, address: str, where: str, why: str) -> MessageNotFoundError:
    """No message at ``address``; ``where``: the back end's ``topic_url`` of the topic read."""
    return MessageNotFoundError(f"no message at {address} of {where}: {why}", topic=topic, address=address)


def log_closed(topic: str) -> ClosedError:
    return ClosedError(f"offset log of {topic} is closed")


def publisher_closed(topic: str) -> ClosedError:
    return ClosedError(f"publisher of {topic} is closed")
