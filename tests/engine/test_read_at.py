"""``TopicPublisher.publish`` and ``OffsetLog.read_at``: one message written without an exclusive
writer and read back by its address, the same on both back ends."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, MessageNotFoundError
from airflow_provider_pulsarstate.engine.offsets import create_topic, open_offset_log, open_publisher

WAIT = 30.0


def test_publish_returns_an_address_that_reads_back_that_message(backend: Backend, topic: str) -> None:
    create_topic(backend, topic)
    log = open_offset_log(backend, topic)
    with open_publisher(backend, topic, batching=False) as publisher:
        addresses = [publisher.publish(f"v{i}".encode(), properties={"i": str(i)}, timeout=WAIT) for i in range(5)]
    assert len(set(addresses)) == 5
    try:
        for i in (3, 0, 4):  # any order, nothing before is needed
            got = log.read_at(addresses[i], timeout=WAIT)
            assert (got.value, dict(got.properties), got.address) == (f"v{i}".encode(), {"i": str(i)}, addresses[i])
            assert abs(got.publish_time - time.time()) < 600
    finally:
        log.close()


def test_publishers_of_several_threads_need_no_exclusive_writer(backend: Backend, topic: str) -> None:
    create_topic(backend, topic)
    results: dict[int, str] = {}
    publishers = [open_publisher(backend, topic, batching=False) for _ in range(2)]

    def push(i: int) -> None:
        results[i] = publishers[i % 2].publish(str(i).encode(), timeout=WAIT)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for p in publishers:
        p.close()
    log = open_offset_log(backend, topic)
    try:
        assert {i: log.read_at(a, timeout=WAIT).value for i, a in results.items()} == {
            i: str(i).encode() for i in range(8)
        }
    finally:
        log.close()


def test_an_address_with_nothing_there_is_not_found_at_once(backend: Backend, topic: str) -> None:
    create_topic(backend, topic)
    with open_publisher(backend, topic, batching=False) as publisher:
        address = publisher.publish(b"x", timeout=WAIT)
    backend.delete_topic(topic)
    create_topic(backend, topic)
    log = open_offset_log(backend, topic)
    try:
        started = time.monotonic()
        with pytest.raises(MessageNotFoundError) as info:
            log.read_at(address, timeout=WAIT)
        assert address in str(info.value) and info.value.address == address
        assert time.monotonic() - started < WAIT / 2  # answered, not timed out
    finally:
        log.close()


def test_addresses_of_another_back_end_or_malformed_are_refused(backend: Backend, topic: str) -> None:
    create_topic(backend, topic)
    log = open_offset_log(backend, topic)
    try:
        for bad in ("", "e:0:x", "p:0:not-base64!", "x:0:1", "e:-1:1", "p:0"):
            kind = "e" if "Embedded" in type(backend.underlying()).__name__ else "p"
            if bad.startswith(kind) and bad not in ("e:0:x", "p:0:not-base64!", "p:0"):
                continue
            with pytest.raises(ConfigurationError) as info:
                log.read_at(bad, timeout=1.0)
            assert repr(bad) in str(info.value)
    finally:
        log.close()


def test_a_failed_publish_leaves_nothing_queued(backend: Backend, topic: str) -> None:
    create_topic(backend, topic)
    with open_publisher(backend, topic, batching=False) as publisher:
        with pytest.raises(ConfigurationError):
            publisher.publish("not bytes", timeout=WAIT)  # type: ignore[arg-type]
        address = publisher.publish(b"ok", timeout=WAIT)
    log = open_offset_log(backend, topic)
    try:
        assert log.read_at(address, timeout=WAIT).value == b"ok"
        assert log.end_offset(0) - log.beginning_offset(0) == 1
    finally:
        log.close()


def test_a_publisher_may_create_its_topic(backend: Backend, topic: str) -> None:
    with open_publisher(backend, topic, batching=False, create=True) as publisher:
        address = publisher.publish(b"first", timeout=WAIT)
    log = open_offset_log(backend, topic)
    try:
        assert log.read_at(address, timeout=WAIT).value == b"first"
    finally:
        log.close()


@pytest.mark.pulsar
def test_pushing_and_reading_a_message_calls_no_admin_api(backend_config: object) -> None:
    """A task process's push and pull go to the broker only: ``requests`` (the admin client) is not
    even imported (~40 ms of CPU in each of hundreds of task processes)."""
    import json
    import subprocess
    import sys

    if getattr(backend_config, "kind", None) != "pulsar":
        pytest.skip("the embedded log has no admin API")
    code = (
        "import sys, uuid\n"
        "from airflow_provider_pulsarstate import ConnectionConfig, open_backend\n"
        "from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComIdentity, XComMessageLog, message_topic\n"
        f"config = ConnectionConfig(**{json.dumps({'url': backend_config.url, 'admin_url': backend_config.admin_url})})\n"  # type: ignore[attr-defined]
        "backend = open_backend(config)\n"
        "topic = message_topic(config.topic_name('noadmin-' + uuid.uuid4().hex[:8]), 'ns', 'd', 'r')\n"
        "row = XComIdentity('ns', 'd', 'r', 't', -1, 'k')\n"
        "with XComMessageLog(backend, topic, namespace='ns') as log:\n"
        "    address, message = log.append(row, '1', type_name='int')\n"
        "    assert log.read(address, identity=row, writer_id=message.writer_id).record.value_json == '1'\n"
        "print('requests' in sys.modules)\n"
        "backend.delete_topic(topic)\n"
        "backend.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stdout.splitlines() if line in ("True", "False")] == ["False"], done.stdout[-2000:]
