"""The table feed (StateChangeTrigger's engine) on both back ends: commits after a watermark in
counts, one commit's row changes, the log's acceptance rules, checkpoints at or before the
watermark, and precise errors."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind, encode_writes
from airflow_provider_pulsarstate.engine.errors import (
    CommitNotFoundError,
    ConfigurationError,
    SerializationError,
    TableNotFoundError,
)
from airflow_provider_pulsarstate.engine.recipes.lease import Leases
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.engine.recipes.table_feed import TableFeed, read_commit
from airflow_provider_pulsarstate.engine.recipes.table_ops import canonical, encode_op, set_op
from airflow_provider_pulsarstate.engine.wal import open_writer
from tests.engine.test_views import switch


@pytest.fixture
def table(backend: Backend, topic: str) -> Iterator[StateTable]:
    t = StateTable(backend, topic, acquire_timeout=30.0, writer_idle_timeout=0.1, checkpoint_after_bytes=None)
    yield t
    t.close()


def apply_view(table: StateTable, rows: dict[str, dict], **options: Any) -> Any:
    return table.apply(switch(table, rows, **options).view_id, max_delete_fraction=None)


def test_feed_reports_each_commit_after_the_watermark_in_counts(
    backend: Backend, topic: str, table: StateTable
) -> None:
    table.put("sku-1", {"p": 1})
    table.put("other", {"p": 1})
    with TableFeed(backend, topic, key_prefix="sku-") as feed:
        start = feed.start()  # None: starts at the tail, earlier commits are not reported
        assert start == table.manager.applied_offset and feed.poll() == []
        result = apply_view(table, {"sku-1": {"p": 2}, "sku-2": {"p": 3}}, scope_prefix="sku-")
        table.delete("other")
        commits = feed.poll()
    offsets = [c.offset for c in commits]
    assert result.commit_offset in offsets and offsets == sorted(offsets) and all(o > start for o in offsets)
    apply = next(c for c in commits if c.offset == result.commit_offset)
    assert (apply.view_id, apply.view_apply, apply.sets, apply.deletes) == (result.view_id, True, 2, 0)
    assert (apply.prefix_sets, apply.prefix_deletes) == (2, 0)
    delete = commits[-1]
    assert (delete.view_apply, delete.sets, delete.deletes, delete.prefix_deletes) == (False, 0, 1, 0)
    # the view's create and seal are commits too (no row counts), reported in log order
    assert [c.sets + c.deletes for c in commits] == [0, 0, 2, 1]
    assert apply.as_json()["view_id"] == result.view_id and apply.publish_time > 0
    assert feed.stats == {}  # closed; while open its manager's state is None: no rows are held


def test_the_feed_holds_no_rows(backend: Backend, topic: str, table: StateTable) -> None:
    for i in range(50):
        table.put(f"k{i}", {"v": i})
    with TableFeed(backend, topic, after=-1) as feed:
        assert len(feed.poll()) == 50
        assert feed._manager is not None and feed._manager.read(lambda state: state) is None


def test_a_restart_from_the_watermark_neither_misses_nor_repeats(
    backend: Backend, topic: str, table: StateTable
) -> None:
    table.put("a", {"v": 1})
    with TableFeed(backend, topic, after=-1) as feed:
        first = feed.poll()
        watermark = feed.after
    assert [c.offset for c in first] == list(range(table.manager.applied_offset + 1))
    table.put("b", {"v": 2})
    table.put("c", {"v": 3})
    with TableFeed(backend, topic, after=watermark) as again:
        assert [c.offset for c in again.poll()] == [watermark + 1, watermark + 2]
        assert again.poll() == []


def test_the_feed_starts_from_a_manifest_at_or_before_its_watermark(
    backend: Backend, topic: str, table: StateTable
) -> None:
    for i in range(3):
        table.put(f"k{i}", {"v": i})
    early = table.manager.checkpoint()
    for i in range(3, 6):
        table.put(f"k{i}", {"v": i})
    watermark = table.manager.applied_offset
    table.put("k6", {"v": 6})
    late = table.manager.checkpoint()  # the newest manifest lies past the watermark
    assert early is not None and late is not None and early.offset < watermark < late.offset
    with TableFeed(backend, topic, after=watermark) as feed:
        assert [c.offset for c in feed.poll()] == [watermark + 1]
        assert feed.stats["checkpoint_loaded_offset"] == early.offset  # not a replay from 0, not the later one
    with TableFeed(backend, topic, after=late.offset) as tail:
        assert tail.poll() == [] and tail.stats["checkpoint_loaded_offset"] == late.offset


def test_read_commit_returns_exactly_that_commits_changes(backend: Backend, topic: str, table: StateTable) -> None:
    apply_view(table, {"sku-1": {"p": 1}, "sku-2": {"p": 2}, "sku-3": {"p": 3}})
    table.put("eur-1", {"p": 9})
    result = apply_view(table, {"sku-1": {"p": 1}, "sku-2": {"p": 20}, "eur-2": {"p": 5}}, scope_prefix="")
    table.put("sku-9", {"p": 9})
    got = read_commit(backend, topic, result.commit_offset)
    assert sorted((c.type, c.key, c.value) for c in got.changes) == [
        ("delete", "eur-1", None),
        ("delete", "sku-3", None),
        ("set", "eur-2", {"p": 5}),
        ("set", "sku-2", {"p": 20}),
    ]
    assert {c.view_id for c in got.changes} == {result.view_id} and {c.offset for c in got.changes} == {
        result.commit_offset
    }
    assert (got.commit.sets, got.commit.deletes, got.commit.view_id) == (2, 2, result.view_id)
    only_sku = read_commit(backend, topic, result.commit_offset, key_prefix="sku-")
    assert [c.key for c in only_sku.changes] == ["sku-2", "sku-3"] or sorted(c.key for c in only_sku.changes) == [
        "sku-2",
        "sku-3",
    ]
    assert (only_sku.commit.prefix_sets, only_sku.commit.prefix_deletes) == (1, 1)
    summary = got.summary(sample=1)
    assert summary["changes"] == 4 and len(summary["set_keys"]) == 1 and "sample set" in got.table()


def test_errors_name_the_table_and_the_offset(backend: Backend, topic: str, table: StateTable) -> None:
    with pytest.raises(TableNotFoundError, match="does not exist"):
        read_commit(backend, topic, 0)
    with pytest.raises(TableNotFoundError, match=topic):
        TableFeed(backend, topic).start()
    table.put("a", {"v": 1})
    last = table.manager.applied_offset
    with pytest.raises(
        CommitNotFoundError, match=f"offset {last + 1} is not a commit of table .*last commit is {last}"
    ) as err:
        read_commit(backend, topic, last + 1)
    assert (err.value.topic, err.value.offset, err.value.last_offset) == (topic, last + 1, last)
    with pytest.raises(CommitNotFoundError, match="start at 0"):
        read_commit(backend, topic, -1)
    with pytest.raises(ConfigurationError, match="offset must be an int"):
        read_commit(backend, topic, "3")  # type: ignore[arg-type]
    with pytest.raises(CommitNotFoundError, match=f"watermark {last + 5} lies past the last commit {last}"):
        TableFeed(backend, topic, after=last + 5).start()
    with pytest.raises(ConfigurationError, match="after must be an int >= -1"):
        TableFeed(backend, topic, after=-2)


def test_a_write_refused_by_its_lease_fence_is_no_change(backend: Backend, topic: str, table: StateTable) -> None:
    """The feed applies the log's acceptance rules: a record holding only a write under an older
    token (a paused holder's, or forged) changes nothing on any replica, so it is no commit."""
    with Leases(backend, f"{topic}-leases") as leases:
        leases.acquire("nightly", "a", ttl=5.0)
        new = leases.acquire("nightly", "b", ttl=5.0, steal=True)
        table.put("k", {"v": "new holder"}, lease=new)
    [lease_log] = [ref for ref, _ in table.manager.fences]
    with TableFeed(backend, topic) as feed:
        feed.start()
        offset = table.manager.applied_offset + 1
        writer = open_writer(backend, topic, writer_id=uuid.uuid4().bytes, mode=AcquireMode.FENCE, timeout=20)
        try:
            body = encode_writes(
                [(1, [encode_op(set_op("k", canonical({"v": "old holder"})))], (lease_log, "nightly", 1))]
            )
            writer.append(RecordKind.DATA, body, offset=offset, timeout=20)
        finally:
            writer.close()
        table.put("j", {"v": 1})
        commits = feed.poll()
        assert [c.offset for c in commits] == [offset + 1] and feed.after == offset + 1
        assert feed.stats["fenced_skipped"] == 1
    with pytest.raises(CommitNotFoundError, match="refused by a lease fence"):
        read_commit(backend, topic, offset)
    assert table.get("k", latest=True) == {"v": "new holder"}


@pytest.mark.parametrize(
    "op,named",
    [
        (set_op("k", {"v": 1}), "dict"),  # a record, not its canonical bytes
        ({"o": "set", "k": 7, "v": b"{}", "w": None}, "int"),
        ({"o": "del", "k": "k", "w": 3}, "int"),
    ],
)
def test_a_row_op_of_the_wrong_types_is_refused_naming_its_key(op: dict[str, Any], named: str) -> None:
    with pytest.raises(
        SerializationError, match=rf"table row op '(set|del)' of key .*: key and view id must be str.*{named}"
    ):
        encode_op(op)
    assert encode_op(set_op("k", canonical({"v": 1}))).endswith(b'k{"v":1}')
