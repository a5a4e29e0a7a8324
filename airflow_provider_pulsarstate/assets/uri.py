"""The ``pulsar`` asset URI scheme: ``pulsar://<tenant>/<namespace>/<topic>`` names one Pulsar topic.

Registered under ``asset-uris`` in the provider info, so Airflow calls :func:`sanitize_uri` on every
``Asset("pulsar://...")`` a DAG file builds: a malformed URI fails the DAG's parse with an
:class:`~airflow_provider_pulsarstate.engine.errors.AssetURIError` naming the URI. The form is always
the full one: a short name (``pulsar://prices``) depends on a connection's tenant and namespace,
which a DAG file cannot know, so it is refused rather than guessed. A state table is an asset of
this scheme (its topic). Nothing here imports Airflow.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import AssetURIError

SCHEME = "pulsar"
_NAME = re.compile(r"[A-Za-z0-9_.=:-]+")
_PARTITION = re.compile(r"-partition-\d+$")
_PERSISTENT = "persistent://"
LINEAGE_NAMESPACE_EXTRA = "pulsarstate_lineage_namespace"
"""An asset extra naming the OpenLineage namespace of the asset's broker (set by hook lineage)."""


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """The canonical form of a ``pulsar://`` asset URI (Airflow's ``asset-uris`` handler).

    Airflow has already lower-cased the scheme, dropped the fragment and trailing slashes.
    Canonical: ``pulsar://<tenant>/<namespace>/<topic>``, each part non-empty and made of
    ``[A-Za-z0-9_.=:-]``, no port, user, query or partition suffix (an asset is the whole topic).

    :raises AssetURIError: anything else; the message names the URI and the problem.
    """
    # as written (geturl() would drop an empty authority's "//")
    shown = f"{uri.scheme}://{uri.netloc}{uri.path.rstrip('/')}" + (f"?{uri.query}" if uri.query else "")

    def refuse(problem: str) -> AssetURIError:
        return AssetURIError(
            f"asset URI {shown!r} {problem}; write pulsar://<tenant>/<namespace>/<topic>, "
            "e.g. pulsar://public/default/prices",
            uri=shown,
        )

    if uri.username is not None or uri.password is not None or ":" in uri.netloc:
        raise refuse("names a broker (host, port or user): an asset URI names a topic, not where it is served")
    if uri.query:
        raise refuse(f"has a query ({uri.query!r}), which means nothing here")
    tenant = uri.netloc
    rest = [part for part in uri.path.split("/")[1:]] if uri.path not in ("", "/") else []
    if not tenant:
        raise refuse("has no tenant")
    if not rest:
        raise refuse(f"is a short name ({tenant!r}): the tenant and namespace must be given")
    if len(rest) == 1:
        raise refuse("has no topic (only a tenant and a namespace)")
    if len(rest) > 2:
        raise refuse(f"has {len(rest) + 1} path segments, not 3")
    for label, part in (("tenant", tenant), ("namespace", rest[0]), ("topic", rest[1])):
        if not _NAME.fullmatch(part):
            raise refuse(f"has an invalid {label} {part!r} (allowed: letters, digits and _ . = : -)")
    if _PARTITION.search(rest[1]):
        raise refuse(f"names one partition ({rest[1]!r}): an asset is the whole topic")
    return uri._replace(scheme=SCHEME, netloc=tenant, path=f"/{rest[0]}/{rest[1]}", query="", fragment="")


def topic_asset_uri(topic: str) -> str:
    """``pulsar://t/n/x`` for the full topic name ``persistent://t/n/x`` (what hooks return).

    :raises AssetURIError: ``topic`` is not a full ``persistent://tenant/namespace/topic`` name.
    """
    if not topic.startswith(_PERSISTENT):
        raise AssetURIError(
            f"topic {topic!r} is not a full persistent://tenant/namespace/topic name "
            "(resolve short names with the hook's topic_name first)",
            uri=topic,
        )
    uri = f"{SCHEME}://{topic[len(_PERSISTENT) :]}"
    return sanitize_uri(urlsplit(uri)).geturl()


def asset_topic(uri: str) -> str:
    """The full topic name ``persistent://t/n/x`` a ``pulsar://t/n/x`` asset URI names.

    :raises AssetURIError: ``uri`` is not a canonical ``pulsar://`` asset URI.
    """
    parsed = urlsplit(uri)
    if parsed.scheme != SCHEME:
        raise AssetURIError(f"asset URI {uri!r} is not a pulsar:// URI", uri=uri)
    clean = sanitize_uri(parsed)
    return f"{_PERSISTENT}{clean.netloc}{clean.path}"


def lineage_namespace(config: ConnectionConfig) -> str:
    """The OpenLineage dataset namespace of the topics ``config`` reaches.

    The OpenLineage naming spec has no Pulsar entry; its streaming analogue, Kafka, is namespace
    ``kafka://{bootstrap server host}:{port}`` and name ``{topic}``. Following it, a broker is
    ``pulsar://{host}:{port}`` of the first service URL host (``pulsar+ssl`` is the same data
    source: scheme ``pulsar``, default port 6651), and the name is the full topic name
    ``persistent://{tenant}/{namespace}/{topic}``, the one name unique on a cluster. The embedded
    log has no broker: ``pulsarstate-embedded:{path}``, its state file, so two machines' embedded
    logs are never taken for one data source.
    """
    if config.is_single_host:
        return f"pulsarstate-embedded:{config.embedded_path.expanduser().resolve()}"
    parsed = urlsplit(config.url.split(",")[0])
    port = parsed.port or (6651 if parsed.scheme == "pulsar+ssl" else 6650)
    return f"{SCHEME}://{parsed.hostname}:{port}"


def dataset_identity(config: ConnectionConfig, topic: str) -> tuple[str, str]:
    """``(namespace, name)`` of a topic as an OpenLineage dataset: the name is the full topic name."""
    return lineage_namespace(config), config.topic_name(topic) if not topic.startswith(_PERSISTENT) else topic
