"""XComMessageLog: values as immutable messages read back by address, on both back ends."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    SerializationError,
    ValueTooLargeError,
    XComEntryNotFoundError,
    XComReferenceError,
)
from airflow_provider_pulsarstate.engine.offsets import delete_topic_if_unchanged
from airflow_provider_pulsarstate.engine.recipes.xcom_messages import (
    XComIdentity,
    XComMessage,
    XComMessageLog,
    decode_message,
    encode_message,
    is_message_topic,
    message_topic,
    message_topic_prefix,
)
from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComRecord, run_topic

NS = "prod"


@pytest.fixture
def base(topic: str) -> str:
    return topic


@pytest.fixture
def logs(backend: Backend, base: str) -> Iterator[object]:
    made: list[XComMessageLog] = []

    def make(dag: str = "d", run: str = "r", *, namespace: str = NS, **options: object) -> XComMessageLog:
        log = XComMessageLog(backend, message_topic(base, namespace, dag, run), namespace=namespace, **options)  # type: ignore[arg-type]
        made.append(log)
        return log

    yield make
    for log in made:
        log.close()


def ident(task: str = "t", key: str = "k", *, run: str = "r", map_index: int = -1, namespace: str = NS) -> XComIdentity:
    return XComIdentity(namespace, "d", run, task, map_index, key)


def test_topics_are_per_run_and_apart_from_the_run_maps(base: str) -> None:
    topic = message_topic(base, NS, "d", "r")
    assert topic != run_topic(base, NS, "d", "r")
    assert is_message_topic(topic, message_topic_prefix(base, NS))
    assert not is_message_topic(run_topic(base, NS, "d", "r"), message_topic_prefix(base, NS))
    assert message_topic(base, NS, "d", "r2") != topic and message_topic(base, "other", "d", "r") != topic


def test_a_value_round_trips_by_its_address(logs: object) -> None:
    log = logs()  # type: ignore[operator]
    address, written = log.append(ident(), '{"a":[1,2]}', type_name="dict", try_number=2)
    other, _ = log.append(ident("t2"), '"x"', type_name="str")
    assert address != other
    got = log.read(address, identity=ident(), writer_id=written.writer_id)
    assert got == written and got.record.json_value() == {"a": [1, 2]} and got.record.try_number == 2
    assert decode_message(encode_message(got)) == got


def test_a_reference_moved_to_another_row_push_or_run_is_refused_naming_the_key(logs: object, backend: Backend) -> None:
    log = logs()  # type: ignore[operator]
    victim, victim_msg = log.append(ident("victim", "secret"), '{"password":1}', type_name="dict")
    mine, mine_msg = log.append(ident("me", "k"), "1", type_name="int")
    # my row, the victim's address: the message names another row
    with pytest.raises(XComReferenceError) as info:
        log.read(victim, identity=ident("me", "k"), writer_id=mine_msg.writer_id)
    assert ident("me", "k").map_key in str(info.value) and "refusing" in str(info.value)
    assert "password" not in str(info.value)
    # the right row, but another push (an older try's message): the writer id differs
    with pytest.raises(XComReferenceError):
        log.read(mine, identity=ident("me", "k"), writer_id=victim_msg.writer_id)
    # the address read through another run's topic holds nothing of that run
    elsewhere = logs(run="r2")  # type: ignore[operator]
    elsewhere.append(ident(run="r2"), "2", type_name="int")
    with pytest.raises((XComReferenceError, XComEntryNotFoundError)) as info:
        elsewhere.read(victim, identity=ident("victim", "secret", run="r2"), writer_id=victim_msg.writer_id)
    assert "password" not in str(info.value)
    # another namespace's row through this log
    with pytest.raises(XComReferenceError):
        log.read(mine, identity=ident("me", "k", namespace="other"), writer_id=mine_msg.writer_id)
    with pytest.raises(XComReferenceError):
        log.read("garbage", identity=ident("me", "k"), writer_id=mine_msg.writer_id)


def test_size_limit_and_values_over_the_brokers_message_limit(logs: object) -> None:
    small = logs(max_value_bytes=100)  # type: ignore[operator]
    with pytest.raises(ValueTooLargeError) as info:
        small.append(ident(key="big"), json.dumps("y" * 200), type_name="str")
    assert "202 bytes" in str(info.value) and "100-byte limit" in str(info.value) and "big" in str(info.value)
    # 6 MiB: over Pulsar's default 5 MB message limit, so the client chunks it; read back whole
    large = logs(run="large", max_value_bytes=8 << 20)  # type: ignore[operator]
    text = json.dumps("z" * (6 << 20))
    address, written = large.append(ident(run="large", key="big"), text, type_name="str")
    got = large.read(address, identity=ident(run="large", key="big"), writer_id=written.writer_id)
    assert got.record.value_json == text


def test_scan_and_compare_and_delete(logs: object, backend: Backend) -> None:
    log = logs()  # type: ignore[operator]
    address, written = log.append(ident(), "1", type_name="int")
    log.append(ident("t2"), "2", type_name="int")
    scan = log.scan()
    assert [m.message.identity.task_id for m in scan.messages if m.message] == ["t", "t2"]
    assert all(m.publish_time > 0 for m in scan.messages)
    log.append(ident("late"), "3", type_name="int")  # pushed after the listing
    log.close()  # the broker refuses to delete a topic with a connected producer or reader
    assert not delete_topic_if_unchanged(backend, log.topic, last=scan.last, timeout=30)
    rescan = log.scan()
    assert len(rescan.messages) == 3
    assert delete_topic_if_unchanged(backend, log.topic, last=rescan.last, timeout=30)
    with pytest.raises(XComEntryNotFoundError) as info:
        log.read(address, identity=ident(), writer_id=written.writer_id)
    assert ident().map_key in str(info.value)
    log.close()


def test_pulsar_never_deletes_a_topic_a_process_still_publishes_to(logs: object, backend: Backend) -> None:
    log = logs()  # type: ignore[operator]
    log.append(ident(), "1", type_name="int")  # its producer stays connected, as in a task process
    scan = log.scan()
    deleted = delete_topic_if_unchanged(backend, log.topic, last=scan.last, timeout=30)
    if "Embedded" in type(backend.underlying()).__name__:
        assert deleted  # one transaction: nothing can land between the check and the deletion
    else:
        assert not deleted  # the broker refuses a non-forced deletion while a producer is connected
        log.close()
        assert delete_topic_if_unchanged(backend, log.topic, last=scan.last, timeout=30)


@pytest.mark.parametrize(
    "field,bad",
    [("dag", ""), ("w", 7), ("mi", "0"), ("mi", True), ("n", 1.5), ("t", "now"), ("t", False), ("try", "2")],
)
def test_a_header_field_of_the_wrong_type_is_refused_quoting_the_header(field: str, bad: object) -> None:
    message = encode_message(XComMessage(ident(), "writer-1", XComRecord('"v"', 1700000000.5, 3, "str", try_number=2)))
    head, body = message.split(b"\n", 1)
    header = json.loads(head)
    assert decode_message(message).record.try_number == 2
    header[field] = bad
    with pytest.raises(SerializationError, match=r"XCom message header is malformed: b'\{"):
        decode_message(json.dumps(header).encode() + b"\n" + body)
    del header[field]
    if field == "try":  # the one optional field: a message without it has an unknown try
        assert decode_message(json.dumps(header).encode() + b"\n" + body).record.try_number is None
    else:
        with pytest.raises(SerializationError, match="XCom message header is malformed"):
            decode_message(json.dumps(header).encode() + b"\n" + body)
    with pytest.raises(SerializationError, match="not an XCom message"):
        decode_message(b'{"f": 2}\n' + body)
