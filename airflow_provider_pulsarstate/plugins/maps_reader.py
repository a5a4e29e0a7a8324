"""Read-only summaries of the XCom backend's run maps and the state store's task and asset maps.

Every map is reached from the ids it belongs to, never from a topic name a caller gives: the XCom
map of a run is ``run_topic(<xcom_topic>, <key_namespace>, dag_id, run_id)``, its task-state map
the state store's map of that run, an asset's state map the one of its name (digests, so no id
spelling reaches another topic), and only the keys under that run's or asset's own key prefix are
counted or listed (a map holding keys of another scope shows none of them). A map whose topic does
not exist is reported as absent (counts) or :class:`~.state_reader.TopicMissingError` (entries)
before anything opens a reader on it, so asking creates nothing. Nothing here writes.

Counts and sizes (bytes as stored, record header included) and the sorted keys of a scope are
cached per map and log offset: a request after the map is loaded costs a catch-up with the log's
tail and, when nothing changed, a dictionary look-up (counts) or a binary search (a page). Values come only from :func:`entries` with ``values=True``; the API asks the
auth manager before calling it.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import quote, unquote

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.pulsarstate import (
    AssetStateScope,
    PulsarStateHook,
    TaskStateScope,
    message_topic,
    run_topic,
)
from airflow_provider_pulsarstate.plugins.state_reader import MAX_PAGE_ROWS, TopicMissingError
from airflow_provider_pulsarstate.provider_settings import ProviderSettings
from airflow_provider_pulsarstate.provider_settings import settings as provider_settings

STORES = ("xcom", "task_state")
"""The maps of a DAG run: the XCom backend's run map and the state store's task-state map."""

_DIGEST_CHARS = 32  # of every scope map's topic name: <base>-<namespace>-<kind><digest>
_CACHE_SIZE = 256
_cache: OrderedDict[tuple[str, str], tuple[int, dict[str, Any]]] = OrderedDict()
_KEY_CACHE_SIZE = 16  # sorted key lists (one per map shown recently): the bigger memory
_key_cache: OrderedDict[tuple[str, str], tuple[int, list[str]]] = OrderedDict()
_cache_lock = threading.Lock()


def _short(topic: str) -> str:
    return topic.rsplit("/", 1)[-1]


def _exists(hook: PulsarStateHook, topic: str) -> bool:
    listed = hook.list_topics(prefix=_short(topic))
    return topic in listed or any(t.startswith(topic + "-partition-") for t in listed)


def _q(segment: str) -> str:
    return quote(segment, safe="")


class _Target:
    """One map of one scope: its topic, the key prefix of the scope inside it, how to borrow it and
    how many key segments after the prefix name the task (0: an asset's map, no task)."""

    def __init__(self, topic: str, prefix: str, borrow: Callable[[], AbstractContextManager[Any]], *, task: bool):
        self.topic = topic
        self.prefix = prefix
        self.borrow = borrow
        self.task = task


def _run_target(hook: PulsarStateHook, settings: ProviderSettings, store: str, dag_id: str, run_id: str) -> _Target:
    namespace = settings.key_namespace
    if store == "xcom":
        topic = run_topic(hook.topic_name(settings.xcom_topic), namespace, dag_id, run_id)
        prefix = f"{_q(namespace)}/xcom/{_q(dag_id)}/{_q(run_id)}/"

        @contextmanager
        def borrow_xcom() -> Iterator[Any]:
            with hook.xcom_run_store(
                settings.xcom_topic,
                namespace=namespace,
                dag_id=dag_id,
                run_id=run_id,
                max_value_bytes=settings.xcom_max_value_bytes,
            ) as xcom_store:
                yield xcom_store.map

        return _Target(topic, prefix, borrow_xcom, task=True)
    if store == "task_state":
        state = hook.get_state_store()
        topic = state.topic_of(TaskStateScope(dag_id, run_id, "-"))
        prefix = f"{state.namespace}/task/{_q(dag_id)}/{_q(run_id)}/"
        return _Target(topic, prefix, lambda: state.maps.borrow(topic), task=True)
    raise ConfigurationError(f"store must be one of {', '.join(STORES)}, got {store!r}")


def _asset_target(hook: PulsarStateHook, name: str) -> _Target:
    state = hook.get_state_store()
    scope = AssetStateScope(name)
    topic = state.topic_of(scope)
    return _Target(topic, state.scope_prefix(scope), lambda: state.maps.borrow(topic), task=False)


def _summary(target: _Target) -> dict[str, Any]:
    """Entries and bytes of the target's scope (per task for a run's map), cached per log offset."""
    with target.borrow() as table:
        manager = table.manager
        offset = manager.read(lambda m: manager.applied_offset, latest=True)
        cache_key = (target.topic, target.prefix)
        with _cache_lock:
            hit = _cache.get(cache_key)
            if hit is not None and hit[0] == offset:
                _cache.move_to_end(cache_key)
                return hit[1]
        prefix, task = target.prefix, target.task

        def summarize(m: dict[str, bytes]) -> tuple[int, dict[str, Any]]:
            entries = size = 0
            tasks: dict[str, list[int]] = {}
            for k, data in m.items():
                if not k.startswith(prefix):
                    continue
                entries += 1
                size += len(data)
                if task:
                    acc = tasks.setdefault(k[len(prefix) :].split("/", 1)[0], [0, 0])
                    acc[0] += 1
                    acc[1] += len(data)
            by_task = {unquote(t): {"entries": a[0], "bytes": a[1]} for t, a in sorted(tasks.items())}
            return manager.applied_offset, {"entries": entries, "bytes": size, "tasks": by_task if task else None}

        offset, summary = manager.read(summarize)
    with _cache_lock:
        _cache[cache_key] = (offset, summary)
        _cache.move_to_end(cache_key)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return summary


def _described(hook: PulsarStateHook, target: _Target) -> dict[str, Any]:
    if not _exists(hook, target.topic):
        return {"topic": target.topic, "exists": False, "entries": 0, "bytes": 0, "tasks": {} if target.task else None}
    return {"topic": target.topic, "exists": True, **_summary(target)}


def run_summary(hook: PulsarStateHook, dag_id: str, run_id: str) -> dict[str, Any]:
    """A DAG run's XCom map and task-state map: entries and bytes, per task; whether the run has an
    XCom message topic (``xcom_layout = messages``: counted by the clean-up only, not here)."""
    settings = provider_settings()
    out: dict[str, Any] = {"dag_id": dag_id, "run_id": run_id, "key_namespace": settings.key_namespace}
    for store in STORES:
        out[store] = _described(hook, _run_target(hook, settings, store, dag_id, run_id))
    messages = message_topic(hook.topic_name(settings.xcom_topic), settings.key_namespace, dag_id, run_id)
    out["xcom_messages"] = {"topic": messages, "exists": _exists(hook, messages)}
    return out


def dag_runs(hook: PulsarStateHook, dag_id: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`run_summary` figures (entries, bytes) of each of ``runs`` (from the metadata DB)."""
    settings = provider_settings()
    listed: dict[str, set[str]] = {}
    out = []
    for run in runs:
        item = dict(run)
        for store in STORES:
            target = _run_target(hook, settings, store, dag_id, run["run_id"])
            # one listing per kind of map, not one per run (a map topic ends in a fixed-length digest)
            kind_prefix = _short(target.topic)[:-_DIGEST_CHARS]
            names = listed.get(kind_prefix)
            if names is None:
                names = listed[kind_prefix] = set(hook.list_topics(prefix=kind_prefix))
            if target.topic in names:
                summary = _summary(target)
                item[store] = {"entries": summary["entries"], "bytes": summary["bytes"]}
            else:
                item[store] = {"entries": 0, "bytes": 0}
        out.append(item)
    return {"dag_id": dag_id, "key_namespace": settings.key_namespace, "runs": out}


def asset_summary(hook: PulsarStateHook, name: str) -> dict[str, Any]:
    """An asset's state map: entries and bytes."""
    described = _described(hook, _asset_target(hook, name))
    described.pop("tasks", None)
    return {"name": name, **described}


def _sorted_keys(target: _Target, table: Any) -> list[str]:
    """The target's keys in order, kept per map and log offset (a page is then a binary search)."""
    manager = table.manager
    offset = manager.read(lambda m: manager.applied_offset, latest=True)
    cache_key = (target.topic, "keys:" + target.prefix)
    with _cache_lock:
        hit = _key_cache.get(cache_key)
        if hit is not None and hit[0] == offset:
            _key_cache.move_to_end(cache_key)
            return hit[1]
    prefix = target.prefix
    offset, ordered = manager.read(lambda m: (manager.applied_offset, sorted(k for k in m if k.startswith(prefix))))
    with _cache_lock:
        _key_cache[cache_key] = (offset, ordered)
        _key_cache.move_to_end(cache_key)
        while len(_key_cache) > _KEY_CACHE_SIZE:
            _key_cache.popitem(last=False)
    return ordered


def _page(
    hook: PulsarStateHook, target: _Target, *, cursor: str | None, limit: int, values: bool, row: Callable[..., Any]
) -> dict[str, Any]:
    if not 1 <= limit <= MAX_PAGE_ROWS:
        raise ConfigurationError(f"limit must be between 1 and {MAX_PAGE_ROWS}, got {limit}")
    if not _exists(hook, target.topic):
        raise TopicMissingError(f"no map at {target.topic!r}: nothing is stored for it")
    prefix = target.prefix
    after = prefix + cursor if cursor is not None else ""
    with target.borrow() as table:
        ordered = _sorted_keys(target, table)
        start = bisect.bisect_right(ordered, after) if after else 0
        keys = ordered[start : start + limit + 1]
        page = keys[:limit]
        rows = [row(k[len(prefix) :], table.get(k), values) for k in page]
    return {
        "topic": target.topic,
        "rows": [r for r in rows if r is not None],
        "next_cursor": page[-1][len(prefix) :] if len(keys) > limit else None,
        "values": values,
    }


def _xcom_row(rest: str, record: Any, values: bool) -> dict[str, Any] | None:
    if record is None:
        return None
    task_id, index, key = (unquote(p) for p in rest.split("/"))
    item = {
        "task_id": task_id,
        "map_index": int(index),
        "key": key,
        "bytes": record.size,
        "type": record.type_name,
        "written_at": record.written_at,
    }
    if values:
        item["value"] = record.json_value()
    return item


def _state_row(rest: str, raw: Any, values: bool, *, task: bool) -> dict[str, Any] | None:
    if raw is None:
        return None
    parts = [unquote(p) for p in rest.split("/")]
    text = raw.get("json") if isinstance(raw, dict) else None
    item: dict[str, Any] = {"key": parts[-1], "expires_at": raw.get("expires_at") if isinstance(raw, dict) else None}
    if task:
        item["task_id"], item["map_index"] = parts[0], int(parts[1])
    item["bytes"] = len(text.encode()) if isinstance(text, str) else None
    if values:
        item["value"] = text
    return item


def run_entries(
    hook: PulsarStateHook,
    dag_id: str,
    run_id: str,
    *,
    store: str,
    cursor: str | None,
    limit: int,
    values: bool,
) -> dict[str, Any]:
    """One page of a run's entries of ``store`` in key order (task, map index, key), after
    ``cursor`` (the ``next_cursor`` of the previous page); values (the serde JSON of an XCom, the
    JSON text of a state value) only with ``values``.

    :raises TopicMissingError: the run has no such map.
    """
    target = _run_target(hook, provider_settings(), store, dag_id, run_id)
    row = _xcom_row if store == "xcom" else (lambda rest, raw, v: _state_row(rest, raw, v, task=True))
    return {"dag_id": dag_id, "run_id": run_id, "store": store} | _page(
        hook, target, cursor=cursor, limit=limit, values=values, row=row
    )


def asset_entries(hook: PulsarStateHook, name: str, *, cursor: str | None, limit: int, values: bool) -> dict[str, Any]:
    """One page of an asset's state entries (as :func:`run_entries`).

    :raises TopicMissingError: the asset has no state map.
    """
    target = _asset_target(hook, name)
    row = lambda rest, raw, v: _state_row(rest, raw, v, task=False)  # noqa: E731
    return {"name": name} | _page(hook, target, cursor=cursor, limit=limit, values=values, row=row)
