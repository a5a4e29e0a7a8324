"""PulsarXComBackend: XCom values in a PulsarMap, a small readable reference in the metadata DB.

Configure it on every worker (and wherever tasks run)::

    [core]
    xcom_backend = airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend

    [pulsarstate]
    conn_id = pulsarstate_default      # the pulsarstate connection (embedded file when undefined)
    xcom_topic = airflow-xcom
    key_namespace = airflow            # keys: <ns>/xcom/<dag>/<run>/<task>/<map_index>/<key>
    xcom_max_value_bytes = 1048576
    xcom_oversize = db                 # or: error
    xcom_preview_chars = 80

What the metadata DB (and so the UI) keeps for a value stored in the map::

    {"__pulsarstate_xcom__": 1, "topic": "persistent://public/default/airflow-xcom",
     "key": "airflow/xcom/my_dag/manual__2026.../extract/-1/return_value",
     "size": 57, "type": "dict", "written_at": "2026-11-23T20:01:02.123456+00:00",
     "preview": "{'rows': 3, 'day': datetime.date(2026, 11, 23)}"}

Guarantees:

* Values round-trip with their types as with Airflow's default backend: the map holds the JSON text
  of ``airflow.sdk.serde.serialize(value)`` and reading applies ``airflow.sdk.serde.deserialize``
  (the same ``[core] allowed_deserialization_classes`` policy).
* A value over ``xcom_max_value_bytes`` stays in the DB (``xcom_oversize = db``), or fails the task
  with :class:`XComValueTooLargeError` naming the limit and the size (``error``).
* An unreachable store (broker down, time-out) fails the task with
  :class:`XComStoreUnavailableError` naming topic and key: the value is never put in the DB instead.
* A reference is checked before it is followed: a topic other than the configured one, a key outside
  ``<key_namespace>/xcom/``, or a missing entry raises an error naming the key; nothing in a reference
  is imported or executed.
* Reads use ``latest=True``: a value pushed by another task process is seen.
* Retries: at the start of every try Airflow calls :meth:`purge` for each XCom the DB holds for the
  task instance (``xcom_keys_to_clear`` of the execution API's ``ti_run``), which deletes the map entry.
  Entries that never reached the DB (the process died between the map write and the DB write) are
  removed when the next try stores its first value (entries record the try that wrote them).
* One open map per process and settings (reopened after a fork), closed at exit.

Airflow never calls ``purge`` when a run is deleted, cleared through the REST API, or removed by
``airflow db clean``: run ``airflow pulsarstate xcom-cleanup`` or ``XComCleanupOperator`` for those.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import sys
import threading
from typing import Any, Iterator

from airflow.sdk.bases.xcom import BaseXCom

from airflow_provider_pulsarstate.engine.errors import (
    XComEntryNotFoundError,
    XComError,
    XComReferenceError,
    XComStoreUnavailableError,
    XComValueTooLargeError,
)
from airflow_provider_pulsarstate.hooks.provider_config import ProviderSettings, settings as provider_settings

log = logging.getLogger(__name__)

REFERENCE_MARKER = "__pulsarstate_xcom__"
REFERENCE_VERSION = 1
_PREVIEW_MAX_SIZE = 64 * 1024  # bigger values get no preview (repr of a large value costs time)

_lock = threading.Lock()
_swept: set[tuple[Any, ...]] = set()  # task tries whose older tries' entries were removed here


def get_store(settings: ProviderSettings | None = None) -> Any:
    """This process's open XComStore for ``settings`` (default: ``[pulsarstate]``); opened once
    per process (the hook's shared stores), closed at exit.

    :raises XComStoreUnavailableError: the connection is invalid or the store cannot be opened.
    """
    settings = settings or provider_settings()
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    try:
        return PulsarStateHook(settings.conn_id).get_xcom_store(
            settings.xcom_topic, namespace=settings.key_namespace, shared=True,
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
    close_shared_state_maps()


def _type_name(value: Any) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _preview(value: Any, size: int, chars: int) -> str | None:
    if size > _PREVIEW_MAX_SIZE:
        return None
    try:
        text = repr(value)
    except Exception:
        return None
    return text if len(text) <= chars else text[: max(chars - 1, 0)] + "\u2026"


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

    try:
        from airflow.sdk import get_current_context

        found = matches(get_current_context()["ti"])
        if found is not None:
            return found
    except Exception:
        pass
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        ti = frame.f_locals.get("ti")
        if ti is not None and (found := matches(ti)) is not None:
            return found
    return None


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


class PulsarXComBackend(BaseXCom):
    """Airflow XCom backend keeping values in a PulsarMap (see the module docstring)."""

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
        """Store ``value`` in the map and return the reference the metadata DB keeps.

        :raises XComValueTooLargeError: over ``xcom_max_value_bytes`` with ``xcom_oversize = error``.
        :raises XComStoreUnavailableError: the map could not be written (nothing goes to the DB).
        """
        from airflow.sdk.serde import serialize

        settings = provider_settings()
        serialized = serialize(value)
        if None in (key, task_id, dag_id, run_id):  # not a task's push: nowhere to file it
            return serialized
        map_index = -1 if map_index is None else map_index
        where = _where(dag_id, run_id, task_id, map_index, key)
        text = json.dumps(serialized, separators=(",", ":"))
        size = len(text.encode())
        limit = settings.xcom_max_value_bytes
        if size > limit:
            if settings.xcom_oversize == "error":
                raise XComValueTooLargeError(
                    f"{where} is {size:,} bytes serialized, over the {limit:,}-byte limit "
                    f"([pulsarstate] xcom_max_value_bytes; xcom_oversize = error)",
                    size=size, limit=limit,
                )
            log.info("%s is %s bytes, over the %s-byte limit: kept in the metadata DB", where, f"{size:,}", f"{limit:,}")
            PulsarXComBackend._drop_superseded(settings, dag_id, run_id, task_id, map_index, key, where)
            return serialized
        try_number = _current_try(dag_id, run_id, task_id, map_index)
        with _reaching_the_map(
            f"{where}: cannot store it in {settings.xcom_topic!r} (connection {settings.conn_id!r})",
            note=". Nothing was written to the metadata DB.",
        ):
            store = get_store(settings)
            PulsarXComBackend._sweep_older_tries(store, dag_id, run_id, task_id, map_index, try_number)
            map_key, record = store.put(
                dag_id, run_id, task_id, map_index, key, text, type_name=_type_name(value), try_number=try_number
            )
        reference: dict[str, Any] = {
            REFERENCE_MARKER: REFERENCE_VERSION,
            "topic": store.topic,
            "key": map_key,
            "size": record.size,
            "type": record.type_name,
            "written_at": datetime.datetime.fromtimestamp(record.written_at, datetime.timezone.utc).isoformat(),
        }
        preview = _preview(value, size, settings.xcom_preview_chars)
        if preview is not None:
            reference["preview"] = preview
        return reference

    @staticmethod
    def _sweep_older_tries(store: Any, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int | None) -> None:
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

    @staticmethod
    def _drop_superseded(
        settings: ProviderSettings, dag_id: str, run_id: str, task_id: str, map_index: int, key: str, where: str
    ) -> None:
        """A value now kept in the DB replaces any earlier one of the same key in the map."""
        with _reaching_the_map(f"{where}: cannot remove its earlier value from {settings.xcom_topic!r}"):
            get_store(settings).delete(dag_id, run_id, task_id, map_index, key)

    @staticmethod
    def deserialize_value(result: Any) -> Any:
        """The value a DB row refers to (read from the map with ``latest=True``), or the row's own
        value when it holds one (oversized values, values written before this backend).

        :raises XComReferenceError: the reference is malformed or names another topic or namespace.
        :raises XComEntryNotFoundError: the map has no entry under the key (names it).
        :raises XComStoreUnavailableError: the map could not be read.
        """
        from airflow.sdk.serde import deserialize

        value = result.value
        if not (isinstance(value, dict) and REFERENCE_MARKER in value):
            return BaseXCom.deserialize_value(result)
        settings = provider_settings()
        map_key = PulsarXComBackend._checked_key(value, settings)
        with _reaching_the_map(f"cannot read XCom {map_key!r} from {settings.xcom_topic!r}"):
            store = get_store(settings)
            record = store.map.get(map_key, latest=True)  # the key was checked: this store's, in canonical form
        if record is None:
            raise XComEntryNotFoundError(
                f"XCom entry {map_key!r} is not in {store.topic}: it was purged or cleaned up "
                f"(xcom-cleanup, retention), or its topic was replaced",
                key=map_key, topic=store.topic,
            )
        return deserialize(record.json_value())

    @staticmethod
    def _checked_key(reference: dict[str, Any], settings: ProviderSettings) -> str:
        """The map key of a reference, after checking it names this deployment's store."""
        version, topic, map_key = reference.get(REFERENCE_MARKER), reference.get("topic"), reference.get("key")
        if version != REFERENCE_VERSION or not isinstance(topic, str) or not isinstance(map_key, str):
            raise XComReferenceError(
                f"malformed XCom reference (version {version!r}, topic {topic!r}, key {map_key!r}): "
                f"expected version {REFERENCE_VERSION} with string topic and key"
            )
        store = get_store(settings)
        if topic != store.topic:
            raise XComReferenceError(
                f"XCom reference to key {map_key!r} names topic {topic!r}, not this deployment's XCom topic "
                f"{store.topic!r} ([pulsarstate] xcom_topic): refusing to follow it"
            )
        store.parse_key(map_key)  # raises XComReferenceError outside <key_namespace>/xcom/
        return map_key

    @classmethod
    def purge(cls, xcom: Any, *args: Any) -> None:
        """Delete the map entry a DB row refers to (Airflow calls this before deleting the row: on a
        task's retry or re-run, and ``XCom.delete``). A reference to another store is left alone.

        :raises XComStoreUnavailableError: the map could not be written (the row then stays, so a
            later purge or the clean-up can remove the entry).
        """
        value = getattr(xcom, "value", None)
        if not (isinstance(value, dict) and REFERENCE_MARKER in value):
            return
        settings = provider_settings()
        try:
            map_key = cls._checked_key(value, settings)
        except XComReferenceError as exc:
            log.warning("not purging XCom %r: %s", getattr(xcom, "key", None), exc)
            return
        with _reaching_the_map(f"cannot purge XCom {map_key!r} from {settings.xcom_topic!r}"):
            get_store(settings).delete_key(map_key)
