"""Checkpoints, on both back ends (real broker for Pulsar): bootstrap from an image plus the tail."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConfigurationError, PulsarMap, SharedStateManager
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.envelope import RecordKind, encode_frames, encode_writes
from airflow_provider_pulsarstate.engine.recipes.map import _PUT
from airflow_provider_pulsarstate.engine.serde import JSON
from airflow_provider_pulsarstate.engine.wal import LogReader
from airflow_provider_pulsarstate.testing import FaultInjectingBackend, wait_until


@pytest.fixture
def map_defaults() -> dict[str, Any]:
    return {"acquire_timeout": 20.0, "checkpoint_after_bytes": None}  # checkpoints only when a test asks


def image_exists(backend: Backend, data_topic: str) -> bool:
    reader = LogReader(backend, data_topic)
    try:
        return reader.has_next()
    finally:
        reader.close()


def test_bootstrap_loads_the_newest_checkpoint_and_replays_only_the_tail(maps: Any) -> None:
    w = maps()
    for i in range(40):
        w.put(f"k{i}", {"i": i})
    w.delete("k3")
    info = w.checkpoint()
    assert info is not None and info.offset == 40
    for i in range(5):
        w.put(f"tail{i}", i)
    fresh = maps()
    assert fresh.to_dict(latest=True) == maps(use_checkpoints=False).to_dict(latest=True) == w.to_dict()
    assert fresh.manager.stats["checkpoint_loaded_offset"] == 40
    assert fresh.manager.stats["records_replayed"] == 5  # the tail only
    assert fresh.list_keys() == w.list_keys()  # insertion order survives the image
    fresh.put("k0", "new")  # the loaded instance writes at the right offset
    assert maps(use_checkpoints=False).get("k0", latest=True) == "new"


def test_checkpoint_of_an_empty_log_is_none_and_needs_a_serializer(backend: Backend, topic: str, maps: Any) -> None:
    assert maps().checkpoint() is None
    plain = SharedStateManager(backend, topic, initializer=dict, applier=lambda s, op: None)
    try:
        with pytest.raises(ConfigurationError, match="state_serializer"):
            plain.checkpoint()
    finally:
        plain.close()
    with pytest.raises(ConfigurationError, match="checkpoint_after_bytes"):
        SharedStateManager(backend, topic, initializer=dict, applier=lambda s, op: None, checkpoint_after_bytes=10)


def test_the_writer_checkpoints_by_itself_and_keeps_the_two_newest_images(
    maps: Any, backend: Backend, topic: str
) -> None:
    w = maps(checkpoint_after_bytes=2_000)
    puts = iter(range(1_000_000))

    def put_and_count() -> bool:
        # Keep writing until four images exist: each needs a commit after the previous one is
        # stored, and how many puts that takes depends on how fast the background saves run.
        i = next(puts)
        w.put(f"k{i % 50}", {"i": i, "pad": "x" * 20})
        return w.manager.stats["checkpoints_written"] >= 4

    wait_until(put_and_count, timeout=60, interval=0, what="four automatic checkpoints")
    expected = w.to_dict()
    w.close()  # waits for a checkpoint still being stored
    store = CheckpointStore(backend, topic)
    newest = store.latest()
    assert newest is not None and newest.previous is not None
    manifests = []  # the whole chain, oldest first
    reader = backend.create_reader(store.index_topic)
    try:
        while reader.has_next():
            manifests.append(store._parse(reader.read_next(timeout=10).payload))
    finally:
        reader.close()
    assert [m.data_topic for m in manifests][-1] == newest.data_topic
    assert image_exists(backend, newest.data_topic) and image_exists(backend, newest.previous)
    assert not image_exists(backend, manifests[0].data_topic)  # superseded twice: deleted
    fresh = maps()
    assert fresh.to_dict(latest=True) == expected
    assert fresh.manager.stats["checkpoint_loaded_offset"] == newest.offset


def test_a_close_right_after_the_commit_still_stores_the_checkpoint_that_came_due(
    maps: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that writes and closes at once (a task, a view load) leaves its image: the close
    wins the race against the committer's after-commit step here every time, and the image that
    came due is still stored before close() returns."""
    from airflow_provider_pulsarstate.engine.state.workers import Checkpointer

    original = Checkpointer.maybe_start

    def after_the_close(self: Checkpointer) -> None:
        wait_until(lambda: self.replica.closed, timeout=30, what="the close to begin")
        original(self)

    loader = maps()  # no automatic checkpoints: the log holds 20 records and no image
    for i in range(20):
        loader.put(f"k{i}", i)
    loader.close()
    monkeypatch.setattr(Checkpointer, "maybe_start", after_the_close)
    w = maps(checkpoint_after_bytes=1_000)
    w.put("big", "x" * 5_000)  # alone past the threshold: an image is due after this commit
    w.close()
    fresh = maps()
    assert fresh.to_dict(latest=True) == {**{f"k{i}": i for i in range(20)}, "big": "x" * 5_000}
    assert fresh.manager.stats["checkpoint_loaded_offset"] == 20  # the image of the last commit
    assert fresh.manager.stats["records_replayed"] == 0


