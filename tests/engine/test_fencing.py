"""Fencing tokens where state is applied (both back ends, real broker for Pulsar): a state log keeps the
highest token it has seen per (lease log, lease name), refuses lower ones at append and skips them on
replay. Tokens come from a real lease log: a token it never granted is refused (test_fence_poisoning.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConfigurationError
from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind, decode_fenced_writes, encode_writes
from airflow_provider_pulsarstate.engine.errors import LeaseFencedError
from airflow_provider_pulsarstate.engine.recipes.lease import Lease, Leases
from airflow_provider_pulsarstate.engine.recipes.map import _PUT
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.engine.serde import JSON
from airflow_provider_pulsarstate.engine.wal import open_writer
from tests.engine.test_genesis import records


@pytest.fixture
def map_defaults() -> dict[str, Any]:
    return {"acquire_timeout": 20.0, "checkpoint_after_bytes": None}


@dataclass(frozen=True)
class Token:
    name: str
    token: int


@pytest.fixture
def lease(backend: Backend, topic: str) -> Iterator[Callable[..., Lease]]:
    """``lease(token, name="nightly")``: a handle of that token, granted by the test's lease log
    (acquired as many times as needed: tokens grow by one)."""
    with Leases(backend, f"{topic}-leases", poll_interval=0.05) as leases:

        def make(token: int, name: str = "nightly") -> Lease:
            while (info := leases.describe(name)) is None or info.token < token:
                leases.acquire(name, f"holder-{token}", ttl=5.0, steal=True)
            return Lease(name=name, holder=f"holder-{token}", token=token, ttl=5.0, topic=leases.topic)

        yield make


def by_name(fences: dict[tuple[str, str], int]) -> dict[str, int]:
    return {name: token for (_, name), token in fences.items()}


def data_records(backend: Backend, topic: str) -> list[Any]:
    return [r for r in records(backend, topic) if r.kind is RecordKind.DATA]


def test_a_lower_token_is_refused_naming_lease_and_tokens_and_nothing_is_appended(
    maps: Any, backend: Backend, topic: str, lease: Any
) -> None:
    m = maps()
    m.put("k", "new leader", lease=lease(2))
    before = len(data_records(backend, topic))
    with pytest.raises(LeaseFencedError) as err:
        m.put("k", "old leader", lease=lease(1))
    assert (err.value.lease, err.value.token, err.value.newer_token, err.value.topic) == ("nightly", 1, 2, topic)
    assert "'nightly'" in str(err.value) and "token 1" in str(err.value) and "token 2" in str(err.value)
    assert len(data_records(backend, topic)) == before
    assert m.get("k", latest=True) == "new leader"
    # the same token and higher ones pass; other lease names and unfenced writes are independent
    m.put("k", "same", lease=lease(2))
    m.put("k", "newer", lease=lease(3))
    m.put("other", 1, lease=lease(1, name="other-lease"))
    m.put("free", 1)
    assert by_name(m.manager.fences) == {"nightly": 3, "other-lease": 1}
    assert m.to_dict(latest=True) == {"k": "newer", "other": 1, "free": 1}


def test_another_instance_with_an_older_token_is_refused_after_catching_up(maps: Any, topic: str, lease: Any) -> None:
    """The paused-old-leader case: B holds token 5 in its hand but A wrote with 6 meanwhile; B's
    write is generated only after B took the writer and read A's record, so it is refused."""
    a, b = maps(), maps()
    b.put("seen-by-b", True)  # B's replica is now behind what A is about to write
    a.put("job", "run of the new holder", lease=lease(6))
    with pytest.raises(LeaseFencedError) as err:
        b.update("job", lambda k, v: "run of the paused holder", lease=lease(5))
    assert err.value.newer_token == 6
    assert b.get("job", latest=True) == "run of the new holder"
    assert a.get("job", latest=True) == "run of the new holder"


def test_a_write_under_a_new_token_records_it_even_when_it_changes_nothing(
    maps: Any, backend: Backend, topic: str, lease: Any
) -> None:
    m = maps()
    m.put("k", 1, lease=lease(1))
    records_before = len(data_records(backend, topic))
    m.put("k", 1, lease=lease(4))  # same value: no op, but a token the log has not seen
    assert len(data_records(backend, topic)) == records_before + 1
    m.put("k", 1, lease=lease(4))  # known token, no op: nothing appended
    assert len(data_records(backend, topic)) == records_before + 1
    fresh = maps()
    assert fresh.manager.read(lambda s: None, latest=True) is None and by_name(fresh.manager.fences) == {"nightly": 4}
    with pytest.raises(LeaseFencedError):
        fresh.put("k", 2, lease=lease(3))


