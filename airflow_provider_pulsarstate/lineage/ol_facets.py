"""The provider's own OpenLineage dataset facets (imported only where OpenLineage is installed)."""

from __future__ import annotations

import attr
from openlineage.client.facet_v2 import InputDatasetFacet, OutputDatasetFacet

SCHEMA_BASE = "https://github.com/pulsarstate/airflow-provider-pulsarstate/blob/main/docs/lineage.md"


@attr.define
class PulsarOffsetRangesInputDatasetFacet(InputDatasetFacet):
    """The offsets a run consumed from a topic: ``[{"partition", "start", "next"}]`` per partition
    (``start`` inclusive, ``next`` exclusive, Kafka's convention)."""

    ranges: list[dict[str, int]] = attr.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_BASE}#pulsaroffsetranges"


@attr.define
class PulsarTableCommitOutputDatasetFacet(OutputDatasetFacet):
    """What one commit published to a state table: the counts of the diff, its offset and view."""

    commitOffset: int | None = attr.field(default=None)  # noqa: N815 - OpenLineage's camelCase
    viewId: str | None = attr.field(default=None)  # noqa: N815
    set: int = attr.field(default=0)
    delete: int = attr.field(default=0)
    unchanged: int = attr.field(default=0)

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_BASE}#pulsartablecommit"
