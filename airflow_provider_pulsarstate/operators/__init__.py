"""Operators for state tables: temp-view switching (create, apply, drop) and its Spark task group."""

from __future__ import annotations

from airflow_provider_pulsarstate.operators.views import (
    ApplyTempViewOperator,
    CreateTempViewOperator,
    DropTempViewOperator,
    TempViewTaskGroup,
    temp_view_spark_task_group,
)

__all__ = [
    "ApplyTempViewOperator",
    "CreateTempViewOperator",
    "DropTempViewOperator",
    "TempViewTaskGroup",
    "temp_view_spark_task_group",
]
