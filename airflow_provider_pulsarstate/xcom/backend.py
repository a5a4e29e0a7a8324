"""PulsarXComBackend: XCom values in Pulsar (or the embedded log), a small reference in the metadata DB.

Configure it on every worker (and wherever tasks run)::

    [core]
    xcom_backend = airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend

    [pulsarstate]
    conn_id = pulsarstate_default      # the pulsarstate connection (embedded file when undefined)
    xcom_topic = airflow-xcom          # run topics: <xcom_topic>-<namespace>-m<digest of dag and run>
    xcom_layout = messages             # or: map (one PulsarMap per run: <xcom_topic>-<namespace>-r<digest>)
    key_namespace = ...                # default: derived from the metadata DB's address (unique per deployment)
    xcom_max_value_bytes = 1048576
    xcom_oversize = db                 # or: error
    xcom_preview_chars = 0             # > 0 puts a short preview of each value in the reference

Two layouts (``xcom_layout``); references of both (and of the earlier single map) stay readable:

* ``messages`` (the default): a push appends the value as one immutable message to its run's topic
  through a publisher shared by the process (no exclusive writer, no replay); the reference keeps
  the message's address and the push's writer id; a pull reads that one message. A purge drops the
  DB row only; the message goes when clean-up deletes the run's topic. What the DB keeps::

    {"__pulsarstate_xcom__": 3, "topic": "persistent://public/default/airflow-xcom-prod-m3f2...",
     "key": "prod/xcom/my_dag/manual__2026.../extract/-1/return_value",
     "address": "p:0:CJYZEAE6...", "writer": "9c1e...", "size": 57, "type": "dict",
     "written_at": "2026-11-23T20:01:02.123456+00:00"}

* ``map``: one PulsarMap per DAG run (version-2 references, ``"topic"`` a ``-r`` topic and no
  address): every push takes the run map's exclusive writer; a purge deletes the entry.

Guarantees:

* Bounded per-process cost: a task process opens only the run topics it touches (its own run's, and
  those of the runs it pulls from); a pull reads one message (messages) or replays one run's map
  (map), so memory and start-up do not grow with the rest of the deployment's XComs; long-lived
  processes keep at most a bounded number open
  (:mod:`~airflow_provider_pulsarstate.hooks.shared_objects`). Clean-up deletes a run's topic whole.
* Values round-trip with their types as with Airflow's default backend: the map holds the JSON text
  of ``airflow.sdk.serde.serialize(value)`` and reading applies ``airflow.sdk.serde.deserialize``
  (the same ``[core] allowed_deserialization_classes`` policy).
* A value over ``xcom_max_value_bytes`` stays in the DB, wrapped so that it can never be taken for
  a reference (``xcom_oversize = db``), or fails the task with :class:`XComValueTooLargeError`
  naming the limit and the size (``error``).
* An unreachable store (broker down, time-out) fails the task with
  :class:`XComStoreUnavailableError` naming topic and key: the value is never put in the DB instead.
* Isolation: a reference is bound to its row. It names its own dag, run, task, map index and key
  (in its key) and the run topic those give, and a message names its row and push again (checked
  on read against the reference); when it is read or purged through Airflow
  (``get_one``, ``get_all``, ``delete``) it must name the very row Airflow was asked for, or
  :class:`XComReferenceError` names the key and nothing is read or deleted. A task may push only
  its own XComs: a push for another task instance while a task context is active is refused.
  Nothing in a reference is imported or executed.
* Reads use ``latest=True``: a value pushed by another task process is seen.
* No value text in the metadata DB by default (``xcom_preview_chars = 0``).
* With ``[core] multi_team``, the backend refuses to start unless every team has its own
  ``key_namespace`` and topics (:mod:`~airflow_provider_pulsarstate.hooks.teams`).
* Retries: at the start of every try Airflow calls :meth:`purge` for each XCom the DB holds for the
  task instance (map: deletes the entry; messages: nothing to delete, the row goes). Map entries
  that never reached the DB (the process died between the map write and the DB write) are removed
  when the next try stores its first value; such a message is never referred to.
* References written by the earlier single-map layout (version 1) stay readable, from that map.

Airflow never calls ``purge`` when a run is deleted, cleared through the REST API, or removed by
``airflow db clean``: run ``airflow pulsarstate xcom-cleanup`` or ``XComCleanupOperator`` for those.
What the backends cannot isolate: every worker holds the connection's Pulsar role, so code running
in a task can open any topic the role may read; per-team roles (one deployment namespace each) are
the defence.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from airflow.sdk.bases.xcom import BaseXCom

from airflow_provider_pulsarstate.engine.errors import (
    XComEntryNotFoundError,
    XComError,
    XComReferenceError,
    XComStoreUnavailableError,
    XComValueTooLargeError,
)
from airflow_provider_pulsarstate.hooks.airflow_internals import caller_frames
from airflow_provider_pulsarstate.hooks.pulsarstate import (
    PulsarStateHook,
    XComIdentity,
    XComMessageLog,
    XComStore,
    message_topic,
    run_topic,
)
from airflow_provider_pulsarstate.hooks.teams import refuse_shared_team_settings
from airflow_provider_pulsarstate.provider_settings import (
    LEGACY_KEY_NAMESPACE,
    ProviderSettings,
)
from airflow_provider_pulsarstate.provider_settings import (
    settings as provider_settings,
)

log = logging.getLogger(__name__)

REFERENCE_MARKER = "__pulsarstate_xcom__"
REFERENCE_VERSION = 3
"""References to an immutable message of the run's topic (``xcom_layout = messages``)."""
MAP_REFERENCE_VERSION = 2
"""References to an entry of the run's map (``xcom_layout = map``)."""
LEGACY_REFERENCE_VERSION = 1
"""References of the earlier layout: one map for the whole deployment (still read, never written)."""
_VERSIONS = (REFERENCE_VERSION, MAP_REFERENCE_VERSION, LEGACY_REFERENCE_VERSION)
DB_VALUE_MARKER = "__pulsarstate_db_value__"
"""Wraps a value kept in the metadata DB, so that no stored value can look like a reference."""
_PREVIEW_MAX_SIZE = 64 * 1024  # bigger values get no preview (repr of a large value costs time)

