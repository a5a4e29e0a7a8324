"""State tables as assets: the outlet an apply declares and the asset event it emits.

A table's topic is often templated (``"{{ params.table_topic }}"``) and a short name is placed in
the connection's tenant and namespace, so the asset is known only when the task runs. The apply
operator therefore declares an :class:`~airflow.sdk.AssetAlias` as its outlet and, after an apply
that published something, attaches the table's asset ``pulsar://<tenant>/<namespace>/<topic>`` to
it with an event. Airflow emits nothing for an alias the task left empty: a re-apply, a dry run or
a diff with nothing to publish wakes no downstream DAG.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset, AssetAlias

from airflow_provider_pulsarstate.assets.uri import LINEAGE_NAMESPACE_EXTRA, topic_asset_uri

ALIAS_PREFIX = "pulsarstate-table:"


def table_alias(dag_id: str | None, task_id: str) -> AssetAlias:
    """The alias an apply task declares as its outlet: ``pulsarstate-table:<dag_id>.<task_id>``."""
    return AssetAlias(name=f"{ALIAS_PREFIX}{dag_id}.{task_id}" if dag_id else f"{ALIAS_PREFIX}{task_id}")


def apply_event_extra(table: str, result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The asset event's extra for one apply result, or None when it published nothing new.

    ``{"table", "view_id", "commit_offset", "set", "delete", "unchanged"}``; ``table`` is the
    full topic name.
    """
    if result.get("already_applied") or not (result.get("set", 0) or result.get("delete", 0)):
        return None
    return {
        "table": table,
        "view_id": result["view_id"],
        "commit_offset": result["commit_offset"],
        "set": result["set"],
        "delete": result["delete"],
        "unchanged": result["unchanged"],
    }


def emit_apply_event(
    context: Mapping[str, Any],
    alias: AssetAlias,
    *,
    table: str,
    result: Mapping[str, Any],
    lineage_namespace: str | None = None,
) -> Asset | None:
    """Attach the table's asset to ``alias`` with the event of this apply; returns it (None: no event).

    ``lineage_namespace`` (the connection's OpenLineage namespace) goes into the asset's extra, so
    the ``pulsar://`` converter names the same dataset as the operator's own lineage without
    looking the connection up. Does nothing outside a task run (a context without ``outlet_events``).
    """
    extra = apply_event_extra(table, result)
    events = context.get("outlet_events")
    if extra is None or events is None:
        return None
    asset_extra: dict[str, Any] = {LINEAGE_NAMESPACE_EXTRA: lineage_namespace} if lineage_namespace else {}
    asset = Asset(uri=topic_asset_uri(table), extra=asset_extra)
    events[alias].add(asset, extra=extra)
    return asset
