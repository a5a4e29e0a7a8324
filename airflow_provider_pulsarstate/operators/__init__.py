"""Operators for state tables: temp-view switching (create, apply, drop) and its Spark task group; leases across tasks."""

from __future__ import annotations

from airflow_provider_pulsarstate.operators.leases import (
    AcquireLeaseOperator,
    LeaseGuardMixin,
    LeaseTaskGroup,
    ReleaseLeaseOperator,
    hold_lease,
    lease_task_group,
)
from airflow_provider_pulsarstate.operators.views import (
    ApplyTempViewOperator,
    CreateTempViewOperator,
    DropTempViewOperator,
    TempViewTaskGroup,
    temp_view_spark_task_group,
)

__all__ = [
    "AcquireLeaseOperator",
    "ApplyTempViewOperator",
    "CreateTempViewOperator",
    "DropTempViewOperator",
    "LeaseGuardMixin",
    "LeaseTaskGroup",
    "ReleaseLeaseOperator",
    "TempViewTaskGroup",
    "hold_lease",
    "lease_task_group",
    "temp_view_spark_task_group",
]
