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
import json
from collections.abc import Iterator
from typing import Any

from airflow.sdk.bases.xcom import BaseXCom

from airflow_provider_pulsarstate.engine.errors import XComReferenceError
from airflow_provider_pulsarstate.xcom.pull import delete_entry, read_serialized
from airflow_provider_pulsarstate.xcom.push import append_message, keep_in_db, preview, put_in_map, type_name, where
from airflow_provider_pulsarstate.xcom.references import (
    DB_VALUE_MARKER,
    LEGACY_REFERENCE_VERSION,
    MAP_REFERENCE_VERSION,
    REFERENCE_MARKER,
    REFERENCE_VERSION,
    AskedRow,
    checked_target,
    is_reference,
    kept_in_db,
)
from airflow_provider_pulsarstate.xcom.run_stores import (
    checked_settings,
    close_stores,
    get_store,
    log,
    run_messages,
    run_store,
)
from airflow_provider_pulsarstate.xcom.task_context import current_try, refuse_foreign_push

__all__ = [
    "DB_VALUE_MARKER",
    "LEGACY_REFERENCE_VERSION",
    "MAP_REFERENCE_VERSION",
    "REFERENCE_MARKER",
    "REFERENCE_VERSION",
    "PulsarXComBackend",
    "close_stores",
    "get_store",
    "run_messages",
    "run_store",
]

_asked: contextvars.ContextVar[AskedRow | None] = contextvars.ContextVar("pulsarstate_xcom_row", default=None)


@contextlib.contextmanager
def _asking(
    dag_id: str, run_id: str, task_id: str, map_index: int | None, key: str, *, include_prior_dates: bool
) -> Iterator[None]:
    """While Airflow reads or deletes rows: the row asked for (any run with ``include_prior_dates``,
    any map index when None), which every reference followed must name."""
    token = _asked.set(AskedRow(dag_id, None if include_prior_dates else run_id, task_id, map_index, key))
    try:
        yield
    finally:
        _asked.reset(token)


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

        settings = checked_settings()
        serialized = serialize(value)
        if key is None or task_id is None or dag_id is None or run_id is None:  # not a task's push
            return serialized
        map_index = -1 if map_index is None else map_index
        row = (dag_id, run_id, task_id, map_index, key)
        at = where(*row)
        refuse_foreign_push(dag_id, run_id, task_id, map_index, at)
        text = json.dumps(serialized, separators=(",", ":"))
        size = len(text.encode())
        if size > settings.xcom_max_value_bytes:
            return keep_in_db(settings, at, row, serialized, size)
        try_number = current_try(dag_id, run_id, task_id, map_index)  # called from here: it reads our caller's frames
        store_value = append_message if settings.xcom_layout == "messages" else put_in_map
        reference = store_value(settings, at, row, text, type_name=type_name(value), try_number=try_number)
        shown = preview(value, size, settings.xcom_preview_chars)
        if shown is not None:
            reference["preview"] = shown
        return reference

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
        if kept_in_db(value):
            return deserialize(value["value"])
        if not is_reference(value):
            return BaseXCom.deserialize_value(result)
        settings = checked_settings()
        target = checked_target(value, settings, asked=_asked.get(), xcom_key=getattr(result, "key", None))
        return deserialize(read_serialized(settings, target))

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
        if not is_reference(value):
            return
        settings = checked_settings()
        try:
            target = checked_target(value, settings, asked=_asked.get(), xcom_key=getattr(xcom, "key", None))
        except XComReferenceError as exc:
            log.error("not purging XCom %r: %s", getattr(xcom, "key", None), exc)
            return
        delete_entry(settings, target)  # a message: nothing (dropping the row is the deletion)
