"""Exactly-once ingestion: the price-events example pipeline end to end, and killed at each task boundary.

Real ``dag.test()`` runs and a real ``spark-submit`` in local mode. The expected table is always a
pure-Python fold of the events (the job's own generator and fold, or the messages pulled back
from the topic), never something Spark computed.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.errors import SourceOffsetsConflictError
from airflow_provider_pulsarstate.engine.recipes.table import TableChange
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from tests.airflow.dagruns import EXAMPLE_DAGS, load_dag, load_job, run_dag, run_pipeline_worker, worker_result
from tests.airflow.test_views_operators import _table

EVENTS, SKUS = 400, 1500
DAG_ID = "price_events_pipeline"
# A worker killed while holding the table's lease holds off the next run until the lease expires:
# a short ttl keeps that wait short (the guarded tasks renew it every ttl / 3 while they run).
LEASE_TTL = 10


job = load_job("price_events_job")


def _conf(batch: int, names: dict[str, str]) -> dict[str, Any]:
    return {"batch": batch, "events": EVENTS, "skus": SKUS, "lease_ttl": LEASE_TTL, **names}


def _names() -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return {
        "events_topic": f"events-{suffix}",
        "table_topic": f"events-table-{suffix}",
        "subscription": f"ingest-{suffix}",
    }


def _topic_fold(hook: PulsarStateHook, topic: str, below: dict[int, int]) -> tuple[dict[str, dict], int]:
    """The fold of the topic's messages below ``below`` (per partition), pulled back in offset
    order, and how many there were: what the table must hold if every message counted once."""
    consumer = hook.get_pull_consumer(topic)
    events = []
    for p in consumer.partitions():
        offset = consumer.beginning_offsets()[p]
        while offset < below.get(p, 0):
            result = consumer.pull(offset, partition=p, max_messages=500)
            events += [json.loads(m.value) for m in result.messages if m.offset < below[p]]
            if not result.messages:
                break
            offset = result.next_offset
    return job.fold(events), len(events)


def _state(
    hook: PulsarStateHook, names: dict[str, str]
) -> tuple[dict[str, dict], dict[int, int], dict[int, int | None], dict[int, int]]:
    """(table rows, the table's recorded offsets, the subscription's cursor, the topic's end offsets)."""
    topic = hook.topic_name(names["events_topic"])
    rows, recorded = _table(hook, names["table_topic"]).rows_with_source_offsets(topic)
    consumer = hook.get_pull_consumer(topic, names["subscription"])
    cursor = {p: consumer.committed(partition=p) for p in consumer.partitions()}
    return rows, recorded, cursor, consumer.end_offsets()


# ---------------------------------------------------------------------------------- end to end
def test_second_run_consumes_only_new_events_and_publishes_only_changed_rows(
    dag_bundles: None, state_backend: str
) -> None:
    dag = load_dag(EXAMPLE_DAGS, DAG_ID)
    names = _names()
    batch1, batch2 = job.batch_events(1, EVENTS, SKUS), job.batch_events(2, EVENTS, SKUS)

    first = run_dag(dag, _conf(1, names))
    assert first.state == "success", first.states
    v1 = job.fold(batch1)
    assert first.xcoms["report"]["offsets_consumed"] == EVENTS or state_backend == "pulsar"
    assert first.xcoms["report"]["set"] == len(v1) and first.xcoms["report"]["delete"] == 0

    with PulsarStateHook() as hook:
        rows, recorded, cursor, end = _state(hook, names)
        assert rows == v1 and recorded == end and cursor == end  # the cursor followed the record
        table = _table(hook, names["table_topic"])
        changes: list[TableChange] = []
        table.add_listener(changes.append)

        second = run_dag(dag, _conf(2, names))
        assert second.state == "success", second.states
        v2 = job.fold(batch2, v1)
        touched = {e["sku"] for e in batch2}  # every sku with a new event changes (its event count moves)
        report, result = second.xcoms["report"], second.xcoms["prices.apply_view"]
        # exactly the new range: from run 1's record to the new end
        rows, recorded2, cursor2, end2 = _state(hook, names)
        assert {int(p): tuple(r) for p, r in report["offsets"].items()} == {p: (recorded[p], end2[p]) for p in end2}
        assert sum(end2[p] - recorded[p] for p in end2) == report["offsets_consumed"]
        assert (result["set"], result["delete"], result["unchanged"]) == (len(touched), 0, len(v1.keys() - touched))
        assert rows == v2 and recorded2 == end2 and cursor2 == end2
        assert table.to_dict(latest=True) == v2  # the listener's table catches up
        assert {c.key for c in changes} == touched and {c.offset for c in changes} == {result["commit_offset"]}
        assert _topic_fold(hook, hook.topic_name(names["events_topic"]), end2)[0] == v2


# ---------------------------------------------------------------------------------- kill and retry
def _worker(names: dict[str, str], batch: int, kill_after: str) -> dict[str, Any] | None:
    """One dag.test() run in a child process that SIGKILLs itself after ``kill_after`` (or finishes)."""
    proc = run_pipeline_worker(_conf(batch, names), env=os.environ, kill_after=kill_after)
    if kill_after and not kill_after.startswith("fail:"):
        tail = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        assert proc.returncode == -9 and f"KILLED after {kill_after}" in proc.stdout, f"rc={proc.returncode}{tail}"
        return None
    return worker_result(proc)


# Each series runs its batches in order: every run publishes a new batch, then its worker dies after
# one task (or fails once and is retried); the next run follows. The two series are independent (own
# topics), so they run in parallel; together they cover every task boundary of the pipeline.
KILL_SERIES = {
    "dies-before-the-cursor-moves": [
        "publish_events",
        "wait_for_events",
        "prices.spark_job",
        "prices.apply_view",
        "",
    ],
    "dies-after-the-cursor-moved": [
        "prices.commit_offsets",
        "fail:prices.apply_view",  # fails after its commit, retried in the same run: already applied, nothing twice
    ],
}


@pytest.mark.usefixtures("dag_bundles")
@pytest.mark.timeout(1200)  # up to five runs with a real spark-submit each: ~4 min alone on 2 cores
@pytest.mark.parametrize("series", list(KILL_SERIES))
def test_every_event_counts_exactly_once_when_a_worker_dies_at_each_task_boundary(
    state_backend: str, series: str
) -> None:
    names = _names()
    stale_view = None
    boundaries = KILL_SERIES[series]
    for batch, kill_after in enumerate(boundaries, start=1):
        outcome = _worker(names, batch, kill_after)
        with PulsarStateHook() as hook:
            topic = hook.topic_name(names["events_topic"])
            rows, recorded, cursor, end = _state(hook, names)
            expected, counted = _topic_fold(hook, topic, recorded)
            # whatever died, the table is the fold of exactly the messages below its record
            assert rows == expected, f"batch {batch}, killed after {kill_after}"
            if kill_after == "prices.spark_job":  # staged and sealed, never applied
                views = [v for v in _table(hook, names["table_topic"]).views() if v.status == "open" and v.sources]
                assert len(views) == 1 and recorded == {}
                stale_view = views[0].view_id
            if kill_after == "prices.apply_view":  # applied, the cursor not yet moved
                assert recorded == end and cursor != recorded
                # the view staged by the dead run 3 read from the same (empty) record: applying it now would double-count
                assert stale_view is not None
                with pytest.raises(SourceOffsetsConflictError, match="consumed .* partition"):
                    _table(hook, names["table_topic"]).apply(stale_view)
            if kill_after in ("prices.commit_offsets", "fail:prices.apply_view", ""):
                assert recorded == end and cursor == recorded
            if kill_after.startswith("fail:"):
                assert outcome is not None and outcome["state"] == "success", outcome
                assert outcome["states"]["prices.apply_view"] == "success"
                assert outcome["tries"]["prices.apply_view"] == 2  # it really failed once and was retried
    assert outcome is not None and outcome["state"] == "success", outcome
    everything = [e for batch in range(1, len(boundaries) + 1) for e in job.batch_events(batch, EVENTS, SKUS)]
    assert counted == len(everything)
    assert rows == job.fold(everything)  # every published event counted exactly once


# ---------------------------------------------------------------------------------- operators, no Spark
def test_ingestion_group_commits_the_cursor_after_apply_and_ends_with_it() -> None:
    from tests.airflow.test_views_operators import _group_dag

    dag, group, after = _group_dag(source_topic="{{ params.events }}", source_subscription="ingest")
    assert group.commit.task_id == "prices.commit_offsets"
    assert group.commit.upstream_task_ids == {"prices.apply_view"}
    assert after.upstream_task_ids == {"prices.commit_offsets"}  # downstream waits for the cursor too
    assert (group.commit.source_topic, group.commit.subscription) == ("{{ params.events }}", "ingest")
    args = group.spark.application_args
    assert args[6:8] == ["--source-topic", "{{ params.events }}"]
    _, plain, after = _group_dag(source_topic="events")  # the job gets the topic; no cursor to move
    assert plain.commit is None and after.upstream_task_ids == {"prices.apply_view"}
    with pytest.raises(TypeError, match="source_subscription needs source_topic"):
        _group_dag(source_subscription="ingest")


def test_commit_operator_moves_the_cursor_to_the_tables_record(env_connection: Any, tmp_path: Path) -> None:
    from unittest import mock

    from airflow_provider_pulsarstate.engine.recipes.table import source_ranges
    from airflow_provider_pulsarstate.operators.offsets import CommitSourceOffsetsOperator

    conn_id = env_connection("ps_ingest", extra={"service_url": str(tmp_path / "state.db")})
    operator = CommitSourceOffsetsOperator(
        task_id="commit", table_topic="t", source_topic="events", subscription="ingest", pulsarstate_conn_id=conn_id
    )
    with PulsarStateHook(conn_id) as hook:
        topic = hook.create_topic("events", partitions=2)
        publisher = hook.get_publisher(topic)
        for i in range(20):
            publisher.send(b"x", key=f"k{i}")
        publisher.flush(timeout=10.0)
        end = hook.get_pull_consumer(topic).end_offsets()
        # nothing recorded yet: nothing committed
        assert operator.execute({"ti": mock.MagicMock()})["committed"] == {}
        assert hook.get_pull_consumer(topic, "ingest").committed(partition=0) is None

        table = _table(hook, "t")
        view = table.create_view()
        table.seal(view.view_id, stagers={}, source_offsets=source_ranges(topic, {0: 0, 1: 0}, end))
        table.apply(view.view_id)
        hook.get_pull_consumer(topic, "ingest").commit(end[1], partition=1)
        out = operator.execute({"ti": mock.MagicMock()})
        assert out == {
            "topic": topic,
            "subscription": "ingest",
            "committed": {str(p): o for p, o in end.items()},
            "previous": {"0": None, "1": end[1]},
        }
        consumer = hook.get_pull_consumer(topic, "ingest")
        assert {p: consumer.committed(partition=p) for p in (0, 1)} == end
        assert operator.execute({"ti": mock.MagicMock()})["committed"] == out["committed"]  # idempotent