_lock = threading.Lock()
_swept: set[tuple[Any, ...]] = set()  # task tries whose older tries' entries were removed here
_teams_checked: list[bool] = []


@dataclass(frozen=True)
class _Row:
    """The XCom row Airflow was asked for (None: any)."""

    dag_id: str | None
    run_id: str | None
    task_id: str | None
    map_index: int | None
    key: str | None

    def mismatch(self, dag_id: str, run_id: str, task_id: str, map_index: int, key: str) -> str | None:
        for name, want, got in (
            ("dag_id", self.dag_id, dag_id),
            ("run_id", self.run_id, run_id),
            ("task_id", self.task_id, task_id),
            ("map_index", self.map_index, map_index),
            ("key", self.key, key),
        ):
            if want is not None and want != got:
                return f"{name} {got!r} (the row is {name} {want!r})"
        return None


_asked: contextvars.ContextVar[_Row | None] = contextvars.ContextVar("pulsarstate_xcom_row", default=None)


@contextlib.contextmanager
def _asking(
    dag_id: str, run_id: str, task_id: str, map_index: int | None, key: str, *, include_prior_dates: bool
) -> Iterator[None]:
    """While Airflow reads or deletes rows: the row asked for (any run with ``include_prior_dates``,
    any map index when None), which every reference followed must name."""
    token = _asked.set(_Row(dag_id, None if include_prior_dates else run_id, task_id, map_index, key))
    try:
        yield
    finally:
        _asked.reset(token)


