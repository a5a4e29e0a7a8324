"""An auth manager for the UI tests: Airflow's simple auth manager, except that users whose name
starts with ``no-xcom`` may not read any DAG's XComs (``DagAccessEntity.XCOM``), whatever their
role; everything else is the simple auth manager's role check. Configured with
``[core] auth_manager = tests.airflow.xcom_auth_manager.XComRestrictedAuthManager``."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

RESTRICTED_PREFIX = "no-xcom"


class XComRestrictedAuthManager(SimpleAuthManager):
    """Simple auth manager with the XCom restriction above."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        if access_entity == DagAccessEntity.XCOM and user.get_name().startswith(RESTRICTED_PREFIX):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
