"""Small XCom messages over the broker's HTTP API: same addresses as the client, no client started."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, XComEntryNotFoundError
from airflow_provider_pulsarstate.engine.offsets import open_offset_log, open_publisher
from airflow_provider_pulsarstate.engine.offsets.pulsar_http import (
    HTTP_MESSAGE_MAX_BYTES,
    PulsarHttpMessages,
    decode_message_id,
    encode_message_id,
    plain_id_of,
)
from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComIdentity, XComMessageLog
from tests.conftest import pulsar_config

NS = "prod"


def test_message_ids_are_serialized_byte_for_byte_as_the_client_does() -> None:
    import pulsar

    for ledger, entry, partition in [(0, 0, -1), (10, 2, -1), (123456789012, 99999, -1), (5, 1, 3), (2**40, 7, 0)]:
        theirs = pulsar.MessageId(partition, ledger, entry, -1).serialize()
        assert encode_message_id(ledger, entry, partition=partition) == theirs
        assert decode_message_id(theirs) == (ledger, entry, partition, -1)
    # a batched message's id decodes, but is not "plain": only the client reads inside a batch
    batched = pulsar.MessageId(-1, 5, 6, 3).serialize()
    assert decode_message_id(batched) == (5, 6, -1, 3)
    assert plain_id_of("p:0:" + base64.b64encode(batched).decode()) is None
    assert decode_message_id(b"\x08") is None and decode_message_id(b"\x3a\x02\x08\x01") is None
    with pytest.raises(ConfigurationError, match="not a message address of Pulsar"):
        plain_id_of("p:0:not base64!")


@pytest.fixture
def config(pulsar_broker: object) -> ConnectionConfig:
    return pulsar_config(pulsar_broker)


@pytest.fixture
def http(config: ConnectionConfig) -> Iterator[PulsarHttpMessages]:
    channel = PulsarHttpMessages(config)
    yield channel
    channel.close()


@pytest.fixture
def backend(config: ConnectionConfig) -> Iterator[PulsarBackend]:
    b = PulsarBackend(config)
    yield b
    b.close()


@pytest.mark.pulsar
def test_http_and_client_read_what_the_other_wrote(
    http: PulsarHttpMessages, backend: PulsarBackend, topic: str
) -> None:
    address = http.publish(topic, '{"h":1}\n"über"'.encode(), properties={"k": "v"})  # creates the topic
    assert address is not None
    log = open_offset_log(backend, topic)
    try:
        by_client = log.read_at(address, timeout=10)
        assert by_client.value == '{"h":1}\n"über"'.encode() and by_client.properties == {"k": "v"}
        publisher = open_publisher(backend, topic, batching=False, chunking=True)
        try:
            other = publisher.publish(b"plain bytes", timeout=10)
        finally:
            publisher.close()
        by_http = http.read(topic, other)
        assert by_http is not None and by_http.value == b"plain bytes" and by_http.address == other
        assert abs(by_http.publish_time - log.read_at(other, timeout=10).publish_time) < 0.01
    finally:
        log.close()


@pytest.mark.pulsar
def test_what_http_cannot_do_exactly_is_left_to_the_client(
    http: PulsarHttpMessages, backend: PulsarBackend, topic: str
) -> None:
    at_limit = http.publish(topic, b"x" * HTTP_MESSAGE_MAX_BYTES)  # also creates the topic
    assert at_limit is not None and len(http.read(topic, at_limit).value) == HTTP_MESSAGE_MAX_BYTES  # type: ignore[union-attr]
    assert http.publish(topic, b"x" * (HTTP_MESSAGE_MAX_BYTES + 1)) is None
    assert http.publish(topic, b"\xff\xfe not utf-8") is None
    publisher = open_publisher(backend, topic, batching=False, chunking=True)
    try:
        big = publisher.publish(b"y" * (6 << 20), timeout=30)  # over the broker's limit: chunked
    finally:
        publisher.close()
    assert http.read(topic, big) is None  # a chunk is not the message
    assert open_offset_log(backend, topic).read_at(big, timeout=30).value == b"y" * (6 << 20)


def _messages(config: ConnectionConfig, topic: str, http: PulsarHttpMessages | None) -> XComMessageLog:
    return XComMessageLog(lambda: PulsarBackend(config), topic, namespace=NS, http=http)


@pytest.mark.pulsar
def test_a_topic_the_rest_producer_may_not_use_falls_back_to_the_producer(
    http: PulsarHttpMessages, backend: PulsarBackend, topic: str
) -> None:
    backend.admin.create_topic(topic)
    schema = {"type": "JSON", "schema": json.dumps({"type": "record", "name": "R", "fields": []}), "properties": {}}
    backend.admin.request("POST", f"schemas/{topic.split('://')[1]}/schema", json=schema)
    log = XComMessageLog(backend, topic, namespace=NS, http=http)
    try:
        ident = XComIdentity(NS, "d", "r", "t", -1, "k")
        address, written = log.append(ident, '{"v":1}', type_name="dict")
        assert log.read(address, identity=ident, writer_id=written.writer_id).record.json_value() == {"v": 1}
        assert http.publish(topic, b"again") is None  # remembered: not tried over HTTP again
    finally:
        log.close()


@pytest.mark.pulsar
def test_reading_a_deleted_run_topic_fails_naming_the_key_and_creates_nothing(
    config: ConnectionConfig, http: PulsarHttpMessages, backend: PulsarBackend, topic: str
) -> None:
    log = _messages(config, topic, http)
    ident = XComIdentity(NS, "d", "r", "t", -1, "k")
    address, written = log.append(ident, "1", type_name="int")
    backend.admin.delete_topic(topic)
    with pytest.raises(XComEntryNotFoundError, match="cleaned up") as info:
        log.read(address, identity=ident, writer_id=written.writer_id)
    assert ident.map_key in str(info.value)
    assert backend.admin.partition_count(topic) is None  # the read did not re-create it
    log.close()


@pytest.mark.pulsar
def test_a_task_process_pushing_and_pulling_small_values_never_starts_a_pulsar_client(
    config: ConnectionConfig, pulsar_broker: object
) -> None:
    """What makes a fan-out of task processes cheap: no ``import pulsar``, no client, no producer."""
    topic = f"persistent://public/default/test-{uuid.uuid4().hex[:12]}"
    script = textwrap.dedent(f"""
        import sys
        from airflow_provider_pulsarstate.engine.config import ConnectionConfig
        from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PulsarHttpMessages
        from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComIdentity, XComMessageLog

        config = ConnectionConfig(url={config.url!r}, admin_url={config.admin_url!r})
        opened = []
        def open_backend():
            opened.append(1)
            from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
            return PulsarBackend(config)
        http = PulsarHttpMessages(config)
        log = XComMessageLog(open_backend, {topic!r}, namespace={NS!r}, http=http)
        for i in range(3):
            ident = XComIdentity({NS!r}, "d", "r", f"t{{i}}", -1, "return_value")
            address, written = log.append(ident, '{{"i": %d}}' % i, type_name="dict")
            assert log.read(address, identity=ident, writer_id=written.writer_id).record.json_value() == {{"i": i}}
        log.close(); http.close()
        print("pulsar" in sys.modules, "requests" in sys.modules, len(opened))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "False", "0"]
