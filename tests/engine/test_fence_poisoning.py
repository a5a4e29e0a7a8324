"""Fences cannot be poisoned (both back ends, real broker for Pulsar).

A token is accepted only if the lease log named by the handle granted it; fences are keyed by
(lease log, lease name); tokens and names are checked at the boundary; a write that cannot be
encoded fails alone in its group commit; an administrator can reset a fence with a record in the
log. Frames of earlier versions (a lease name only) still replay.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind, decode_fenced_writes, encode_writes
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, LeaseFencedError, SerializationError
from airflow_provider_pulsarstate.engine.manager import SharedStateManager
from airflow_provider_pulsarstate.engine.recipes.lease import Lease, Leases
from airflow_provider_pulsarstate.engine.recipes.map import _PUT
from airflow_provider_pulsarstate.engine.serde import JSON
from airflow_provider_pulsarstate.engine.wal import open_writer
from tests.engine.test_genesis import records

TTL = 5.0
POISON = 2**62


@pytest.fixture
def map_defaults() -> dict[str, Any]:
    return {"acquire_timeout": 20.0, "checkpoint_after_bytes": None}


@pytest.fixture
def lease_logs(backend: Backend, topic: str) -> Iterator[Any]:
    """``lease_logs(suffix="a")``: a Leases on the lease log ``<topic>-leases-<suffix>`` (closed at the end)."""
    made: list[Leases] = []

    def make(suffix: str = "a") -> Leases:
        made.append(Leases(backend, f"{topic}-leases-{suffix}", poll_interval=0.05))
        return made[-1]

    yield make
    for leases in made:
        leases.close()


def grant(leases: Leases, token: int, name: str = "nightly") -> Lease:
    """The handle of ``token``, acquired (with takeovers) until the lease log has granted it."""
    lease: Lease | None = None
    while (info := leases.describe(name)) is None or info.token < token:
        lease = leases.acquire(name, f"holder-{token}", ttl=TTL, steal=True)
    return lease or Lease(name=name, holder=f"holder-{token}", token=token, ttl=TTL, topic=leases.topic)


def forged(leases: Leases, token: int, name: str = "nightly") -> Lease:
    return Lease.from_json({"name": name, "holder": "forger", "token": token, "ttl": TTL, "topic": leases.topic})


def data_records(backend: Backend, topic: str) -> list[Any]:
    return [r for r in records(backend, topic) if r.kind is RecordKind.DATA]


def append_raw(backend: Backend, topic: str, m: Any, writes: list[tuple[Any, ...]]) -> None:
    """Append a DATA record with a writer of its own, as a hostile client or an earlier version would."""
    m.manager.read(lambda s: None, latest=True)
    offset = m.manager.applied_offset
    m.manager.close()  # lets go of the writer (on Pulsar nothing appends beside an exclusive producer)
    body = encode_writes(
        [(seq, [m._serialize_op((_PUT, key, JSON.serialize(value)))], *fence) for seq, key, value, *fence in writes]
    )
    writer = open_writer(backend, topic, writer_id=uuid.uuid4().bytes, mode=AcquireMode.FENCE, timeout=20)
    try:
        writer.append(RecordKind.DATA, body, offset=offset + 1, timeout=20)
    finally:
        writer.close()


def test_a_forged_token_of_2_62_is_refused_and_later_guarded_writes_land(maps: Any, lease_logs: Any) -> None:
    leases = lease_logs()
    m = maps()
    m.put("k", "holder 1", lease=grant(leases, 1))
    with pytest.raises(LeaseFencedError) as err:  # LeaseNotGrantedError
        m.put("k", "forged", lease=forged(leases, POISON))
    assert (err.value.token, err.value.newer_token) == (POISON, 1) and "never granted" in str(err.value)
    assert m.manager.checkpoint() is not None
    m.put("k", "holder 2", lease=grant(leases, 2))
    assert m.get("k", latest=True) == "holder 2"
    fresh = maps()
    assert fresh.get("k", latest=True) == "holder 2" and fresh.manager.stats["checkpoint_loaded_offset"] >= 0
    assert list(fresh.manager.fences.values()) == [2]
    fresh.put("k", "holder 3", lease=grant(leases, 3))
    assert m.get("k", latest=True) == "holder 3"


def test_a_token_the_lease_log_never_granted_is_refused_even_one_above_the_last(
    maps: Any, lease_logs: Any, backend: Backend, topic: str
) -> None:
    leases = lease_logs()
    m = maps()
    m.put("k", 1, lease=grant(leases, 1))
    before = len(data_records(backend, topic))
    with pytest.raises(LeaseFencedError) as err:
        m.put("k", 2, lease=forged(leases, 2))
    assert (err.value.lease, err.value.token, err.value.lease_log, err.value.granted) == ("nightly", 2, leases.topic, 1)
    with pytest.raises(LeaseFencedError, match="never granted"):  # a lease log that does not exist granted nothing
        m.put("k", 2, lease=forged(lease_logs("missing"), 1))
    assert len(data_records(backend, topic)) == before and m.get("k", latest=True) == 1


def test_two_lease_logs_with_the_same_lease_name_do_not_block_each_other(maps: Any, lease_logs: Any) -> None:
    deployment_a, deployment_b = lease_logs("a"), lease_logs("b")
    m = maps()
    m.put("a", 3, lease=grant(deployment_a, 3))
    m.put("b", 1, lease=grant(deployment_b, 1))  # a lower token, of another lease log
    assert sorted(m.manager.fences.values()) == [1, 3] and len({ref for ref, _ in m.manager.fences}) == 2
    with pytest.raises(LeaseFencedError):  # each lease log still fences its own older holders
        m.put("a", 2, lease=grant(deployment_a, 2))
    assert maps().to_dict(latest=True) == {"a": 3, "b": 1}


def test_a_recreated_lease_log_whose_tokens_restart_at_1_is_not_blocked(
    maps: Any, backend: Backend, topic: str
) -> None:
    lease_log = f"{topic}-leases"
    with Leases(backend, lease_log) as old:
        lease = grant(old, 3)
    first = maps()
    first.put("k", "old lease log", lease=lease)
    first.close()  # its replica of the lease log too
    backend.delete_topic(lease_log)
    with Leases(backend, lease_log) as recreated:
        lease = recreated.acquire("nightly", "new deployment", ttl=TTL)
        assert lease.token == 1
        m = maps()
        m.put("k", "recreated lease log", lease=lease)
    assert maps().get("k", latest=True) == "recreated lease log"


@pytest.mark.parametrize(
    ("handle", "field"),
    [
        ({"token": 2**64}, "'token'"),
        ({"token": 2**70}, "'token'"),
        ({"name": "night\ud800ly"}, "'name'"),
        ({"topic": "persistent://public/default/\ud800"}, "'topic'"),
    ],
)
def test_tokens_and_names_a_frame_cannot_hold_are_refused_at_the_boundary(
    maps: Any, lease_logs: Any, handle: dict[str, Any], field: str
) -> None:
    leases = lease_logs()
    good = {"name": "nightly", "holder": "h", "token": 1, "ttl": TTL, "topic": leases.topic}
    data = {**good, **handle}
    with pytest.raises(ConfigurationError, match=field):
        Lease.from_json(data)
    m = maps()
    with pytest.raises(ConfigurationError, match=field):
        m.put("k", 1, lease=Lease(**data))
    assert m.manager.applied_offset == -1
    with pytest.raises(ConfigurationError, match="'holder'"):
        Lease.from_json({**good, "holder": "\udc00"})


def test_a_lone_surrogate_is_refused_by_leases_naming_the_field(lease_logs: Any) -> None:
    leases = lease_logs()
    with pytest.raises(ConfigurationError, match="'name'"):
        leases.acquire("\ud800", "h", ttl=TTL)
    with pytest.raises(ConfigurationError, match="'holder'"):
        leases.acquire("nightly", "\ud800", ttl=TTL)
    with pytest.raises(ConfigurationError, match="'name'"):
        leases.describe("\ud800")


def test_a_handle_with_token_2_64_among_20_good_writes_fails_alone(maps: Any, lease_logs: Any) -> None:
    lease = grant(lease_logs(), 1)
    m = maps()
    m.put("start", 0)
    good: list[Any] = []
    refused: list[BaseException] = []
    for i in range(20):
        good.append(m.put_async(f"k{i}", i, lease=lease if i % 2 else None))
        if i == 10:
            try:
                poisoned = m.put_async("poisoned", 1, lease=Lease("nightly", "h", 2**64, TTL, lease.topic))
            except ConfigurationError as exc:
                refused.append(exc)
            else:
                refused.append(poisoned.exception(timeout=60))
    assert [f.exception(timeout=60) for f in good] == [None] * 20
    assert isinstance(refused[0], ConfigurationError) and "'token'" in str(refused[0])
    assert m.to_dict(latest=True) == {"start": 0, **{f"k{i}": i for i in range(20)}}


def test_in_one_group_commit_a_write_that_cannot_be_encoded_fails_alone(
    maps: Any, lease_logs: Any, backend: Backend, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that got past the boundary check (here: the check is bypassed) and cannot be
    encoded fails with SerializationError; the 20 others of its record land."""
    lease = grant(lease_logs(), 1)
    m = maps()
    m.put("start", 0, lease=lease)
    ref = next(iter(m.manager.fences))[0]
    monkeypatch.setattr(SharedStateManager, "_resolve_fence", lambda self, f: (ref, f.name, f.token), raising=False)
    gate, entered = threading.Event(), threading.Event()

    def hold(_state: Any) -> list[Any]:
        entered.set()
        gate.wait(30)
        return []

    blocker = m.manager.write_async(hold)  # holds the commit thread: the rest queue up behind it
    assert entered.wait(30)  # inside it before anything else is queued (a slow start would batch some with it)
    futures = [m.put_async(f"k{i}", i, lease=lease if i % 2 else None) for i in range(10)]
    poisoned = m.put_async("poisoned", 1, lease=Lease("nightly", "h", 2**64, TTL, lease.topic))
    futures += [m.put_async(f"k{i}", i, lease=lease if i % 2 else None) for i in range(10, 20)]
    before = len(data_records(backend, topic))
    gate.set()
    blocker.result(timeout=60)
    assert [f.exception(timeout=60) for f in futures] == [None] * 20
    err = poisoned.exception(timeout=60)
    assert isinstance(err, SerializationError) and "cannot be encoded" in str(err), err
    assert len(data_records(backend, topic)) == before + 1  # one record for the 20
    assert maps().to_dict(latest=True) == {"start": 0, **{f"k{i}": i for i in range(20)}}


