"""Which task instance is pushing an XCom: its identity and try, read from the task context.

Guarantees: a task pushes only its own XComs (:func:`refuse_foreign_push`); the try number, which
Airflow does not hand the backend, is found read-only (:func:`current_try`), or is None.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_pulsarstate.engine.errors import XComReferenceError
from airflow_provider_pulsarstate.hooks.airflow_internals import caller_frames


def running_ti() -> Any:
    """The task instance of the active task context, or None outside one."""
    try:
        from airflow.sdk import get_current_context

        return get_current_context()["ti"]
    except Exception:
        return None


def current_try(dag_id: str, run_id: str, task_id: str, map_index: int) -> int | None:
    """The try number of the running task instance, when it is the one pushing (else None).

    ``BaseXCom.set`` is not given the try. Inside ``execute`` the current context has the task
    instance; the return value is pushed after the context is left, by ``_xcom_push(ti, ...)`` of
    the task runner, so the caller frames are searched for that ``ti`` (a few frames, read only):
    call it directly from ``serialize_value``, whose caller's frame is the first searched.
    """

    def matches(ti: Any) -> int | None:
        try:
            if (ti.dag_id, ti.run_id, ti.task_id, ti.map_index) == (dag_id, run_id, task_id, map_index):
                return int(ti.try_number)
        except Exception:
            pass
        return None

    ti = running_ti()
    if ti is not None and (found := matches(ti)) is not None:
        return found
    for frame in caller_frames(2, 8):
        ti = frame.f_locals.get("ti")
        if ti is not None and (found := matches(ti)) is not None:
            return found
    return None


def refuse_foreign_push(dag_id: str, run_id: str, task_id: str, map_index: int, where: str) -> None:
    """A task pushes only its own XComs: while a task context is active, another identity is refused."""
    ti = running_ti()
    if ti is None:
        return
    own = (ti.dag_id, ti.run_id, ti.task_id, -1 if ti.map_index is None else ti.map_index)
    if own != (dag_id, run_id, task_id, map_index):
        raise XComReferenceError(
            f"{where}: task {own[0]}.{own[2]} (run {own[1]!r}, map index {own[3]}) may push only its own XComs; "
            f"nothing was written"
        )
