"""GENESIS records (both back ends, real broker for Pulsar): a log that lost its beginning, or a
topic recreated under a table that existed, fails loudly instead of serving an empty table."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_pulsarstate import PulsarMap
from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.envelope import RecordKind, encode_frames, encode_writes
from airflow_provider_pulsarstate.engine.errors import LogLostError
from airflow_provider_pulsarstate.engine.genesis import new_genesis_body
from airflow_provider_pulsarstate.engine.recipes.map import _PUT
from airflow_provider_pulsarstate.engine.serde import JSON
from airflow_provider_pulsarstate.engine.wal import LogReader, open_writer


@pytest.fixture
def map_defaults() -> dict[str, Any]:
    return {"acquire_timeout": 20.0, "checkpoint_after_bytes": None}


def records(backend: Backend, topic: str) -> list[Any]:
    reader = LogReader(backend, topic)
    try:
        out = []
        while (rec := reader.read_next(timeout=10, drain=True)) is not None:
            out.append(rec)
        return out
    finally:
        reader.close()


def data_frames(m: PulsarMap, epoch: int, offsets: range) -> list[bytes]:
    frames = []
    for offset in offsets:
        op = m._serialize_op((_PUT, f"k{offset}", JSON.serialize(offset)))
        frames += encode_frames(
            kind=RecordKind.DATA,
            epoch=epoch,
            offset=offset,
            writer_id=b"w" * 16,
            body=encode_writes([(offset + 1, [op])]),
            max_frame_bytes=1 << 20,
        )
    return frames


def test_every_log_starts_with_one_genesis_record_that_checkpoints_record(
    maps: Any, backend: Backend, topic: str
) -> None:
    a, b = maps(), maps()
    a.put("x", 1)
    b.put("y", 2)  # a second writer finds the GENESIS record and writes none
    kinds = [r.kind for r in records(backend, topic)]
    assert kinds[:3] == [RecordKind.EPOCH, RecordKind.GENESIS, RecordKind.DATA]
    assert kinds.count(RecordKind.GENESIS) == 1
    log_id = a.manager.log_id
    assert log_id and b.manager.log_id == log_id
    info = a.checkpoint()
    assert info is not None and info.log_id == log_id
    assert CheckpointStore(backend, topic).latest().log_id == log_id
    fresh = maps()
    assert fresh.to_dict(latest=True) == {"x": 1, "y": 2} and fresh.manager.log_id == log_id


def test_only_the_first_genesis_record_counts(maps: Any, backend: Backend, topic: str) -> None:
    """A second GENESIS (a concurrent first writer's) is ignored by every reader."""
    w = maps()
    w.put("x", 1)
    first = w.manager.log_id
    w.checkpoint()
    w.close()
    writer = open_writer(backend, topic, writer_id=b"g" * 16, mode=AcquireMode.WAIT, timeout=20)
    try:
        writer.append(RecordKind.GENESIS, new_genesis_body(), timeout=10)
    finally:
        writer.close()
    fresh = maps()
    assert fresh.to_dict(latest=True) == {"x": 1}
    assert fresh.manager.log_id == first and fresh.manager.stats["checkpoint_loaded_offset"] == 0
    assert maps(use_checkpoints=False).manager.read(lambda s: None, latest=True) is None


def test_a_log_that_lost_its_beginning_fails_loudly(maps: Any, backend: Backend, topic: str) -> None:
    """What retention leaves of a log: EPOCH records, then DATA from offset 5, no GENESIS."""
    probe = maps()
    writer = backend.open_shared_writer(topic)
    try:
        epoch = encode_frames(
            kind=RecordKind.EPOCH, epoch=3, offset=-1, writer_id=b"w" * 16, body=b"", max_frame_bytes=1 << 20
        )
        writer.append(epoch + data_frames(probe, 3, range(5, 8)), timeout=10)
    finally:
        writer.close()
    for options in ({}, {"use_checkpoints": False}):
        with pytest.raises(LogLostError, match="DATA offset 5") as err:
            maps(**options).to_dict(latest=True)
        assert err.value.topic == topic and topic in str(err.value)
    with pytest.raises(LogLostError):
        maps().put("k9", 9)  # nothing is written on top of it either


def test_a_legacy_log_without_genesis_starting_at_offset_0_is_accepted(maps: Any, backend: Backend, topic: str) -> None:
    probe = maps()
    # A log written before GENESIS existed: by an exclusive writer of an epoch the back end granted
    # (frames of an epoch it never granted are forged and skipped, see test_epochs.py).
    writer = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10)
    try:
        writer.append(data_frames(probe, writer.epoch, range(0, 3)), timeout=10)
    finally:
        writer.close()
    w = maps()
    assert w.to_dict(latest=True) == {"k0": 0, "k1": 1, "k2": 2}
    w.put("k3", 3)
    assert w.manager.log_id is None  # no GENESIS is added to a log that has data
    assert RecordKind.GENESIS not in [r.kind for r in records(backend, topic)]
    info = w.checkpoint()
    assert info is not None and info.log_id is None
    fresh = maps()
    assert fresh.to_dict(latest=True) == {"k0": 0, "k1": 1, "k2": 2, "k3": 3}
    assert fresh.manager.stats["checkpoint_loaded_offset"] == 3


def test_a_deleted_log_whose_table_has_checkpoints_fails_loudly(maps: Any, backend: Backend, topic: str) -> None:
    w = maps()
    for i in range(5):
        w.put(f"k{i}", i)
    assert w.checkpoint() is not None
    w.close()
    backend.delete_topic(topic)  # what inactive-topic deletion does
    for options in ({}, {"use_checkpoints": False}):
        with pytest.raises(LogLostError, match="empty or missing") as err:
            maps(**options).get("k0", latest=True)
        assert topic in str(err.value)
    with pytest.raises(LogLostError):
        maps().put("k0", "new")  # a writer does not start a new log under the old table's name


def test_a_recreated_log_with_another_genesis_fails_loudly(maps: Any, backend: Backend, topic: str) -> None:
    w = maps()
    for i in range(5):
        w.put(f"k{i}", i)
    info = w.checkpoint()
    w.close()
    backend.delete_topic(topic)
    # Someone recreated the topic and a writer (of another version, or with the manifests hidden
    # from it) started a new log in it.
    writer = open_writer(backend, topic, writer_id=b"n" * 16, mode=AcquireMode.WAIT, timeout=20)
    try:
        writer.append(RecordKind.GENESIS, new_genesis_body(), timeout=10)
    finally:
        writer.close()
    with pytest.raises(LogLostError, match=info.log_id) as err:
        maps().to_dict(latest=True)
    assert "recreated" in str(err.value) and topic in str(err.value)
