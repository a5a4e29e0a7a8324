"""The XCom write path: a pushed value into its run's topic or map, or, oversized, the DB.

Guarantees:

* A value over ``xcom_max_value_bytes`` stays in the DB (:func:`keep_in_db`), or fails the task
  with :class:`XComValueTooLargeError` naming the limit and the size (``xcom_oversize = error``).
* A store that cannot be written raises :class:`XComStoreUnavailableError` saying that nothing was
  written to the metadata DB: a value is never put there instead.
* The map layout removes entries earlier tries left, once per try and process.
"""

from __future__ import annotations

import contextlib
from typing import Any

from airflow_provider_pulsarstate.engine.errors import XComValueTooLargeError
from airflow_provider_pulsarstate.hooks.pulsarstate import XComIdentity
from airflow_provider_pulsarstate.provider_settings import ProviderSettings
from airflow_provider_pulsarstate.xcom.references import (
    MAP_REFERENCE_VERSION,
    REFERENCE_VERSION,
    Identity,
    in_db,
    reference,
)
from airflow_provider_pulsarstate.xcom.run_stores import (
    log,
    reaching_the_map,
    run_messages,
    run_store,
    sweep_older_tries,
)

_PREVIEW_MAX_SIZE = 64 * 1024  # bigger values get no preview (repr of a large value costs time)


def where(dag_id: Any, run_id: Any, task_id: Any, map_index: Any, key: Any) -> str:
    """How errors and logs name an XCom row."""
    index = "" if map_index in (None, -1) else f"[{map_index}]"
    return f"XCom {key!r} of task {dag_id}.{task_id}{index}, run {run_id!r}"


def type_name(value: Any) -> str:
    """The value's type as a reference records it (builtins by their bare name)."""
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def preview(value: Any, size: int, chars: int) -> str | None:
    """At most ``chars`` characters of the value's repr (None: no preview, or too large a value)."""
    if chars <= 0 or size > _PREVIEW_MAX_SIZE:
        return None
    try:
        text = repr(value)
    except Exception:
        return None
    return text if len(text) <= chars else text[: max(chars - 1, 0)] + "\u2026"


def _storing(settings: ProviderSettings, where: str) -> contextlib.AbstractContextManager[None]:
    """Failures to write a pushed value become XComStoreUnavailableError saying nothing reached the DB."""
    return reaching_the_map(
        f"{where}: cannot store it in {settings.xcom_topic!r} (connection {settings.conn_id!r})",
        note=". Nothing was written to the metadata DB.",
    )


def keep_in_db(settings: ProviderSettings, where: str, row: Identity, serialized: Any, size: int) -> dict[str, Any]:
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
            reaching_the_map(f"{where}: cannot remove its earlier value from {settings.xcom_topic!r}"),
            run_store(settings, row[0], row[1]) as store,
        ):
            store.delete(*row)
    return in_db(serialized)


def put_in_map(
    settings: ProviderSettings, where: str, row: Identity, text: str, *, type_name: str, try_number: int | None
) -> dict[str, Any]:
    """Put the value in its run's map (the map layout); the reference the DB keeps for it."""
    with _storing(settings, where), run_store(settings, row[0], row[1]) as store:
        sweep_older_tries(store, *row[:4], try_number)
        map_key, record = store.put(*row, text, type_name=type_name, try_number=try_number)
    return reference(MAP_REFERENCE_VERSION, store.topic, map_key, record)


def append_message(
    settings: ProviderSettings, where: str, row: Identity, text: str, *, type_name: str, try_number: int | None
) -> dict[str, Any]:
    """Append the value as one message of its run's topic; the reference the DB keeps for it."""
    identity = XComIdentity(settings.key_namespace, *row)
    with _storing(settings, where), run_messages(settings, row[0], row[1]) as messages:
        address, message = messages.append(identity, text, type_name=type_name, try_number=try_number)
    return reference(
        REFERENCE_VERSION, messages.topic, identity.map_key, message.record, address=address, writer=message.writer_id
    )
