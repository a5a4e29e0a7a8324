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
    asset_topic,
    dataset_identity,
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
    """The OpenLineage dataset of a ``pulsar://`` asset, on the broker of ``pulsarstate_default``.

    Namespace ``pulsar://{host}:{port}`` and name ``persistent://{tenant}/{namespace}/{topic}``
    (the OpenLineage naming spec for Pulsar), so the asset and the operators' own lineage name
    one dataset. Without that connection: the embedded log (see
    :func:`~airflow_provider_pulsarstate.assets.uri.lineage_namespace`). An asset reported by a
    hook carries its connection's namespace in its extra, and no connection is looked up.
    """
    from openlineage.client.event_v2 import Dataset

    topic = asset_topic(asset.uri)
    namespace = (asset.extra or {}).get(LINEAGE_NAMESPACE_EXTRA)
    if not isinstance(namespace, str) or not namespace:
        from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

        namespace, _ = dataset_identity(PulsarStateHook().get_config(), topic)
    return Dataset(namespace=namespace, name=topic)
