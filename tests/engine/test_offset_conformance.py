"""The offset API's errors are one class and one text on both back ends (real broker for Pulsar).

Each case below is run on the embedded log and on Pulsar (the ``backend`` fixture) and states the
exact error class and message; a message may only differ where it names the store (the
back end's ``topic_url``) or the retained range the back end reports. Nothing a bad call
does may change the topic: every case is followed by a check that nothing was published or
committed.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConnectionConfig
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    ClosedError,
    ConfigurationError,
    MessageNotFoundError,
    OffsetOutOfRangeError,
    PulsarStateError,
    UnknownPartitionError,
    UnknownTopicError,
)
from airflow_provider_pulsarstate.engine.offsets import (
    PullConsumer,
    create_topic,
    open_async_probe,
    open_offset_log,
    open_publisher,
)

FLUSH = 30.0


@dataclass
class World:
    """A topic with three messages (``topic``), a partitioned one (``parted``, 2 partitions) and a
    name nothing was created under (``missing``), on one back end."""

    backend: Backend
    config: ConnectionConfig
    topic: str
    parted: str
    missing: str
    made: list[Any]

    def keep(self, closable: Any) -> Any:
        """``closable``, closed at the end of the test."""
        self.made.append(closable)
        return closable

    def url(self, topic: str) -> str:
        return self.backend.topic_url(topic)


@pytest.fixture
def world(backend: Backend, backend_config: ConnectionConfig, topic: str) -> Iterator[World]:
    parted = f"{topic}-parted"
    create_topic(backend, topic)
    create_topic(backend, parted, partitions=2)
    with open_publisher(backend, topic, batching=False) as publisher:
        for i in range(3):
            publisher.send(f"m{i}".encode())
        publisher.flush(timeout=FLUSH)
    w = World(
        backend, backend_config, topic, parted, f"persistent://public/default/missing-{uuid.uuid4().hex[:12]}", []
    )
    yield w
    for closable in reversed(w.made):
        try:
            closable.close()
        except PulsarStateError:
            pass


def raises(call: Callable[[], Any], cls: type[BaseException], message: str) -> None:
    """``call`` raises exactly ``cls`` (not a subclass) with exactly ``message``."""
    with pytest.raises(PulsarStateError) as info:
        call()
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    assert str(info.value) == message


Case = Callable[[World], tuple[Callable[[], Any], type[BaseException], str]]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn

    return register


def _log(w: World, topic: str | None = None, **options: Any) -> Any:
    return w.keep(open_offset_log(w.backend, topic or w.topic, **options))


def _read(log: Any, offset: Any = 0, partition: Any = 0, **limits: Any) -> Any:
    limits = {"max_messages": 10, "max_bytes": 1 << 20, "timeout": 0.0, **limits}
    return lambda: log.read(partition, offset, **limits)


# -- offsets and limits ---------------------------------------------------------------------
@case("negative offset")
def _(w: World) -> Any:
    return _read(_log(w), -1), ConfigurationError, f"offset must be a non-negative int, got -1 for topic {w.topic}"


@case("bool offset")
def _(w: World) -> Any:
    return _read(_log(w), True), ConfigurationError, f"offset must be a non-negative int, got True for topic {w.topic}"


@case("str offset, consumer")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.topic))
    return lambda: c.pull("3"), ConfigurationError, f"offset must be a non-negative int, got '3' for topic {w.topic}"


@case("max_messages 0")
def _(w: World) -> Any:
    return (
        _read(_log(w), max_messages=0),
        ConfigurationError,
        f"max_messages must be at least 1, got 0 for topic {w.topic}",
    )


@case("max_bytes 0, consumer")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.topic))
    return (
        lambda: c.pull(0, max_bytes=0),
        ConfigurationError,
        f"max_bytes must be at least 1, got 0 for topic {w.topic}",
    )


@case("negative timeout")
def _(w: World) -> Any:
    return _read(_log(w), timeout=-1), ConfigurationError, f"timeout must not be negative, got -1 for topic {w.topic}"


@case("negative commit offset")
def _(w: World) -> Any:
    log = _log(w)
    return (
        lambda: log.commit("sub", 0, -2),
        ConfigurationError,
        f"next_offset must be a non-negative int, got -2 for topic {w.topic}",
    )


@case("blank subscription")
def _(w: World) -> Any:
    log = _log(w)
    return (
        lambda: log.commit(" ", 0, 0),
        ConfigurationError,
        f"subscription must not be empty, got ' ' for topic {w.topic}",
    )


@case("blank subscription, consumer")
def _(w: World) -> Any:
    return (
        lambda: PullConsumer(w.backend, w.topic, ""),
        ConfigurationError,
        f"subscription must not be empty, got '' for topic {w.topic}",
    )


@case("timestamp in milliseconds")
def _(w: World) -> Any:
    log = _log(w)
    return (
        lambda: log.offset_for_time(0, 1.7e12),
        ConfigurationError,
        f"timestamp 1700000000000.0 looks like milliseconds: pass seconds since the epoch (1700000000.0) for topic {w.topic}",
    )


@case("timestamp not a number")
def _(w: World) -> Any:
    log = _log(w)
    return (
        lambda: log.offset_for_time(0, "2026"),
        ConfigurationError,
        f"timestamp must be seconds since the epoch, got '2026' for topic {w.topic}",
    )


# -- out of range -----------------------------------------------------------------------------
@case("offset past the end")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.topic))
    b, e = c.beginning_offsets()[0], c.end_offsets()[0]
    return (
        lambda: c.pull(e + 5),
        OffsetOutOfRangeError,
        f"offset {e + 5} of topic {w.topic} partition 0 is past the end: the retained range is [{b}, {e}] "
        "(pass auto_offset_reset='earliest' or 'latest' to reset)",
    )


@case("commit past the end")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.topic, "sub"))
    b, e = c.beginning_offsets()[0], c.end_offsets()[0]
    return (
        lambda: c.commit(e + 1),
        OffsetOutOfRangeError,
        f"commit offset {e + 1} of topic {w.topic} partition 0 is past the end: the retained range is [{b}, {e}]",
    )


# -- topics and partitions ----------------------------------------------------------------------
def _missing(w: World) -> str:
    return f"topic {w.url(w.missing)} does not exist; create it first (create_topic), nothing here creates it"


@case("unknown topic, read")
def _(w: World) -> Any:
    return _read(_log(w, w.missing)), UnknownTopicError, _missing(w)


@case("unknown topic, partitions")
def _(w: World) -> Any:
    return _log(w, w.missing).partitions, UnknownTopicError, _missing(w)


@case("unknown topic, commit")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.missing, "sub"))
    return lambda: c.commit(0), UnknownTopicError, _missing(w)


@case("unknown topic, publisher")
def _(w: World) -> Any:
    return lambda: open_publisher(w.backend, w.missing), UnknownTopicError, _missing(w)


@case("empty topic name")
def _(w: World) -> Any:
    return lambda: open_offset_log(w.backend, ""), ConfigurationError, "topic must be a non-empty str, got ''"


@case("partition of a non-partitioned topic")
def _(w: World) -> Any:
    return (
        _read(_log(w), partition=1),
        UnknownPartitionError,
        f"topic {w.topic} is not partitioned (use partition 0): no partition 1",
    )


@case("negative partition, consumer")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.topic))
    return (
        lambda: c.pull(0, partition=-1),
        UnknownPartitionError,
        f"topic {w.topic} is not partitioned (use partition 0): no partition -1",
    )


@case("partition past the count")
def _(w: World) -> Any:
    log = _log(w, w.parted)
    return lambda: log.end_offset(2), UnknownPartitionError, f"topic {w.parted} has partitions 0..1: no partition 2"


@case("partition not an int")
def _(w: World) -> Any:
    log = _log(w)
    return (
        lambda: log.committed("sub", "0"),
        UnknownPartitionError,
        f"partition must be an int, got '0' for topic {w.topic}",
    )


@case("no partition on a partitioned topic")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.parted))
    return lambda: c.pull(0), UnknownPartitionError, f"topic {w.parted} has 2 partitions: pass partition= (0..1)"


@case("create_topic partitions=True")
def _(w: World) -> Any:
    return (
        lambda: create_topic(w.backend, w.missing, partitions=True),
        ConfigurationError,
        f"partitions must be a non-negative int, got True for topic {w.missing}",
    )


@case("create_topic partitions=-1")
def _(w: World) -> Any:
    return (
        lambda: create_topic(w.backend, w.missing, partitions=-1),
        ConfigurationError,
        f"partitions must be a non-negative int, got -1 for topic {w.missing}",
    )


@case("create_topic with another partition count")
def _(w: World) -> Any:
    return (
        lambda: create_topic(w.backend, w.topic, partitions=2),
        ConfigurationError,
        f"topic {w.topic} exists with 0 partitions, not 2",
    )


# -- options ----------------------------------------------------------------------------------
@case("reader_pool_size 0")
def _(w: World) -> Any:
    return (
        lambda: _log(w, reader_pool_size=0),
        ConfigurationError,
        f"reader_pool_size must be at least 1, got 0 for topic {w.topic}",
    )


@case("reader_idle_timeout 0, consumer")
def _(w: World) -> Any:
    return (
        lambda: PullConsumer(w.backend, w.topic, reader_idle_timeout=0),
        ConfigurationError,
        f"reader_idle_timeout must be positive, got 0 for topic {w.topic}",
    )


@case("unknown option")
def _(w: World) -> Any:
    return (
        lambda: _log(w, reader_poolsize=3),
        ConfigurationError,
        f"unknown option(s) for the offset log of {w.topic}: reader_poolsize",
    )


# -- closed -----------------------------------------------------------------------------------
@case("closed log")
def _(w: World) -> Any:
    log = _log(w)
    log.end_offset(0)
    log.close()
    return _read(log), ClosedError, f"offset log of {w.topic} is closed"


@case("closed log, offsets")
def _(w: World) -> Any:
    log = _log(w)
    log.close()
    return lambda: log.beginning_offset(0), ClosedError, f"offset log of {w.topic} is closed"


@case("closed consumer")
def _(w: World) -> Any:
    c = w.keep(PullConsumer(w.backend, w.topic, "sub"))
    c.close()
    return lambda: c.commit(0), ClosedError, f"PullConsumer of {w.topic} is closed"


@case("closed publisher")
def _(w: World) -> Any:
    p = w.keep(open_publisher(w.backend, w.topic))
    p.close()
    return lambda: p.send(b"v"), ClosedError, f"publisher of {w.topic} is closed"


@case("closed publisher, publish")
def _(w: World) -> Any:
    p = w.keep(open_publisher(w.backend, w.topic))
    p.close()
    return lambda: p.publish(b"v", timeout=5), ClosedError, f"publisher of {w.topic} is closed"


# -- messages ---------------------------------------------------------------------------------
@case("message not bytes")
def _(w: World) -> Any:
    p = w.keep(open_publisher(w.backend, w.topic))
    return lambda: p.send("text"), ConfigurationError, f"message value must be bytes, got str for topic {w.topic}"


@case("message key not a str")
def _(w: World) -> Any:
    p = w.keep(open_publisher(w.backend, w.topic))
    return (
        lambda: p.publish(b"v", key=7, timeout=5),
        ConfigurationError,
        f"message key must be a str or None, got int for topic {w.topic}",
    )


@case("message properties not str to str")
def _(w: World) -> Any:
    p = w.keep(open_publisher(w.backend, w.topic))
    return (
        lambda: p.send(b"v", properties={"n": 1}),
        ConfigurationError,
        f"message properties must map str to str, got {{'n': 1}} for topic {w.topic}",
    )


@case("message properties an empty list")
def _(w: World) -> Any:
    p = w.keep(open_publisher(w.backend, w.topic))
    return (
        lambda: p.send(b"v", properties=[]),
        ConfigurationError,
        f"message properties must map str to str, got [] for topic {w.topic}",
    )


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_call_raises_one_error_class_and_text_on_both_back_ends(world: World, name: str) -> None:
    call, cls, message = CASES[name](world)
    raises(call, cls, message)
    with PullConsumer(world.backend, world.topic, "sub") as consumer:
        assert consumer.committed() is None  # the bad call committed nothing
        assert consumer.end_offsets()[0] - consumer.beginning_offsets()[0] == 3  # and published nothing


def test_a_bad_address_names_the_back_end_and_its_form(world: World) -> None:
    log = _log(world)
    embedded = world.config.kind == "embedded"
    store, form = (
        ("the embedded log", "e:<partition>:<position>")
        if embedded
        else ("Pulsar", "p:<partition>:<base64 message id>")
    )
    for address in ("nonsense", "p:0:AAAA" if embedded else "e:0:1"):
        raises(
            lambda a=address: log.read_at(a, timeout=1),
            ConfigurationError,
            f"{address!r} is not a message address of {store} (expected {form!r})",
        )


def test_an_address_with_nothing_there_is_named_alike_on_both_back_ends(world: World) -> None:
    """The topic was deleted and created again: the address names nothing now, said in one text."""
    topic = f"{world.topic}-gone"
    create_topic(world.backend, topic)
    with open_publisher(world.backend, topic, batching=False) as publisher:
        address = publisher.publish(b"x", timeout=FLUSH)
    world.backend.delete_topic(topic)
    create_topic(world.backend, topic)
    raises(
        lambda: _log(world, topic).read_at(address, timeout=1),
        MessageNotFoundError,
        f"no message at {address} of {world.url(topic)}: nothing there (never written, topic deleted, or trimmed)",
    )


def test_the_async_probe_names_an_unknown_topic_as_the_logs_do(world: World) -> None:
    async def ask() -> None:
        probe = open_async_probe(world.config)
        try:
            await probe.end_offsets(world.missing)
        finally:
            await probe.aclose()

    with pytest.raises(UnknownTopicError) as info:
        asyncio.run(ask())
    pattern = rf"topic {re.escape(world.missing)} \(.+\) does not exist; create it first \(create_topic\), nothing here creates it"
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
