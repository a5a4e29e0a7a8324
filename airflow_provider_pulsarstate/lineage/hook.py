"""Hook-level lineage: the topics a hook opens for reading or writing, reported to Airflow's hook
lineage collector as ``pulsar://`` assets.

So a ``@task`` that uses :class:`~airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook`
directly is in the lineage too (the OpenLineage provider reads the collector when a task declares
no lineage of its own). Reporting never fails the caller: the collector is a no-op unless a lineage
reader (e.g. the OpenLineage provider) is installed and enabled.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from airflow_provider_pulsarstate.assets.uri import LINEAGE_NAMESPACE_EXTRA, lineage_namespace, topic_asset_uri
from airflow_provider_pulsarstate.engine.config import ConnectionConfig

log = logging.getLogger(__name__)


def report_topic(hook: Any, config: ConnectionConfig, topic: str, *, direction: Literal["input", "output"]) -> None:
    """Report ``topic`` (a full ``persistent://`` name) as read (``input``) or written (``output``) by ``hook``.

    The asset's extra carries the dataset namespace of ``config``: the converter then names the
    dataset on the hook's own connection, without looking one up after the task.
    """
    try:
        from airflow.sdk.lineage import get_hook_lineage_collector

        collector = get_hook_lineage_collector()
        add = collector.add_input_asset if direction == "input" else collector.add_output_asset
        add(context=hook, uri=topic_asset_uri(topic), asset_extra={LINEAGE_NAMESPACE_EXTRA: lineage_namespace(config)})
    except Exception:  # lineage is best effort: the hook's own work must not depend on it
        log.debug("hook lineage for %s (%s) not reported", topic, direction, exc_info=True)
