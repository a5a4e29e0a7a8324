"""XComStore: Airflow XCom values in PulsarMaps, one per DAG run, readable without Airflow.

Each DAG run's XComs live in a map of their own, on the topic :func:`run_topic` derives from the
base XCom topic, the key namespace, the dag id and the run id (a digest, so any id gives a valid
name of fixed length). One entry per XCom, under the key
``<namespace>/xcom/<dag_id>/<run_id>/<task_id>/<map_index>/<key>`` (every segment percent-quoted,
so a ``/`` inside a run id or key cannot forge another entry). The value is an :class:`XComRecord`:
the JSON text Airflow's serde made of the value (``airflow.sdk.serde.serialize``), when it was
written, its size, its type name and the task try that wrote it. The XCom backend
(``xcom/backend.py`` and its parts) writes and reads entries through the hook; this module imports nothing from
Airflow, so any Python process can read a run's XComs::

    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComStore, run_topic

    backend = open_backend(ConnectionConfig(url="pulsar://localhost:6650"))  # or the embedded file:
    # ConnectionConfig(url="/path/to/airflow-home/pulsarstate/state.db")
    topic = run_topic("persistent://public/default/airflow-xcom", "prod", "my_dag", run_id)
    with XComStore(backend, topic, namespace="prod") as store:      # [pulsarstate] key_namespace
        for entry in store.list_run("my_dag", run_id):
            print(entry.task_id, entry.map_index, entry.key, entry.record.type_name, entry.record.json_value())
    backend.close()

``json_value()`` is the serde form as plain JSON (tuples, sets, datetimes and dataclasses appear as
``{"__classname__": ..., "__version__": ..., "__data__": ...}``); a process with the task SDK
installed gets the typed value with ``airflow.sdk.serde.deserialize(record.json_value())``.

Clean-up deletes a run's map whole: ``backend.list_topics(run_topic_prefix(base, namespace))``
lists the run maps of a namespace, and :func:`drop_run_map` deletes one only while it still holds
exactly what was listed (compare-and-delete under the map's writer). Earlier versions kept every run
in one map on the base topic; :meth:`XComStore.find_stale_runs` and :meth:`XComStore.delete_runs`
still serve such a map.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import SerializationError, ValueTooLargeError, XComReferenceError
from airflow_provider_pulsarstate.engine.recipes.base import Recipe
from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap
from airflow_provider_pulsarstate.engine.recipes.scope_topics import (
    DIGEST_CHARS,
    RUN_KIND,
    drop_map_if_unchanged,
    is_scope_topic,
    scope_topic,
    scope_topic_prefix,
)

XCOM_SEGMENT = "xcom"
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
_HEADER_SLACK = 1024  # the record's header line beside the value text
DEFAULT_WRITER_IDLE_TIMEOUT = 0.5
"""Seconds an instance keeps the map's writer after its last write: every task process writes its
own XComs, so a writer held longer makes the next task's first push wait."""


@dataclass(frozen=True, slots=True)
class XComRecord:
    """One stored XCom value.

    :ivar value_json: the JSON text of ``airflow.sdk.serde.serialize(value)``.
    :ivar written_at: Unix time (seconds) when it was written.
    :ivar size: bytes of ``value_json`` (UTF-8).
    :ivar type_name: the value's Python type (``dict``, ``datetime``, ``mymodule.Point``).
    :ivar try_number: the task try that wrote it (None: unknown).
    """

    value_json: str
    written_at: float
    size: int
    type_name: str
    try_number: int | None = None

    def json_value(self) -> Any:
        """The serde form as plain JSON objects (no Airflow needed; nothing is imported or run)."""
        return json.loads(self.value_json)


