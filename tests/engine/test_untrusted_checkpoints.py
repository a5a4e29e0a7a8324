"""Checkpoint topics are untrusted input (both back ends, real broker for Pulsar): a forged or
damaged manifest never deletes a topic that is not this table's image, never puts a forged state
in place of the log's, and never stops a bootstrap."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest

from airflow_provider_pulsarstate import PulsarMap
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.envelope import RecordKind, encode_frames
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, CheckpointError
from airflow_provider_pulsarstate.engine.wal import LogReader
from airflow_provider_pulsarstate.testing.harness import ForwardingBackend
from tests.conftest import count_entries


@pytest.fixture
def map_defaults() -> dict[str, Any]:
    return {"acquire_timeout": 20.0, "checkpoint_after_bytes": None}


def filled(maps: Any, n: int = 20) -> tuple[PulsarMap, Any]:
    w = maps()
    for i in range(n):
        w.put(f"k{i}", i)
    info = w.checkpoint()
    assert info is not None and info.offset == n - 1
    return w, info


def last_manifest(backend: Backend, store: CheckpointStore) -> dict[str, Any]:
    entry = backend.read_last(store.index_topic, timeout=10)
    assert entry is not None
    return json.loads(entry.payload)


def replay_warning(caplog: pytest.LogCaptureFixture) -> str:
    return next(r.getMessage() for r in caplog.records if "replaying the whole log" in r.getMessage())


@pytest.mark.parametrize("target", ["the log", "the manifest topic", "another table's log"])
def test_a_forged_previous_never_deletes_a_topic_that_is_not_an_own_image(
    target: str, maps: Any, backend: Backend, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    w, _ = filled(maps)
    store = CheckpointStore(backend, topic)
    other = f"{topic}-other-table"
    with PulsarMap(backend, other, checkpoint_after_bytes=None) as neighbour:
        neighbour.put("mine", 1)
    victim = {"the log": topic, "the manifest topic": store.index_topic, "another table's log": other}[target]
    forged = last_manifest(backend, store)
    forged["previous"] = victim
    store._append(store.index_topic, [json.dumps(forged).encode()])
    w.put("k20", 20)
    w.checkpoint()  # the old code deleted forged["previous"] here
    w.put("k21", 21)
    assert w.checkpoint() is not None
    fresh = maps(use_checkpoints=False)
    assert fresh.to_dict(latest=True) == {f"k{i}": i for i in range(22)}
    with PulsarMap(backend, other, checkpoint_after_bytes=None) as again:
        assert again.to_dict(latest=True) == {"mine": 1}
    assert (
        count_entries(backend, store.index_topic) == 4
    )  # the genuine manifest, the forged one and two new ones: none deleted


def test_only_exact_image_names_of_this_log_count_as_own_images(backend: Backend, topic: str) -> None:
    store = CheckpointStore(backend, topic)
    assert store.is_own_image(f"{topic}-checkpoint-41-0123abcd")
    for name in (
        topic,
        store.index_topic,
        f"{topic}-checkpoint-41-0123abcd/x",
        f"{topic}-checkpoint-041-0123abcd",
        f"{topic}-checkpoint-41-0123ABCD",
        f"{topic}x-checkpoint-41-0123abcd",
        f"{topic}-checkpoint--1-0123abcd",
        "persistent://public/default/other-checkpoint-41-0123abcd",
        None,
        7,
    ):
        assert not store.is_own_image(name), name


@pytest.mark.parametrize("forgery", ["offset", "epoch", "position", "image frames"])
def test_a_forged_image_is_never_served(
    forgery: str, maps: Any, backend: Backend, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A complete, checksummed image whose manifest does not match the log is not loaded."""
    w, info = filled(maps)
    with PulsarMap(backend, f"{topic}-evil", checkpoint_after_bytes=None) as evil:
        evil.put("evil", "forged")
        image = evil.manager.read(evil.manager.state_serializer)
    store = CheckpointStore(backend, topic)
    early_position = None
    if forgery == "position":
        reader = LogReader(backend, topic)  # find record 3's position
        try:
            while (rec := reader.read_next(timeout=10, drain=True)) is not None:
                if rec.kind is RecordKind.DATA and rec.offset == 3:
                    early_position = rec.position
                    break
        finally:
            reader.close()
        assert early_position is not None
    offset = info.offset + 5 if forgery == "offset" else info.offset
    epoch = info.epoch + 7 if forgery == "epoch" else info.epoch
    position = early_position if forgery == "position" else info.position
    if forgery == "image frames":
        # The manifest is genuine (offset, epoch, position of the last record); the image's frames
        # say another offset.
        saved = store.save(offset=offset, epoch=epoch, position=position, data=image, log_id=info.log_id)
        frames = encode_frames(
            kind=RecordKind.CHECKPOINT,
            epoch=epoch,
            offset=3,
            writer_id=bytes.fromhex(saved.checkpoint_id),
            body=image,
            max_frame_bytes=1 << 20,
        )
        backend.delete_topic(saved.data_topic)
        store._append(saved.data_topic, frames)
    else:
        store.save(offset=offset, epoch=epoch, position=position, data=image, log_id=info.log_id)
    caplog.set_level(logging.WARNING, logger="airflow_provider_pulsarstate")
    fresh = maps()
    assert fresh.to_dict(latest=True) == {f"k{i}": i for i in range(20)}
    assert fresh.manager.stats["checkpoint_loaded_offset"] == -1
    warning = replay_warning(caplog)
    assert topic in warning
    assert ("manifest says" in warning) if forgery != "image frames" else ("of offset 3" in warning)


