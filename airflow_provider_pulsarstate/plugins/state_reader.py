"""Read-only summaries of a connection's shared state, as plain JSON, for the "Pulsar State" page.

Every function takes a :class:`~airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook`
and only reads: no function here appends to a log, takes a writer, seals, applies, drops, commits
or creates a topic (a topic that does not exist is reported as :class:`TopicMissingError` before
anything opens a reader on it, since opening one on Pulsar would create it). Topic names are
confined to the connection's namespace by the hook (``topic_name``), exactly as for writers.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError, PulsarStateError
from airflow_provider_pulsarstate.hooks.pulsarstate import DEFAULT_LEASE_TOPIC, PulsarStateHook

MAX_PAGE_ROWS = 500
"""Largest page of rows one request may ask for."""

MAX_TOPICS = 1000
"""Most topic names one listing returns."""

PLAN_SAMPLE = 10
"""Sample keys shown per kind (set / delete) in a view's plan."""


class TopicMissingError(PulsarStateError, LookupError):
    """The topic does not exist in the connection's namespace (nothing was created)."""


def list_topics(hook: PulsarStateHook, *, prefix: str = "") -> dict[str, Any]:
    """The topics of the connection's namespace (at most :data:`MAX_TOPICS`), with the namespace."""
    config = hook.get_config()
    names = hook.list_topics(prefix=prefix)
    return {
        "namespace": f"{config.tenant}/{config.namespace}",
        "topics": names[:MAX_TOPICS],
        "truncated": len(names) > MAX_TOPICS,
    }


def existing_topic(hook: PulsarStateHook, topic: str) -> str:
    """The full name of ``topic`` (confined to the connection's namespace), which must exist.

    :raises ConfigurationError: a malformed name or one outside the namespace.
    :raises TopicMissingError: no such topic.
    """
    full = hook.topic_name(topic)
    short = full.rsplit("/", 1)[-1]
    listed = hook.list_topics(prefix=short)
    if full not in listed and not any(t.startswith(full + "-partition-") for t in listed):
        raise TopicMissingError(f"topic {full!r} does not exist")
    return full


def table_summary(hook: PulsarStateHook, topic: str) -> dict[str, Any]:
    """Rows, log length, last commit (offset, time), checkpoint (offset, age, size), writer."""
    full = existing_topic(hook, topic)
    with hook.shared_table(full) as table:
        rows = table.size(latest=True)
        manager = table.manager
        last_offset = manager.applied_offset
        views = table.views(latest=False)
        checkpoint = manager.checkpoints.latest()
    now = time.time()
    last_time = hook.read_last_entry_time(full)
    writers = [
        {"partition": w.partition, "held": w.has_leader, "holder": w.writer_name, "epoch": w.epoch}
        for w in hook.get_leadership(full)
    ]
    return {
        "topic": full,
        "rows": rows,
        "log_length": last_offset + 1,
        "last_commit_offset": last_offset,
        "last_commit_time": last_time,
        "checkpoint": None
        if checkpoint is None
        else {
            "offset": checkpoint.offset,
            "created": checkpoint.created,
            "age_seconds": round(max(0.0, now - checkpoint.created), 3),
            "size": checkpoint.size,
        },
        "writer": {
            "held": any(w["held"] for w in writers),
            "holders": sorted({w["holder"] for w in writers if w["held"] and w["holder"]}),
            "partitions": writers,
        },
        "open_views": sum(1 for v in views if v.status == "open"),
    }


def table_rows(hook: PulsarStateHook, topic: str, *, prefix: str, cursor: str | None, limit: int) -> dict[str, Any]:
    """One page of rows by key prefix (``cursor``: the ``next_cursor`` of the previous page)."""
    if not 1 <= limit <= MAX_PAGE_ROWS:
        raise ConfigurationError(f"limit must be between 1 and {MAX_PAGE_ROWS}, got {limit}")
    full = existing_topic(hook, topic)
    with hook.shared_table(full) as table:
        rows, next_cursor = table.rows_page(prefix=prefix, after=cursor, limit=limit, latest=True)
    return {
        "topic": full,
        "prefix": prefix,
        "rows": [{"key": key, "value": value} for key, value in rows],
        "next_cursor": next_cursor,
    }