def test_reset_fence_lifts_a_forged_fence_with_a_record_in_the_log(
    maps: Any, lease_logs: Any, backend: Backend, topic: str
) -> None:
    leases = lease_logs()
    m = maps()
    m.put("k", "holder 1", lease=grant(leases, 1))
    [key] = m.manager.fences
    append_raw(backend, topic, m, [(7, "k", "forged", (key[0], "nightly", POISON))])  # a writer of its own
    m = maps()
    with pytest.raises(LeaseFencedError) as err:
        m.put("k", "holder 2", lease=grant(leases, 2))
    assert err.value.newer_token == POISON
    assert m.manager.reset_fence("nightly", lease_log=leases.topic) == {key: POISON}
    last = data_records(backend, topic)[-1]
    assert [(ops, f) for _, ops, f in decode_fenced_writes(last.body)] == [([], (leases.topic, "nightly", 0))]
    m.put("k", "holder 2", lease=grant(leases, 2))
    assert m.manager.checkpoint() is not None
    for fresh in (maps(), maps(use_checkpoints=False)):
        assert fresh.get("k", latest=True) == "holder 2" and fresh.manager.fences == {key: 2}
    assert m.manager.reset_fence("nightly") == {key: 2}  # every lease log; recorded even when nothing else changes
    fresh = maps()
    fresh.manager.read(lambda s: None, latest=True)
    assert fresh.manager.fences == {}
    with pytest.raises(ConfigurationError, match="'lease_log'"):
        m.manager.reset_fence("nightly", lease_log="\ud800")


def test_frames_of_earlier_versions_replay_under_the_legacy_lease_log(
    maps: Any, lease_logs: Any, backend: Backend, topic: str
) -> None:
    """Earlier versions keyed fences by lease name only: their frames keep fencing each other on
    replay, under lease log "", and block no write that names its lease log."""
    m = maps()
    m.put("start", 0)
    append_raw(backend, topic, m, [(1, "k", "old holder 5", ("nightly", 5)), (2, "k", "old holder 3", ("nightly", 3))])
    fresh = maps()
    assert fresh.get("k", latest=True) == "old holder 5" and fresh.manager.stats["fenced_skipped"] == 1
    assert fresh.manager.fences == {("", "nightly"): 5}
    fresh.put("k", "new holder 1", lease=grant(lease_logs(), 1))
    info = fresh.manager.checkpoint()
    assert info is not None and info.fences == fresh.manager.fences and len(info.fences) == 2
    again = maps()
    assert again.get("k", latest=True) == "new holder 1" and again.manager.fences == fresh.manager.fences
