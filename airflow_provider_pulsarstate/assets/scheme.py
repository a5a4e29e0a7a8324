"""What the provider info registers for the ``pulsar`` asset URI scheme (``asset-uris``).

``sanitize_uri`` (the handler) lives in :mod:`~airflow_provider_pulsarstate.assets.uri`; this module
adds the asset factory and the converter to an OpenLineage dataset. The converter imports the
OpenLineage client only when called, which happens only where the OpenLineage provider runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset

from airflow_provider_pulsarstate.assets.uri import (
    LINEAGE_NAMESPACE_EXTRA,
    SCHEME,
    asset_topic,
    sanitize_uri,
    topic_asset_uri,
)
from airflow_provider_pulsarstate.engine.config import ConnectionConfig

if TYPE_CHECKING:
    from openlineage.client.event_v2 import Dataset

__all__ = ["convert_asset_to_openlineage", "create_asset", "sanitize_uri"]


def create_asset(
    *, topic: str, tenant: str = "public", namespace: str = "default", extra: dict[str, Any] | None = None
) -> Asset:
    """The asset of a topic or state table: ``create_asset(topic="prices")`` is
    ``Asset("pulsar://public/default/prices")``.

    :param topic: a short name (placed in ``tenant/namespace``) or a full ``persistent://`` name.
    :raises AssetURIError: the name makes no canonical URI.
    :raises ConfigurationError: a ``non-persistent://`` topic, or a full name with extra segments.
    """
    full = ConnectionConfig(tenant=tenant, namespace=namespace, allow_other_namespaces=True).topic_name(topic)
    return Asset(uri=topic_asset_uri(full), extra=extra or {})


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any = None) -> Dataset:
    """The OpenLineage dataset of a ``pulsar://`` asset; makes no connection, Variable or DB lookup.

    The OpenLineage listener calls this in a process forked from the task, where a lookup through
    the task's supervisor can hang (and the event is then dropped), so the namespace comes only
    from the asset: its extra's ``pulsarstate_lineage_namespace`` (set by the apply operator's
    table event and by hook lineage: ``pulsar://{host}:{port}`` of the connection's broker, the
    namespace the operators' own lineage uses), else ``pulsar``, the scheme alone (an asset a DAG
    declares by hand names no broker). The name is the full topic name
    ``persistent://{tenant}/{namespace}/{topic}``. See
    :func:`~airflow_provider_pulsarstate.assets.uri.lineage_namespace` for how the names follow
    the OpenLineage naming spec.
    """
    from openlineage.client.event_v2 import Dataset

    namespace = (asset.extra or {}).get(LINEAGE_NAMESPACE_EXTRA)
    if not isinstance(namespace, str) or not namespace:
        namespace = SCHEME
    return Dataset(namespace=namespace, name=asset_topic(asset.uri))
