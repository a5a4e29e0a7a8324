"""Frame epochs are checked against the back end's own epoch, on both back ends (real broker for Pulsar)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_pulsarstate import CorruptEntryError
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind, encode_frames, encode_writes
from airflow_provider_pulsarstate.engine.recipes.map import _PUT
from airflow_provider_pulsarstate.engine.serde import JSON
from airflow_provider_pulsarstate.engine.wal import LogReader
from airflow_provider_pulsarstate.testing import wait_until

FORGED_EPOCH = 2**62


def append_foreign_frame(backend: Backend, topic: str, op: bytes, *, epoch: int, offset: int) -> None:
    """A DATA frame appended by a foreign producer through a shared (non-exclusive) writer."""
    frames = encode_frames(
        kind=RecordKind.DATA,
        epoch=epoch,
        offset=offset,
        writer_id=b"f" * 16,
        body=encode_writes([(1, [op])]),
        max_frame_bytes=1 << 20,
    )
    writer = backend.open_shared_writer(topic)
    try:
        writer.append(frames, timeout=10)
    finally:
        writer.close()


def read_all(reader: LogReader) -> list[Any]:
    out = []
    try:
        while reader.has_next():
            record = reader.read_next(timeout=10)
            if record is not None:
                out.append(record)
    finally:
        reader.close()
    return out


def test_a_frame_claiming_an_epoch_never_granted_is_reported_and_not_obeyed(
    maps: Any, backend: Backend, topic: str
) -> None:
    # operation_timeout=5: before epochs were checked, every later write timed out after it
    a = maps(writer_idle_timeout=0.1, operation_timeout=5)
    a.put("k", 1)
    wait_until(lambda: not a.manager.holds_writer, timeout=10, what="idle writer release")
    forged_op = a._serialize_op((_PUT, "evil", JSON.serialize("forged")))
    append_foreign_frame(backend, topic, forged_op, epoch=FORGED_EPOCH, offset=1)

    assert a.put("k", 2) == 2  # the instance that reads the frame first still writes
    assert a.manager.stats["corrupt_skipped"] == 1
    fresh = maps(operation_timeout=5)
    assert fresh.put("k", 3) == 3  # and so does one that replays it at bootstrap
    assert fresh.manager.stats["corrupt_skipped"] == 1
    assert maps(operation_timeout=5).to_dict(latest=True) == {"k": 3}  # the forged put was never applied

    # A plain reader (on_corrupt="raise") reports it, naming topic, position and epoch ...
    with pytest.raises(CorruptEntryError) as info:
        read_all(LogReader(backend, topic))
    err = info.value
    assert err.topic == topic and err.epoch == FORGED_EPOCH
    assert f"epoch {FORGED_EPOCH}" in str(err) and "position" in str(err) and "not obeyed" in str(err)
    # ... and with on_corrupt="skip" the rest of the log reads normally: offsets 0, 1, 2, no gap
    skipping = LogReader(backend, topic, on_corrupt="skip")
    data = [r for r in read_all(skipping) if r.kind is RecordKind.DATA]
    assert [r.offset for r in data] == [0, 1, 2] and skipping.skipped == 1


def test_the_back_end_is_asked_once_per_new_epoch(
    maps: Any, backend: Backend, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):  # three writers, three epochs
        w = maps(writer_idle_timeout=None)
        for j in range(5):
            w.put(f"k{i}-{j}", j)
        w.close()
    calls: list[str] = []
    real = backend.current_epoch
    monkeypatch.setattr(backend, "current_epoch", lambda t: calls.append(t) or real(t))
    fresh = maps()
    assert fresh.size(latest=True) == 15
    assert calls == [topic]  # the first frame's check covers the whole history
    fresh.put("mine", 1)
    assert calls == [topic]  # the epoch granted to this instance needs no check


def test_a_checkpoint_image_is_checked_against_its_log_epoch(maps: Any) -> None:
    """Image frames carry the log's epoch in a topic that never had an exclusive writer."""
    w = maps(checkpoint_after_bytes=None)
    w.put("a", 1)
    assert w.checkpoint() is not None
    fresh = maps()
    assert fresh.to_dict(latest=True) == {"a": 1}
    assert fresh.manager.stats["checkpoint_loaded_offset"] == 0