@pytest.mark.parametrize("damage", ["garbage manifest", "missing image", "wrong checksum", "bad image"])
def test_a_damaged_checkpoint_is_reported_and_the_log_replayed(
    damage: str, maps: Any, backend: Backend, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    w = maps()
    for i in range(20):
        w.put(f"k{i}", i)
    store = CheckpointStore(backend, topic)
    info = w.checkpoint()
    assert info is not None
    if damage == "garbage manifest":
        store._append(store.index_topic, [b"\x00not json"])
    elif damage == "missing image":
        backend.delete_topic(info.data_topic)
    elif damage == "wrong checksum":
        entry = backend.read_last(store.index_topic, timeout=10)
        manifest = json.loads(entry.payload)
        manifest["crc32"] ^= 1
        store._append(store.index_topic, [json.dumps(manifest).encode()])
    else:  # a complete, checksummed image that the map cannot read
        store.save(offset=info.offset, epoch=info.epoch, position=info.position, data=b"?garbage", log_id=info.log_id)
    caplog.set_level(logging.WARNING, logger="airflow_provider_pulsarstate")
    fresh = maps()
    assert fresh.to_dict(latest=True) == {f"k{i}": i for i in range(20)}  # nothing lost
    assert fresh.manager.stats["checkpoint_loaded_offset"] == -1
    assert fresh.manager.stats["records_replayed"] == 20
    warning = next(r.getMessage() for r in caplog.records if "replaying the whole log" in r.getMessage())
    assert topic in warning
    cause = {
        "garbage manifest": "does not decode",
        "missing image": "missing or incomplete",
        "wrong checksum": "CRC-32",
        "bad image": "does not deserialize",
    }[damage]
    assert cause in warning


def test_a_lost_ack_is_not_hidden_by_a_newer_checkpoint(
    backend: Backend, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A write of unknown outcome must be looked for in the log, not in an image that may hold it."""

    def counters(on: Backend) -> SharedStateManager:
        return SharedStateManager(
            on,
            topic,
            initializer=dict,
            acquire_timeout=20.0,
            applier=lambda s, op: s.__setitem__(op["k"], s.get(op["k"], 0) + op["d"]),
            state_serializer=lambda s: json.dumps(s).encode(),
            state_deserializer=json.loads,
        )

    faulty = FaultInjectingBackend(backend)
    a, b = counters(faulty), counters(backend)
    try:
        a.write(lambda s: [{"k": "x", "d": 1}])
        # The second write lands, its acknowledgement is lost, and before the writer looks for
        # it another instance checkpoints a state that already contains it.
        faulty.lose_next_ack(then=lambda: b.checkpoint())
        caplog.set_level(logging.INFO, logger="airflow_provider_pulsarstate")
        assert a.write(lambda s: [{"k": "x", "d": 1}], lambda s: s["x"]) == 2
        assert b.stats["checkpoints_written"] == 1 and faulty.injected == ["lose_ack"]
        assert any("not loading the checkpoint" in r.getMessage() for r in caplog.records)
    finally:
        a.close()
        b.close()
    fresh = counters(backend)
    try:
        assert fresh.read(lambda s: s["x"], latest=True) == 2  # exactly once
        assert fresh.stats["checkpoint_loaded_offset"] == 1
    finally:
        fresh.close()


def test_replay_after_a_checkpoint_still_skips_zombie_frames(tmp_path: Any) -> None:
    """The image records the highest epoch seen, so a late frame of an older writer stays ignored."""
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend

    backend = open_backend(ConnectionConfig(url=str(tmp_path / "z.db")))
    topic = "persistent://public/default/zombie"
    try:
        with PulsarMap(backend, topic, checkpoint_after_bytes=None) as w:
            w.put("a", 1)
            w.put("b", 2)
            info = w.checkpoint()
            assert info is not None and (info.offset, info.epoch) == (1, 1)
            zombie_op = w._serialize_op((_PUT, "a", JSON.serialize("zombie")))
        # A send of an epoch-0 writer that landed late, right after the checkpointed record.
        late = encode_frames(
            kind=RecordKind.DATA,
            epoch=0,
            offset=2,
            writer_id=b"z" * 16,
            body=encode_writes([(1, [zombie_op])]),
            max_frame_bytes=1 << 20,
        )
        backend.open_shared_writer(topic).append(late, timeout=5)
        with PulsarMap(backend, topic, checkpoint_after_bytes=None) as fresh:
            assert fresh.to_dict(latest=True) == {"a": 1, "b": 2}
            assert fresh.manager.stats["checkpoint_loaded_offset"] == 1
        with PulsarMap(backend, topic, use_checkpoints=False) as full:
            assert full.to_dict(latest=True) == {"a": 1, "b": 2}
    finally:
        backend.close()


def test_images_with_non_string_keys_round_trip(maps: Any) -> None:
    w = maps(key_serde=JSON)
    w.put(1, "one")
    w.put(2, ["two"])
    w.checkpoint()
    fresh = maps(key_serde=JSON)
    assert fresh.to_dict(latest=True) == {1: "one", 2: ["two"]}
    assert fresh.manager.stats["checkpoint_loaded_offset"] == 1


def test_read_last_and_positions_round_trip_through_bytes(backend: Backend, topic: str) -> None:
    """The two contract calls checkpoints rely on, on each back end."""
    assert backend.read_last(topic, timeout=5) is None  # missing topic
    writer = backend.open_shared_writer(topic)
    try:
        positions = writer.append([b"one", b"two", b"three"], timeout=10)
    finally:
        writer.close()
    last = backend.read_last(topic, timeout=5)
    assert last is not None and last.payload == b"three"
    stored = backend.encode_position(positions[0])
    assert isinstance(stored, bytes)
    reader = backend.create_reader(topic, start=backend.decode_position(stored))
    try:
        assert [reader.read_next(timeout=5).payload for _ in range(2)] == [b"two", b"three"]
        assert not reader.has_next()
    finally:
        reader.close()
    with pytest.raises(ValueError):
        backend.decode_position(b"\xff not a position")