def _bad_manifests(good: dict[str, Any], backend: Backend) -> dict[str, bytes]:
    def but(**changes: Any) -> bytes:
        return json.dumps({**good, **changes}).encode()

    return {
        "empty list": b"[]",
        "null": b"null",
        "a string": b'"manifest"',
        "offset as a string": but(offset=str(good["offset"])),
        "offset as a bool": but(offset=True),
        "negative offset": but(offset=-1),
        "bad base64 position": but(position="!!not base64!!"),
        "foreign position bytes": but(position=base64.b64encode(b"\xff\x00junk").decode()),
        "image topic is the log": but(data_topic=good["topic"]),
        "id not hex": but(id="z" * 32),
        "previous as a list": but(previous=[good["data_topic"]]),
        "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    }


def test_every_malformed_manifest_means_a_warning_and_a_full_replay(
    maps: Any, backend: Backend, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    filled(maps)
    store = CheckpointStore(backend, topic)
    good = last_manifest(backend, store)
    caplog.set_level(logging.WARNING, logger="airflow_provider_pulsarstate")
    for name, payload in _bad_manifests(good, backend).items():
        caplog.clear()
        store._append(store.index_topic, [payload])
        fresh = maps()
        assert fresh.to_dict(latest=True) == {f"k{i}": i for i in range(20)}, name
        assert fresh.manager.stats["checkpoint_loaded_offset"] == -1, name
        warning = replay_warning(caplog)
        assert topic in warning and "does not decode" in warning, (name, warning)
        fresh.close()
    # A good manifest after them is used again.
    store._append(store.index_topic, [json.dumps(good).encode()])
    assert maps().to_dict(latest=True) == {f"k{i}": i for i in range(20)}


class ReadOnlyCheckpoints(ForwardingBackend):
    """The reader's role may neither read nor write the checkpoint topics (``<topic>-checkpoint*``):
    every call on them fails as the back end fails on a permission error (BackendUnavailableError
    from the admin API's 401/403 or the client's AuthorizationError)."""

    def __init__(self, inner: Backend, topic: str) -> None:
        super().__init__(inner)
        self.prefix, self.denied = f"{topic}-checkpoint", 0

    def check(self, operation: str, topic: str) -> None:
        if operation != "current_epoch" and topic.startswith(self.prefix):
            self.denied += 1
            raise BackendUnavailableError(f"Pulsar admin API GET {topic} answered 403: not authorized")

    def close(self) -> None:
        pass  # the inner back end belongs to the fixture


@pytest.mark.parametrize("checkpoints_exist", [True, False])
def test_a_reader_without_access_to_checkpoint_topics_bootstraps_by_replaying(
    checkpoints_exist: bool, maps: Any, backend: Backend, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    if checkpoints_exist:
        filled(maps)
    else:
        w = maps()
        for i in range(20):
            w.put(f"k{i}", i)
    restricted = ReadOnlyCheckpoints(backend, topic)
    caplog.set_level(logging.WARNING, logger="airflow_provider_pulsarstate")
    reader = maps(on=restricted)
    assert reader.to_dict(latest=True) == {f"k{i}": i for i in range(20)}
    assert restricted.denied >= 1
    reader.put("k20", 20)  # it writes the log as usual
    with pytest.raises(CheckpointError, match="403"):
        reader.checkpoint()  # an explicit checkpoint says why it cannot be stored
    automatic = maps(on=restricted, checkpoint_after_bytes=1)
    for i in range(5):
        automatic.put(f"auto{i}", i)  # failing automatic checkpoints cost nothing but a warning
    assert maps(use_checkpoints=False).get("auto4", latest=True) == 4


def test_read_at_returns_exactly_the_entry_at_a_position(backend: Backend, topic: str) -> None:
    """The contract call manifests are checked with, on each back end."""
    writer = backend.open_shared_writer(topic)
    try:
        positions = writer.append([b"one", b"two", b"three"], timeout=10)
    finally:
        writer.close()
    for position, payload in zip(positions, [b"one", b"two", b"three"]):
        entry = backend.read_at(topic, position, timeout=5)
        assert entry is not None and entry.payload == payload
    assert backend.read_at(f"{topic}-missing", positions[0], timeout=5) is None
    other = f"{topic}-short"
    writer = backend.open_shared_writer(other)
    try:
        writer.append([b"only"], timeout=10)
    finally:
        writer.close()
    assert backend.read_at(other, positions[2], timeout=5) is None  # no entry there in that topic
