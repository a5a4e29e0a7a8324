"""The XCom stores a process opens: its runs' topics and maps, and the earlier single map.

Guarantees:

* A run's store or message log is opened on demand and shared while in use
  (:mod:`~airflow_provider_pulsarstate.hooks.shared_objects` bounds how many stay open).
* Any failure to open or reach one, but the backend's own XCom errors, is raised as
  :class:`XComStoreUnavailableError` naming the run, the connection and the topic: a value is
  never put in the metadata DB instead.
* Multi-team mode is checked once per process before the first value is stored or read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from airflow_provider_pulsarstate.engine.errors import XComError, XComStoreUnavailableError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook, XComMessageLog, XComStore
from airflow_provider_pulsarstate.hooks.teams import refuse_shared_team_settings
from airflow_provider_pulsarstate.provider_settings import ProviderSettings
from airflow_provider_pulsarstate.provider_settings import settings as provider_settings

log = logging.getLogger("airflow_provider_pulsarstate.xcom.backend")
"""The backend's logger: one name for all its parts."""

_lock = threading.Lock()
_swept: set[tuple[Any, ...]] = set()  # task tries whose older tries' entries were removed here
_teams_checked: list[bool] = []


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


def checked_settings() -> ProviderSettings:
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


@contextlib.contextmanager
def reaching_the_map(message: str, *, note: str = "") -> Iterator[None]:
    """Failures to reach the map become XComStoreUnavailableError(``message: <error><note>``); the
    backend's own XCom errors pass as they are."""
    try:
        yield
    except XComError:
        raise
    except Exception as exc:
        raise XComStoreUnavailableError(f"{message}: {type(exc).__name__}: {exc}{note}") from exc


def sweep_older_tries(
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
