"""OpenLineage facets for the view, offset-commit and Spark operators and the offset sensor.

Datasets are named as :mod:`~airflow_provider_pulsarstate.assets.uri` names ``pulsar://`` assets
(namespace ``pulsar://{host}:{port}``, name ``persistent://{tenant}/{namespace}/{topic}``), so a
table's asset and its lineage are one dataset. Inputs carry the consumed offset range per
partition (:class:`~airflow_provider_pulsarstate.lineage.ol_facets.PulsarOffsetRangesInputDatasetFacet`);
a table written carries ``outputStatistics`` (its row count after the commit) and the commit's
counts (:class:`~airflow_provider_pulsarstate.lineage.ol_facets.PulsarTableCommitOutputDatasetFacet`).
A failed run reports the table as output without counts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.assets.uri import dataset_identity
from airflow_provider_pulsarstate.engine.config import ConnectionConfig

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage


def openlineage_available() -> bool:
    """Whether ``apache-airflow-providers-openlineage`` is installed and enabled (a transport is
    configured): otherwise the tasks record nothing and make no extra read for lineage."""
    try:
        if importlib.util.find_spec("airflow.providers.openlineage") is None:
            return False
        from airflow.providers.openlineage import conf as openlineage_conf

        return not openlineage_conf.is_disabled()
    except ImportError:
        return False


@dataclass
class RunLineage:
    """What a task read and wrote, recorded while it ran, turned into facets after it ends.

    :ivar config: the connection's config (names the datasets' namespace).
    :ivar reads: full topic names read whole (a table as read).
    :ivar consumed: per source topic, ``[{"partition", "start", "next"}]`` consumed.
    :ivar writes: full topic names written.
    :ivar commit: per table written, the apply result (``set, delete, unchanged, commit_offset, view_id``).
    :ivar rows: per table written, its row count after the commit.
    """

    config: ConnectionConfig
    reads: list[str] = field(default_factory=list)
    consumed: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)
    commit: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def consume(self, sources: Iterable[Mapping[str, Any]]) -> None:
        """Add source ranges as the apply result lists them (``topic, partition, start, next``)."""
        for source in sources:
            self.consumed.setdefault(source["topic"], []).append(
                {"partition": int(source["partition"]), "start": int(source["start"]), "next": int(source["next"])}
            )

    def to_openlineage(self, *, failed: bool = False) -> OperatorLineage:
        """The task's :class:`OperatorLineage`; ``failed``: outputs without statistics or counts."""
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset
        from openlineage.client.facet_v2 import output_statistics_output_dataset

        from airflow_provider_pulsarstate.lineage.ol_facets import (
            PulsarOffsetRangesInputDatasetFacet,
            PulsarTableCommitOutputDatasetFacet,
        )

        inputs: list[InputDataset] = []
        for topic, ranges in sorted(self.consumed.items()):
            namespace, name = dataset_identity(self.config, topic)
            facets: dict[str, Any] = (
                {}
                if failed
                else {
                    "pulsarOffsetRanges": PulsarOffsetRangesInputDatasetFacet(
                        ranges=sorted(ranges, key=lambda r: r["partition"])
                    )
                }
            )
            inputs.append(InputDataset(namespace=namespace, name=name, inputFacets=facets))
        for topic in self.reads:
            namespace, name = dataset_identity(self.config, topic)
            if all((d.namespace, d.name) != (namespace, name) for d in inputs):
                inputs.append(InputDataset(namespace=namespace, name=name))
        outputs: list[OutputDataset] = []
        for topic in self.writes:
            namespace, name = dataset_identity(self.config, topic)
            out_facets: dict[str, Any] = {}
            commit = self.commit.get(topic)
            if not failed and commit is not None:
                if topic in self.rows:
                    out_facets["outputStatistics"] = (
                        output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=self.rows[topic])
                    )
                out_facets["pulsarTableCommit"] = PulsarTableCommitOutputDatasetFacet(
                    commitOffset=commit.get("commit_offset"),
                    viewId=commit.get("view_id"),
                    set=int(commit.get("set", 0)),
                    delete=int(commit.get("delete", 0)),
                    unchanged=int(commit.get("unchanged", 0)),
                )
            outputs.append(OutputDataset(namespace=namespace, name=name, outputFacets=out_facets))
        return OperatorLineage(inputs=inputs, outputs=outputs)