class XComRecordSerde:
    """A record as bytes: one JSON header line (time, size, type, try), then the value's JSON text
    unchanged (no second escaping, so the stored size is the value's size plus ~80 bytes)."""

    def serialize(self, record: XComRecord) -> bytes:
        header = {"t": record.written_at, "n": record.size, "type": record.type_name, "try": record.try_number}
        return json.dumps(header, separators=(",", ":")).encode() + b"\n" + record.value_json.encode()

    def deserialize(self, data: bytes) -> XComRecord:
        head, sep, body = bytes(data).partition(b"\n")
        if not sep:
            raise ValueError("not an XCom record (no header line)")
        header = json.loads(head)
        if not isinstance(header, dict):
            raise ValueError("not an XCom record (header is not an object)")
        written_at, size, type_name, try_number = (
            header.get("t"),
            header.get("n"),
            header.get("type"),
            header.get("try"),
        )
        if not isinstance(written_at, (int, float)) or isinstance(written_at, bool):
            raise ValueError(f"XCom record header: bad written-at time {written_at!r}")
        if not isinstance(size, int) or isinstance(size, bool) or not isinstance(type_name, str):
            raise ValueError(f"XCom record header: bad size {size!r} or type {type_name!r}")
        if try_number is not None and (not isinstance(try_number, int) or isinstance(try_number, bool)):
            raise ValueError(f"XCom record header: bad try number {try_number!r}")
        return XComRecord(body.decode(), float(written_at), size, type_name, try_number)


RECORD_SERDE = XComRecordSerde()


@dataclass(frozen=True, slots=True)
class XComEntry:
    """An entry as listed: where it belongs and its record."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    key: str
    record: XComRecord
    map_key: str


@dataclass(frozen=True, slots=True)
class XComRunInfo:
    """A DAG run's entries in the store: how many, their bytes, and the newest written-at time."""

    dag_id: str
    run_id: str
    entries: int
    bytes: int
    newest_written_at: float


@dataclass(frozen=True, slots=True)
class StaleRun:
    """A run :meth:`XComStore.find_stale_runs` selected, and why (``missing`` or ``expired``)."""

    run: XComRunInfo
    reason: str


RUN_DIGEST_CHARS = DIGEST_CHARS


def run_topic_prefix(base_topic: str, namespace: str) -> str:
    """The prefix of every run topic of one key namespace (``<base>-<namespace slug>-r``)."""
    return scope_topic_prefix(base_topic, namespace, RUN_KIND)


def run_topic(base_topic: str, namespace: str, dag_id: str, run_id: str) -> str:
    """The topic of one DAG run's XCom map: :func:`run_topic_prefix` and a digest of (namespace,
    dag id, run id), so any id spelling gives a valid, fixed-length topic name."""
    return scope_topic(base_topic, namespace, RUN_KIND, dag_id, run_id)


def is_run_topic(topic: str, prefix: str) -> bool:
    """Whether ``topic`` is a run map's log under ``prefix`` (not one of its checkpoint topics)."""
    return is_scope_topic(topic, prefix)


class _KeyLayout:
    """The key layout of one namespace (no map needed)."""

    def __init__(self, namespace: str) -> None:
        if not isinstance(namespace, str) or not namespace or "/" in namespace:
            raise XComReferenceError(f"XCom key namespace must be non-empty and without '/': {namespace!r}")
        self.namespace = namespace
        self.prefix = f"{quote(namespace, safe='')}/{XCOM_SEGMENT}/"

    # ------------------------------------------------------------------ keys
    def map_key(self, dag_id: str, run_id: str, task_id: str, map_index: int, key: str) -> str:
        """The map key of one XCom (segments percent-quoted)."""
        for name, part in (("dag_id", dag_id), ("run_id", run_id), ("task_id", task_id), ("key", key)):
            if not isinstance(part, str) or not part:
                raise XComReferenceError(f"XCom {name} must be a non-empty string, got {part!r}")
        if not isinstance(map_index, int) or isinstance(map_index, bool):
            raise XComReferenceError(f"XCom map_index must be an int, got {map_index!r}")
        return self.prefix + "/".join(quote(p, safe="") for p in (dag_id, run_id, task_id, str(map_index), key))

    def run_prefix(self, dag_id: str, run_id: str) -> str:
        """The prefix every key of one DAG run starts with."""
        return f"{self.prefix}{quote(dag_id, safe='')}/{quote(run_id, safe='')}/"

    def parse_key(self, map_key: str) -> tuple[str, str, str, int, str]:
        """``(dag_id, run_id, task_id, map_index, key)`` of a map key of this store.

        :raises XComReferenceError: not a key of this namespace, or malformed (names the key).
        """
        if not isinstance(map_key, str) or not map_key.startswith(self.prefix):
            raise XComReferenceError(
                f"{map_key!r} is not an XCom key of namespace {self.namespace!r} (keys start with {self.prefix!r})"
            )
        parts = map_key[len(self.prefix) :].split("/")
        if len(parts) != 5 or not all(parts):
            raise XComReferenceError(f"{map_key!r} is not an XCom key: expected <dag>/<run>/<task>/<map_index>/<key>")
        dag_id, run_id, task_id, index, key = (unquote(p) for p in parts)
        try:
            map_index = int(index)
        except ValueError:
            raise XComReferenceError(f"{map_key!r}: map index {index!r} is not an integer") from None
        if self.map_key(dag_id, run_id, task_id, map_index, key) != map_key:  # one spelling per entry
            raise XComReferenceError(f"{map_key!r} is not in canonical form")
        return dag_id, run_id, task_id, map_index, key


