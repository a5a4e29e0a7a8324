"""The OpenLineage methods the operators and the sensor share.

A task records what it read and wrote in a :class:`~airflow_provider_pulsarstate.lineage.facets.RunLineage`
while it runs (only when the OpenLineage provider is installed: otherwise nothing is recorded and
no extra read is made); the OpenLineage listener, in the same task process, then asks
``get_openlineage_facets_on_complete`` / ``_on_failure`` for the facets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.lineage.facets import RunLineage, openlineage_available

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage


class TaskLineageMixin:
    """Adds the OpenLineage methods; the task calls :meth:`start_lineage` once it knows its config."""

    _run_lineage: RunLineage | None = None

    def start_lineage(self, config: ConnectionConfig) -> RunLineage | None:
        """A fresh record for this run, or None without the OpenLineage provider (record nothing)."""
        self._run_lineage = RunLineage(config=config) if openlineage_available() else None
        return self._run_lineage

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage | None:
        """Inputs and outputs of the run, with offsets consumed and counts published."""
        return self._run_lineage.to_openlineage() if self._run_lineage is not None else None

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage | None:
        """What the run was reading and writing when it failed, without counts."""
        return self._run_lineage.to_openlineage(failed=True) if self._run_lineage is not None else None


def record_apply(lineage: RunLineage, table: Any, result: dict[str, Any]) -> None:
    """Record an apply's result: the source ranges it consumed, its counts and the table's size.

    The size is one more read of the table, made only when lineage is recorded.
    """
    lineage.consume(result.get("sources") or [])
    lineage.commit[table.topic] = result
    lineage.rows[table.topic] = table.size(latest=True)


def record_ranges(
    lineage: RunLineage, topic: str, *, start: Mapping[int, int | None] | None, end: Mapping[int, int]
) -> None:
    """Record ``[start, end)`` of each partition of ``topic`` as consumed; a partition with no start
    (no watermark or cursor yet) counts from offset 0, the topic's whole history."""
    start = start or {}
    lineage.consumed[topic] = [
        {"partition": int(p), "start": int(start.get(p) or 0), "next": int(end[p])} for p in sorted(end)
    ]


def record_job_arguments(lineage: RunLineage, config: ConnectionConfig, arguments: list[Any]) -> None:
    """Record what a view job reads, from its rendered arguments: the table (``--table-topic``)
    and the source topic (``--source-topic``). The range it consumes is the apply's to report:
    the job only stages it, and an unapplied view consumed nothing."""
    values = [str(a) for a in arguments]
    for flag in ("--source-topic", "--table-topic"):
        if flag in values[:-1]:
            lineage.reads.append(config.topic_name(values[values.index(flag) + 1]))


def record_topics(
    lineage: RunLineage, config: ConnectionConfig, *, inputs: Iterable[str] = (), outputs: Iterable[str] = ()
) -> None:
    """Record topics a task declares it reads (``inputs``) and writes (``outputs``); short names are
    placed in ``config``'s tenant and namespace."""
    lineage.reads.extend(config.topic_name(str(topic)) for topic in inputs)
    lineage.writes.extend(config.topic_name(str(topic)) for topic in outputs)