@contextlib.contextmanager
def _opened(settings: ProviderSettings, dag_id: str, run_id: str, what: str, open_it: Any) -> Iterator[Any]:
    """``open_it(hook, **run)`` entered, any failure but our own XCom errors raised as
    :class:`XComStoreUnavailableError` naming ``what``, the run, the connection and the topic."""
    with contextlib.ExitStack() as stack:
        try:
            opened = stack.enter_context(
                open_it(
                    PulsarStateHook(settings.conn_id),
                    settings.xcom_topic,
                    namespace=settings.key_namespace,
                    dag_id=dag_id,
                    run_id=run_id,
                    max_value_bytes=settings.xcom_max_value_bytes,
                )
            )
        except XComError:
            raise
        except Exception as exc:
            raise XComStoreUnavailableError(
                f"cannot open the {what} of run {run_id!r} of {dag_id!r} (connection {settings.conn_id!r}, "
                f"topic {settings.xcom_topic!r}): {type(exc).__name__}: {exc}"
            ) from exc
        yield opened


@contextlib.contextmanager
def run_store(settings: ProviderSettings, dag_id: str, run_id: str) -> Iterator[XComStore]:
    """This process's open XComStore of one DAG run (opened on demand, shared while in use).

    :raises XComStoreUnavailableError: the connection is invalid or the store cannot be opened.
    """
    with _opened(settings, dag_id, run_id, "XCom store", PulsarStateHook.xcom_run_store) as store:
        yield store


@contextlib.contextmanager
def run_messages(settings: ProviderSettings, dag_id: str, run_id: str) -> Iterator[XComMessageLog]:
    """This process's XComMessageLog of one DAG run (one publisher and reader, shared while in use).

    :raises XComStoreUnavailableError: the connection is invalid.
    """
    with _opened(settings, dag_id, run_id, "XCom topic", PulsarStateHook.xcom_message_log) as messages:
        yield messages


def _settings() -> ProviderSettings:
    """``[pulsarstate]``, after checking once per process that multi-team mode (if on) gives every
    team its own namespace and topics (:mod:`~airflow_provider_pulsarstate.hooks.teams`).

    :raises ConfigurationError: ``[core] multi_team`` is on and the teams share them (named).
    """
    with _lock:
        checked = bool(_teams_checked)
    if not checked:
        refuse_shared_team_settings()
        with _lock:
            _teams_checked.append(True)
    return provider_settings()