def table_views(hook: PulsarStateHook, topic: str, *, plans: bool = True) -> dict[str, Any]:
    """The table's views (newest last): state, per-stager counts, the plan of an open sealed view
    (counted, nothing published), the published counts and commit offset of an applied one."""
    full = existing_topic(hook, topic)
    now = time.time()
    out: list[dict[str, Any]] = []
    with hook.shared_table(full) as table:
        infos = table.views(latest=True)
        for info in infos:
            state = info.status
            if state == "open" and info.expires_at and info.expires_at < now:
                state = "expired"
            item: dict[str, Any] = {
                "view_id": info.view_id,
                "state": state,
                "sealed": info.sealed is not None,
                "stagers": dict(info.sealed or {}),
                "staged_rows": sum((info.sealed or {}).values()),
                "baseline": info.baseline,
                "scope": info.describe_scope(),
                "expires_at": info.expires_at,
                "commit_offset": info.commit_offset,
                "result": None,
                "plan": None,
            }
            if info.status != "open" and info.result:
                item["result"] = {k: info.result.get(k) for k in ("set", "delete", "unchanged", "commit_offset")}
            if plans and info.status == "open" and info.sealed is not None:
                try:
                    plan = table.plan(info.view_id, sample=PLAN_SAMPLE)
                except PulsarStateError as exc:
                    item["plan_error"] = str(exc)
                else:
                    item["plan"] = {
                        "set": plan.set,
                        "delete": plan.delete,
                        "unchanged": plan.unchanged,
                        "sample_set": plan.sample_set,
                        "sample_delete": plan.sample_delete,
                        "conflicts": plan.conflicts,
                        "source_conflicts": plan.source_conflicts,
                    }
            out.append(item)
    return {"topic": full, "views": out}


def leases(hook: PulsarStateHook, topic: str | None) -> dict[str, Any]:
    """Every lease of the lease log: holder, token, ttl, time left, transitions."""
    full = hook.topic_name(topic or DEFAULT_LEASE_TOPIC)
    try:
        existing_topic(hook, full)
    except TopicMissingError:
        return {"topic": full, "leases": []}
    with hook.shared_leases(full) as log:
        names = log.names()
        infos = [log.describe(name, latest=False) for name in names]
    out = []
    for info in infos:
        if info is None:
            continue
        item = info.as_dict()
        item["time_left"] = round(max(0.0, info.ttl - info.observed_age), 3) if info.held else None
        out.append(item)
    return {"topic": full, "leases": out}


def subscription(hook: PulsarStateHook, topic: str, subscription: str) -> dict[str, Any]:
    """Committed and end offset and lag of ``subscription`` on ``topic``, per partition."""
    full = existing_topic(hook, topic)
    consumer = hook.get_pull_consumer(full, subscription)
    try:
        ends = consumer.end_offsets()
        partitions = []
        lags = consumer.lag()
        for partition in sorted(ends):
            partitions.append(
                {
                    "partition": partition,
                    "committed": consumer.committed(partition=partition),
                    "end": ends[partition],
                    "lag": lags.get(partition, 0),
                }
            )
    finally:
        consumer.close()
    return {
        "topic": full,
        "subscription": subscription,
        "partitions": partitions,
        "total_lag": sum(p["lag"] for p in partitions),
        "sampled_at": time.time(),
    }


MAX_TRANSITIONS = 500
"""Most lease transitions one request may ask for."""


def lease_transitions(hook: PulsarStateHook, topic: str | None, *, name: str | None, limit: int) -> dict[str, Any]:
    """The recent holder changes of the lease log (of lease ``name``, or all), newest first: who
    acquired, released, lost by expiry or was superseded, with token and time (what the API
    server's replica of the log applied since it loaded, up to the engine's bound)."""
    if not 1 <= limit <= MAX_TRANSITIONS:
        raise ConfigurationError(f"limit must be between 1 and {MAX_TRANSITIONS}, got {limit}")
    full = hook.topic_name(topic or DEFAULT_LEASE_TOPIC)
    try:
        existing_topic(hook, full)
    except TopicMissingError:
        return {"topic": full, "transitions": []}
    with hook.shared_leases(full) as log:
        found = log.transitions(name, limit=limit)
    return {"topic": full, "transitions": [t.as_dict() for t in found]}


def leadership(hook: PulsarStateHook, topic: str) -> dict[str, Any]:
    """The exclusive producer of each partition of ``topic`` (any topic: a table, a watched source):
    held or not, its name and its epoch (the broker's fencing counter)."""
    full = existing_topic(hook, topic)
    partitions = [
        {"partition": w.partition, "held": w.has_leader, "holder": w.writer_name, "epoch": w.epoch}
        for w in hook.get_leadership(full)
    ]
    return {"topic": full, "partitions": partitions, "held": any(p["held"] for p in partitions)}