def test_in_one_group_commit_a_stale_write_fails_alone(maps: Any, lease: Any) -> None:
    m = maps()
    m.put("start", 0)
    futures = [m.put_async(f"k{i}", i, lease=lease(t)) for i, t in enumerate([9, 5, 9, 10])]
    outcomes = []
    for f in futures:
        try:
            f.result(timeout=60)
            outcomes.append("ok")
        except LeaseFencedError as exc:
            outcomes.append(f"fenced by {exc.newer_token}")
    # k1 (token 5) is refused whether or not it shared a record with the token-9 write before it
    assert outcomes[1].startswith("fenced by") and outcomes[0] == "ok" and outcomes[3] == "ok"
    assert "k1" not in m.to_dict(latest=True) and by_name(m.manager.fences) == {"nightly": 10}


def test_a_forged_record_with_an_older_token_is_skipped_by_every_replica(
    maps: Any, backend: Backend, topic: str, lease: Any
) -> None:
    """Only a broken or hostile writer can put one in the log (the writer checks first); replicas
    must still agree to ignore it."""
    live = maps(follow_interval=0.05)
    live.put("k", "legit", lease=lease(7))
    offset = live.manager.applied_offset
    [lease_log] = [ref for ref, _ in live.manager.fences]
    writer = open_writer(backend, topic, writer_id=uuid.uuid4().bytes, mode=AcquireMode.FENCE, timeout=20)
    try:
        op = live._serialize_op((_PUT, "k", JSON.serialize("forged by the old leader")))
        unfenced = live._serialize_op((_PUT, "bystander", JSON.serialize("kept")))
        body = encode_writes([(1, [op], (lease_log, "nightly", 3)), (2, [unfenced])])
        writer.append(RecordKind.DATA, body, offset=offset + 1, timeout=20)
    finally:
        writer.close()
    forged = data_records(backend, topic)[-1]
    assert [f for _, _, f in decode_fenced_writes(forged.body)] == [(lease_log, "nightly", 3), None]
    fresh = maps()
    assert fresh.to_dict(latest=True) == {"k": "legit", "bystander": "kept"}
    assert fresh.manager.stats["fenced_skipped"] == 1
    assert live.to_dict(latest=True) == {"k": "legit", "bystander": "kept"}


def test_checkpoints_carry_the_fences(maps: Any, lease: Any) -> None:
    m = maps()
    m.put("k", 1, lease=lease(7))
    m.put("j", 1, lease=lease(2, name="other"))
    info = m.checkpoint()
    assert info is not None and by_name(info.fences) == {"nightly": 7, "other": 2}
    fresh = maps()
    fresh.manager.start()
    assert fresh.manager.stats["checkpoint_loaded_offset"] == info.offset
    assert fresh.manager.fences == info.fences
    with pytest.raises(LeaseFencedError):
        fresh.put("k", 2, lease=lease(6))


def test_state_table_writes_and_view_apply_are_fenced(backend: Backend, topic: str, lease: Any) -> None:
    with StateTable(backend, topic, acquire_timeout=20.0) as table:
        table.put("a", {"v": 1}, lease=lease(3))
        with pytest.raises(LeaseFencedError):
            table.put("a", {"v": 2}, lease=lease(2))
        view = table.create_view(lease=lease(3))
        with table.stager(view.view_id) as stager:
            stager.set("a", {"v": 99})
            stager.set("b", {"v": 1})
        table.seal(view.view_id, stagers=[stager], lease=lease(3))
        table.put("guard", {"v": 0}, lease=lease(4))  # a newer holder wrote meanwhile
        with pytest.raises(LeaseFencedError) as err:
            table.apply(view.view_id, lease=lease(3))
        assert err.value.newer_token == 4
        assert table.view_info(view.view_id).status == "open"
        assert table.to_dict(latest=True) == {"a": {"v": 1}, "guard": {"v": 0}}
        result = table.apply(view.view_id, lease=lease(4), overwrite=True)  # "guard" changed since the baseline
        assert (result.set, result.delete) == (2, 1)


@pytest.mark.parametrize(
    ("fence", "problem"),
    [
        (Token("", 1), "lease name must be a non-empty string"),
        (Token("x", 0), "must be a positive integer, got 0"),
        (Token("x", True), "must be a positive integer, got True"),
        (Token("x" * 2000, 1), "longer than 1024 bytes"),
        (object(), "lease name must be a non-empty string, got None"),
    ],
)
def test_a_bad_lease_is_refused_before_anything_happens(maps: Any, fence: Any, problem: str) -> None:
    m = maps()
    with pytest.raises(ConfigurationError, match=problem):
        m.put("k", 1, lease=fence)
    assert m.manager.applied_offset == -1


def test_unfenced_writes_carry_no_lease_and_checkpoint_no_fences(maps: Any, backend: Backend, topic: str) -> None:
    m = maps()
    m.put("k", 1)
    m.put("j", 2)
    info = m.checkpoint()
    assert info is not None and info.fences == {}
    bodies = [decode_fenced_writes(r.body) for r in data_records(backend, topic)]
    assert len(bodies) == 2 and all(f is None for writes in bodies for _, _, f in writes)