def get_store(settings: ProviderSettings | None = None) -> Any:
    """This process's open store of the earlier single-map layout (``xcom_topic`` itself), where
    version-1 references point; opened once per process, closed at exit.

    :raises XComStoreUnavailableError: the connection is invalid or the store cannot be opened.
    """
    settings = settings or provider_settings()
    try:
        return PulsarStateHook(settings.conn_id).get_xcom_store(
            settings.xcom_topic,
            namespace=settings.key_namespace,
            shared=True,
            max_value_bytes=settings.xcom_max_value_bytes,
        )
    except Exception as exc:
        raise XComStoreUnavailableError(
            f"cannot open the XCom store (connection {settings.conn_id!r}, topic {settings.xcom_topic!r}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def close_stores() -> None:
    """Close the stores and maps this process shares (at exit; tests call it when they change the connection)."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import close_shared_state_maps

    with _lock:
        _swept.clear()
        _teams_checked.clear()
    close_shared_state_maps()


def _type_name(value: Any) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _preview(value: Any, size: int, chars: int) -> str | None:
    if chars <= 0 or size > _PREVIEW_MAX_SIZE:
        return None
    try:
        text = repr(value)
    except Exception:
        return None
    return text if len(text) <= chars else text[: max(chars - 1, 0)] + "\u2026"


def _running_ti() -> Any:
    """The task instance of the active task context, or None outside one."""
    try:
        from airflow.sdk import get_current_context

        return get_current_context()["ti"]
    except Exception:
        return None


def _current_try(dag_id: str, run_id: str, task_id: str, map_index: int) -> int | None:
    """The try number of the running task instance, when it is the one pushing (else None).

    ``BaseXCom.set`` is not given the try. Inside ``execute`` the current context has the task
    instance; the return value is pushed after the context is left, by ``_xcom_push(ti, ...)`` of
    the task runner, so the caller frames are searched for that ``ti`` (a few frames, read only).
    """

    def matches(ti: Any) -> int | None:
        try:
            if (ti.dag_id, ti.run_id, ti.task_id, ti.map_index) == (dag_id, run_id, task_id, map_index):
                return int(ti.try_number)
        except Exception:
            pass
        return None

    ti = _running_ti()
    if ti is not None and (found := matches(ti)) is not None:
        return found
    for frame in caller_frames(2, 8):
        ti = frame.f_locals.get("ti")
        if ti is not None and (found := matches(ti)) is not None:
            return found
    return None


def _refuse_foreign_push(dag_id: str, run_id: str, task_id: str, map_index: int, where: str) -> None:
    """A task pushes only its own XComs: while a task context is active, another identity is refused."""
    ti = _running_ti()
    if ti is None:
        return
    own = (ti.dag_id, ti.run_id, ti.task_id, -1 if ti.map_index is None else ti.map_index)
    if own != (dag_id, run_id, task_id, map_index):
        raise XComReferenceError(
            f"{where}: task {own[0]}.{own[2]} (run {own[1]!r}, map index {own[3]}) may push only its own XComs; "
            f"nothing was written"
        )


def _where(dag_id: Any, run_id: Any, task_id: Any, map_index: Any, key: Any) -> str:
    index = "" if map_index in (None, -1) else f"[{map_index}]"
    return f"XCom {key!r} of task {dag_id}.{task_id}{index}, run {run_id!r}"


@contextlib.contextmanager
def _reaching_the_map(message: str, *, note: str = "") -> Iterator[None]:
    """Failures to reach the map become XComStoreUnavailableError(``message: <error><note>``); the
    backend's own XCom errors pass as they are."""
    try:
        yield
    except XComError:
        raise
    except Exception as exc:
        raise XComStoreUnavailableError(f"{message}: {type(exc).__name__}: {exc}{note}") from exc


def _storing(settings: ProviderSettings, where: str) -> contextlib.AbstractContextManager[None]:
    """Failures to write a pushed value become XComStoreUnavailableError saying nothing reached the DB."""
    return _reaching_the_map(
        f"{where}: cannot store it in {settings.xcom_topic!r} (connection {settings.conn_id!r})",
        note=". Nothing was written to the metadata DB.",
    )


def _reference(version: int, topic: str, map_key: str, record: Any, **located: str) -> dict[str, Any]:
    """The reference the metadata DB keeps for a stored value: where it is (``located``: a
    message's address and writer), then the record's size, type and write time."""
    return {
        REFERENCE_MARKER: version,
        "topic": topic,
        "key": map_key,
        **located,
        "size": record.size,
        "type": record.type_name,
        "written_at": datetime.datetime.fromtimestamp(record.written_at, datetime.timezone.utc).isoformat(),
    }


@dataclass(frozen=True)
class _Target:
    """Where a checked reference points: the run's topic (None: the legacy map), the key and, for
    a message, its address and writer id."""

    topic: str | None
    map_key: str
    identity: tuple[str, str, str, int, str]
    address: str | None = None
    writer_id: str | None = None


@contextlib.contextmanager
def _target_map_store(settings: ProviderSettings, target: _Target) -> Iterator[Any]:
    """The store holding a map reference's entry: its run's, or the legacy map's (``topic`` None)."""
    if target.topic is None:
        yield get_store(settings)
    else:
        with run_store(settings, target.identity[0], target.identity[1]) as store:
            yield store


class PulsarXComBackend(BaseXCom):
    """Airflow XCom backend keeping values in their run's topic (see the module docstring)."""

    # -------------------------------------------------------------- the row Airflow was asked for
    @classmethod
    def get_one(
        cls,
        *,
        key: str,
        dag_id: str,
        task_id: str,
        run_id: str,
        map_index: int | None = None,
        include_prior_dates: bool = False,
    ) -> Any | None:
        with _asking(dag_id, run_id, task_id, map_index, key, include_prior_dates=include_prior_dates):
            return super().get_one(
                key=key,
                dag_id=dag_id,
                task_id=task_id,
                run_id=run_id,
                map_index=map_index,
                include_prior_dates=include_prior_dates,
            )

    @classmethod
    async def aget_one(
        cls,
        *,
        key: str,
        dag_id: str,
        task_id: str,
        run_id: str,
        map_index: int | None = None,
        include_prior_dates: bool = False,
    ) -> Any | None:
        with _asking(dag_id, run_id, task_id, map_index, key, include_prior_dates=include_prior_dates):
            return await super().aget_one(
                key=key,
                dag_id=dag_id,
                task_id=task_id,
                run_id=run_id,
                map_index=map_index,
                include_prior_dates=include_prior_dates,
            )

    @classmethod
    def get_all(cls, *, key: str, dag_id: str, task_id: str, run_id: str, include_prior_dates: bool = False) -> Any:
        with _asking(dag_id, run_id, task_id, None, key, include_prior_dates=include_prior_dates):
            return super().get_all(
                key=key, dag_id=dag_id, task_id=task_id, run_id=run_id, include_prior_dates=include_prior_dates
            )

    @classmethod
    async def aget_all(
        cls, *, key: str, dag_id: str, task_id: str, run_id: str, include_prior_dates: bool = False
    ) -> Any:
        with _asking(dag_id, run_id, task_id, None, key, include_prior_dates=include_prior_dates):
            return await super().aget_all(
                key=key, dag_id=dag_id, task_id=task_id, run_id=run_id, include_prior_dates=include_prior_dates
            )

    @classmethod
    def delete(cls, key: str, task_id: str, dag_id: str, run_id: str, map_index: int | None = None) -> None:
        with _asking(dag_id, run_id, task_id, map_index, key, include_prior_dates=False):
            super().delete(key=key, task_id=task_id, dag_id=dag_id, run_id=run_id, map_index=map_index)

    # -------------------------------------------------------------- push
    @staticmethod
    def serialize_value(
        value: Any,
        *,
        key: str | None = None,
        task_id: str | None = None,
        dag_id: str | None = None,
        run_id: str | None = None,
        map_index: int | None = None,
    ) -> Any:
        """Store ``value`` in its run's map and return the reference the metadata DB keeps.

        :raises XComValueTooLargeError: over ``xcom_max_value_bytes`` with ``xcom_oversize = error``.
        :raises XComReferenceError: a push for another task instance than the running one.
        :raises ConfigurationError: ``[core] multi_team`` is on and the teams share a namespace or topic.
        :raises XComStoreUnavailableError: the map could not be written (nothing goes to the DB).
        """
        from airflow.sdk.serde import serialize

        settings = _settings()
        serialized = serialize(value)
        if key is None or task_id is None or dag_id is None or run_id is None:  # not a task's push
            return serialized
        map_index = -1 if map_index is None else map_index
        row = (dag_id, run_id, task_id, map_index, key)
        where = _where(*row)
        _refuse_foreign_push(dag_id, run_id, task_id, map_index, where)
        text = json.dumps(serialized, separators=(",", ":"))
        size = len(text.encode())
        if size > settings.xcom_max_value_bytes:
            return PulsarXComBackend._keep_in_db(settings, where, row, serialized, size)
        try_number = _current_try(dag_id, run_id, task_id, map_index)
        store_value = PulsarXComBackend._append if settings.xcom_layout == "messages" else PulsarXComBackend._put
        reference = store_value(settings, where, row, text, type_name=_type_name(value), try_number=try_number)
        preview = _preview(value, size, settings.xcom_preview_chars)
        if preview is not None:
            reference["preview"] = preview
        return reference

    @staticmethod
    def _keep_in_db(
        settings: ProviderSettings, where: str, row: tuple[str, str, str, int, str], serialized: Any, size: int
    ) -> dict[str, Any]:
        """An oversized value: refused (``xcom_oversize = error``), or the row that keeps it in the
        metadata DB (with the map layout, the row's earlier value is removed from the map first)."""
        limit = settings.xcom_max_value_bytes
        if settings.xcom_oversize == "error":
            raise XComValueTooLargeError(
                f"{where} is {size:,} bytes serialized, over the {limit:,}-byte limit "
                f"([pulsarstate] xcom_max_value_bytes; xcom_oversize = error)",
                size=size,
                limit=limit,
            )
        log.info("%s is %s bytes, over the %s-byte limit: kept in the metadata DB", where, f"{size:,}", f"{limit:,}")
        if settings.xcom_layout == "map":  # a message needs no removal: nothing refers to it any more
            with (
                _reaching_the_map(f"{where}: cannot remove its earlier value from {settings.xcom_topic!r}"),
                run_store(settings, row[0], row[1]) as store,
            ):
                store.delete(*row)
        return {DB_VALUE_MARKER: 1, "value": serialized}

    @staticmethod
    def _put(
        settings: ProviderSettings,
        where: str,
        row: tuple[str, str, str, int, str],
        text: str,
        *,
        type_name: str,
        try_number: int | None,
    ) -> dict[str, Any]:
        """Put the value in its run's map (the map layout); the reference the DB keeps for it."""
        with _storing(settings, where), run_store(settings, row[0], row[1]) as store:
            PulsarXComBackend._sweep_older_tries(store, *row[:4], try_number)
            map_key, record = store.put(*row, text, type_name=type_name, try_number=try_number)
        return _reference(MAP_REFERENCE_VERSION, store.topic, map_key, record)

    @staticmethod
    def _append(
        settings: ProviderSettings,
        where: str,
        row: tuple[str, str, str, int, str],
        text: str,
        *,
        type_name: str,
        try_number: int | None,
    ) -> dict[str, Any]:
        """Append the value as one message of its run's topic; the reference the DB keeps for it."""
        identity = XComIdentity(settings.key_namespace, *row)
        with _storing(settings, where), run_messages(settings, row[0], row[1]) as messages:
            address, message = messages.append(identity, text, type_name=type_name, try_number=try_number)
        return _reference(
            REFERENCE_VERSION,
            messages.topic,
            identity.map_key,
            message.record,
            address=address,
            writer=message.writer_id,
        )

    @staticmethod
    def _sweep_older_tries(
        store: Any, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int | None
    ) -> None:
        """Once per task try and process: remove entries earlier tries left in the map."""
        if try_number is None or try_number <= 1:
            return
        marker = (store.topic, store.namespace, dag_id, run_id, task_id, map_index, try_number)
        if marker in _swept:
            return
        removed = store.delete_older_tries(dag_id, run_id, task_id, map_index, try_number)
        _swept.add(marker)
        if removed:
            log.info("removed %d XCom entries of earlier tries of %s.%s (run %r)", removed, dag_id, task_id, run_id)

    # -------------------------------------------------------------- pull
    @staticmethod
    def deserialize_value(result: Any) -> Any:
        """The value a DB row refers to (read from its run map with ``latest=True``), or the row's
        own value when it holds one (oversized values, values written before this backend).

        :raises XComReferenceError: the reference is malformed, names another topic or namespace,
            or names another row than the one Airflow was asked for.
        :raises XComEntryNotFoundError: the map has no entry under the key (names it).
        :raises XComStoreUnavailableError: the map could not be read.
        """
        from airflow.sdk.serde import deserialize

        value = result.value
        if isinstance(value, dict) and set(value) == {DB_VALUE_MARKER, "value"} and value[DB_VALUE_MARKER] == 1:
            return deserialize(value["value"])
        if not (isinstance(value, dict) and REFERENCE_MARKER in value):
            return BaseXCom.deserialize_value(result)
        settings = _settings()
        target = PulsarXComBackend._checked(value, settings, asked=_asked.get(), xcom_key=getattr(result, "key", None))
        if target.address is not None:
            identity = XComIdentity(settings.key_namespace, *target.identity)
            with (
                _reaching_the_map(f"cannot read XCom {target.map_key!r} from {target.topic}"),
                run_messages(settings, target.identity[0], target.identity[1]) as messages,
            ):
                message = messages.read(target.address, identity=identity, writer_id=target.writer_id or "")
            return deserialize(message.record.json_value())
        with (
            _reaching_the_map(f"cannot read XCom {target.map_key!r} from {target.topic or settings.xcom_topic!r}"),
            _target_map_store(settings, target) as store,
        ):
            record = store.map.get(target.map_key, latest=True)
            topic = store.topic
        if record is None:
            raise XComEntryNotFoundError(
                f"XCom entry {target.map_key!r} is not in {topic}: it was purged or cleaned up "
                f"(xcom-cleanup, retention), or its topic was replaced",
                key=target.map_key,
                topic=topic,
            )
        return deserialize(record.json_value())

    @staticmethod
    def _checked(
        reference: dict[str, Any], settings: ProviderSettings, *, asked: _Row | None, xcom_key: Any = None
    ) -> _Target:
        """Where a reference points, after checking that it names this deployment's store, that its
        topic is the one its own row gives, and that it is the row Airflow was asked for."""
        version, topic, map_key = reference.get(REFERENCE_MARKER), reference.get("topic"), reference.get("key")
        address, writer = reference.get("address"), reference.get("writer")
        if (
            version not in _VERSIONS
            or isinstance(version, bool)
            or not isinstance(topic, str)
            or not isinstance(map_key, str)
            or (
                version == REFERENCE_VERSION
                and not (isinstance(address, str) and address and isinstance(writer, str) and writer)
            )
        ):
            raise XComReferenceError(
                f"malformed XCom reference (version {version!r}, topic {topic!r}, key {map_key!r}): expected "
                f"version {REFERENCE_VERSION} with string topic, key, address and writer, or {MAP_REFERENCE_VERSION} "
                f"or {LEGACY_REFERENCE_VERSION} with string topic and key"
            )
        if version == LEGACY_REFERENCE_VERSION:  # written under this namespace or the earlier default
            try:
                identity = XComStore.parse_key_of(settings.key_namespace, map_key)
            except XComReferenceError:
                identity = XComStore.parse_key_of(LEGACY_KEY_NAMESPACE, map_key)
            expected, target_topic = get_store(settings).topic, None
        else:
            identity = XComStore.parse_key_of(settings.key_namespace, map_key)
            topic_of_run = message_topic if version == REFERENCE_VERSION else run_topic
            expected = topic_of_run(
                PulsarStateHook(settings.conn_id).cached_topic_name(settings.xcom_topic),
                settings.key_namespace,
                identity[0],
                identity[1],
            )
            target_topic = expected
        if topic != expected:
            raise XComReferenceError(
                f"XCom reference to key {map_key!r} names topic {topic!r}, not the topic of its own run "
                f"{expected!r}: refusing to follow it"
            )
        problem = asked.mismatch(*identity) if asked is not None else None
        if problem is None and isinstance(xcom_key, str) and xcom_key != identity[4]:
            problem = f"key {identity[4]!r} (the row is key {xcom_key!r})"
        if problem is not None:
            raise XComReferenceError(
                f"XCom reference to key {map_key!r} is not bound to its row: it names {problem}; refusing to follow it"
            )
        if version == REFERENCE_VERSION:
            return _Target(target_topic, map_key, identity, address=address, writer_id=writer)
        return _Target(target_topic, map_key, identity)

    # -------------------------------------------------------------- purge
    @classmethod
    def purge(cls, xcom: Any, *args: Any) -> None:
        """Delete the map entry a DB row refers to (Airflow calls this before deleting the row: on a
        task's retry or re-run, and ``XCom.delete``). A reference to another store, or one not bound
        to the row being deleted, is left alone (logged as an error naming the key).

        :raises XComStoreUnavailableError: the map could not be written (the row then stays, so a
            later purge or the clean-up can remove the entry).
        """
        value = getattr(xcom, "value", None)
        if not (isinstance(value, dict) and REFERENCE_MARKER in value):
            return
        settings = _settings()
        try:
            target = cls._checked(value, settings, asked=_asked.get(), xcom_key=getattr(xcom, "key", None))
        except XComReferenceError as exc:
            log.error("not purging XCom %r: %s", getattr(xcom, "key", None), exc)
            return
        if target.address is not None:
            return  # a message is immutable: dropping the row is the deletion; clean-up deletes the run's topic
        with (
            _reaching_the_map(f"cannot purge XCom {target.map_key!r} from {target.topic or settings.xcom_topic!r}"),
            _target_map_store(settings, target) as store,
        ):
            store.delete_key(target.map_key)