class XComStore(Recipe, _KeyLayout):
    """XCom entries of one key namespace in a PulsarMap (see the module docstring for a usage example).

    Writes are atomic per call (a multi-run delete is one record); reads answer from the local
    replica unless ``latest=True`` (then at least the tail at call time: what another process
    wrote before the call). Keys outside ``<namespace>/xcom/`` are never read, listed or deleted,
    so deployments sharing a topic stay apart.

    :param backend: where the log lives.
    :param topic: the fully qualified topic.
    :param namespace: the key namespace (``[pulsarstate] key_namespace``); no ``/``.
    :param max_value_bytes: the largest value text :meth:`put` accepts (ValueTooLargeError above).
    :param map_options: PulsarMap / manager options (``writer_idle_timeout`` defaults to 0.5 s).
    :raises ConfigurationError: a bad namespace.
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        namespace: str = "airflow",
        max_value_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        **map_options: Any,
    ) -> None:
        _KeyLayout.__init__(self, namespace)
        self.topic = topic
        self.max_value_bytes = max_value_bytes
        map_options.setdefault("writer_idle_timeout", DEFAULT_WRITER_IDLE_TIMEOUT)
        self.map: PulsarMap[str, XComRecord] = PulsarMap(
            backend, topic, value_serde=RECORD_SERDE, max_value_bytes=max_value_bytes + _HEADER_SLACK, **map_options
        )
        self.manager = self.map.manager

    @staticmethod
    def parse_key_of(namespace: str, map_key: str) -> tuple[str, str, str, int, str]:
        """:meth:`parse_key` for namespace ``namespace``, without a store.

        :raises XComReferenceError: not a key of this namespace, or malformed (names the key).
        """
        return _KeyLayout(namespace).parse_key(map_key)

    # ------------------------------------------------------------------ one entry
    def put(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        map_index: int,
        key: str,
        value_json: str,
        *,
        type_name: str,
        try_number: int | None = None,
        timeout: float | None = None,
    ) -> tuple[str, XComRecord]:
        """Store one value (the serde JSON text); returns its map key and record.

        :raises ValueTooLargeError: the text is over ``max_value_bytes`` (nothing appended).
        :raises SerializationError: ``value_json`` is not a string.
        """
        map_key = self.map_key(dag_id, run_id, task_id, map_index, key)
        if not isinstance(value_json, str):
            raise SerializationError(
                f"{self.topic}: XCom {map_key!r}: value_json must be str, got {type(value_json).__name__}"
            )
        record = XComRecord(value_json, time.time(), len(value_json.encode()), type_name, try_number)
        if record.size > self.max_value_bytes:
            raise ValueTooLargeError(
                f"{self.topic}: XCom {map_key!r} is {record.size:,} bytes, over the {self.max_value_bytes:,}-byte limit"
            )
        self.map.put(map_key, record, timeout=timeout)
        return map_key, record

    def get(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        map_index: int,
        key: str,
        *,
        latest: bool = False,
        timeout: float | None = None,
    ) -> XComRecord | None:
        """The record of one XCom, or None."""
        return self.map.get(self.map_key(dag_id, run_id, task_id, map_index, key), latest=latest, timeout=timeout)

    def get_by_key(self, map_key: str, *, latest: bool = False, timeout: float | None = None) -> XComRecord | None:
        """The record under a map key (checked to belong to this namespace first), or None.

        :raises XComReferenceError: not a key of this store.
        """
        self.parse_key(map_key)
        return self.map.get(map_key, latest=latest, timeout=timeout)

    def delete(
        self, dag_id: str, run_id: str, task_id: str, map_index: int, key: str, *, timeout: float | None = None
    ) -> bool:
        """Remove one XCom; True when it was there."""
        return self.delete_key(self.map_key(dag_id, run_id, task_id, map_index, key), timeout=timeout)

    def delete_key(self, map_key: str, *, timeout: float | None = None) -> bool:
        """Remove the entry under a map key of this store; True when it was there."""
        self.parse_key(map_key)
        return self.map.pop(map_key, timeout=timeout) is not None

    def delete_older_tries(
        self, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int, *, timeout: float | None = None
    ) -> int:
        """Remove the task instance's entries written by a try before ``try_number`` (one atomic
        write; entries of unknown try are kept). Returns how many."""
        prefix = self.run_prefix(dag_id, run_id) + f"{quote(task_id, safe='')}/{map_index}/"
        stale = self.map.manager.read(
            lambda m: [k for k, data in m.items() if k.startswith(prefix) and _try_of(data, try_number)],
            latest=True,
            timeout=timeout,
        )
        return self._delete_keys(set(stale), timeout=timeout)

    # ------------------------------------------------------------------ listing
    def list_run(
        self, dag_id: str, run_id: str, *, latest: bool = True, timeout: float | None = None
    ) -> list[XComEntry]:
        """Every entry of one DAG run, ordered by task, map index and key."""
        prefix = self.run_prefix(dag_id, run_id)
        entries: list[XComEntry] = []

        def collect(map_key: str, record: XComRecord) -> None:
            _, _, task_id, map_index, key = self.parse_key(map_key)
            entries.append(XComEntry(dag_id, run_id, task_id, map_index, key, record, map_key))

        self.map.scan(lambda k: k.startswith(prefix), collect, latest=latest, timeout=timeout)
        return sorted(entries, key=lambda e: (e.task_id, e.map_index, e.key))

    def list_runs(
        self, *, dag_id: str | None = None, latest: bool = True, timeout: float | None = None
    ) -> list[XComRunInfo]:
        """The runs with entries (of ``dag_id``, or all), with count, bytes and newest written-at,
        ordered by dag id and newest written-at. Reads only the record headers."""
        prefix = self.prefix if dag_id is None else f"{self.prefix}{quote(dag_id, safe='')}/"
        own = self.prefix

        def summarize(m: dict[str, bytes]) -> dict[tuple[str, str], list[float]]:
            runs: dict[tuple[str, str], list[float]] = {}
            for k, data in m.items():
                if not k.startswith(prefix):
                    continue
                parts = k[len(own) :].split("/")
                if len(parts) != 5:
                    continue
                written_at, size = _header_time_size(data)
                acc = runs.setdefault((unquote(parts[0]), unquote(parts[1])), [0, 0, 0.0])
                acc[0] += 1
                acc[1] += size
                acc[2] = max(acc[2], written_at)
            return runs

        runs = self.map.manager.read(summarize, latest=latest, timeout=timeout)
        infos = [XComRunInfo(d, r, int(a[0]), int(a[1]), a[2]) for (d, r), a in runs.items()]
        return sorted(infos, key=lambda i: (i.dag_id, i.newest_written_at, i.run_id))

    # ------------------------------------------------------------------ clean-up
    def find_stale_runs(
        self,
        *,
        existing_runs: Callable[[str, list[str]], Iterable[str]] | None = None,
        older_than: float | None = None,
        dag_id: str | None = None,
        latest: bool = True,
        runs: list[XComRunInfo] | None = None,
    ) -> list[StaleRun]:
        """The runs whose entries a clean-up should delete.

        :param existing_runs: ``(dag_id, run_ids) -> the run ids among them that still exist``
            (e.g. in Airflow's metadata DB); runs it does not return are ``missing``.
        :param older_than: Unix time: runs whose newest entry was written before it are ``expired``.
        :param dag_id: only this DAG's runs.
        :param runs: what :meth:`list_runs` returned for ``dag_id`` (a caller that listed them
            already need not scan the map again).
        """
        if runs is None:
            runs = self.list_runs(dag_id=dag_id, latest=latest)
        stale: dict[tuple[str, str], StaleRun] = {}
        if existing_runs is not None:
            by_dag: dict[str, list[XComRunInfo]] = {}
            for info in runs:
                by_dag.setdefault(info.dag_id, []).append(info)
            for dag, infos in by_dag.items():
                present = set(existing_runs(dag, [i.run_id for i in infos]))
                for info in infos:
                    if info.run_id not in present:
                        stale[(dag, info.run_id)] = StaleRun(info, "missing")
        if older_than is not None:
            for info in runs:
                if info.newest_written_at < older_than and (info.dag_id, info.run_id) not in stale:
                    stale[(info.dag_id, info.run_id)] = StaleRun(info, "expired")
        return sorted(stale.values(), key=lambda s: (s.run.dag_id, s.run.newest_written_at, s.run.run_id))

    def delete_runs(
        self, runs: Iterable[tuple[str, str] | XComRunInfo | StaleRun], *, timeout: float | None = None
    ) -> int:
        """Delete every entry of the given runs (``(dag_id, run_id)`` pairs, run infos or stale
        runs) in one atomic write; returns how many entries were deleted."""
        prefixes = set()
        for run in runs:
            if isinstance(run, StaleRun):
                run = run.run
            if isinstance(run, XComRunInfo):
                run = (run.dag_id, run.run_id)
            prefixes.add(self.run_prefix(*run))
        if not prefixes:
            return 0
        return self.map.update_multiple(lambda k: _run_prefix_of(k, self.prefix) in prefixes, _drop, timeout=timeout)

    def entries(self, *, latest: bool = True, timeout: float | None = None) -> dict[str, XComRecord]:
        """Every entry of the map, this namespace's or not (``{map key: record}``): what
        :func:`drop_run_map` compares against."""
        return self.map.to_dict(latest=latest, timeout=timeout)

    def _delete_keys(self, keys: set[str], *, timeout: float | None) -> int:
        if not keys:
            return 0
        return self.map.update_multiple(lambda k: k in keys, _drop, timeout=timeout)


def _drop(key: str, value: Any) -> None:
    return None


def _run_prefix_of(map_key: str, prefix: str) -> str | None:
    if not map_key.startswith(prefix):
        return None
    rest = map_key[len(prefix) :].split("/", 2)
    return f"{prefix}{rest[0]}/{rest[1]}/" if len(rest) == 3 else None


def _header(data: bytes) -> dict[str, Any]:
    end = data.find(b"\n")
    if end < 0:
        return {}
    try:
        header = json.loads(data[:end])
    except ValueError:
        return {}
    return header if isinstance(header, dict) else {}


def _header_time_size(data: bytes) -> tuple[float, int]:
    header = _header(data)
    t, n = header.get("t"), header.get("n")
    return (float(t) if isinstance(t, (int, float)) else 0.0, n if isinstance(n, int) else 0)


def _try_of(data: bytes, current: int) -> bool:
    """True when the record was written by a try before ``current``."""
    t = _header(data).get("try")
    return isinstance(t, int) and not isinstance(t, bool) and t < current


def drop_run_map(
    backend: Backend,
    topic: str,
    *,
    namespace: str,
    expected: dict[str, XComRecord],
    timeout: float,
) -> bool:
    """Delete a run map's topics (the log and its checkpoints) only if it still holds exactly
    ``expected`` (compare-and-delete): the check and the deletion happen while this call holds the
    map's exclusive writer, so nothing can land in between. Returns whether it was deleted.

    :raises OperationTimeoutError: the writer could not be taken within ``timeout``.
    """

    def read() -> dict[str, XComRecord]:
        with XComStore(backend, topic, namespace=namespace, writer_idle_timeout=None) as fresh:
            return fresh.entries(latest=True, timeout=timeout)

    return drop_map_if_unchanged(backend, topic, read=read, expected=expected, timeout=timeout)
