"""What the embedded back end offers beyond the log contract (offsets, publishers, topic
creation, leadership, the reachability check and the async probes), so that callers ask the back
end instead of testing its type. It keeps no message ids and has no HTTP message path: those
questions get the base class's answers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.backends.embedded_check import check_embedded_file
from airflow_provider_pulsarstate.engine.config import ConnectionConfig

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.backends.base import Backend
    from airflow_provider_pulsarstate.engine.leadership import AsyncLeadershipProbe, Leadership
    from airflow_provider_pulsarstate.engine.offsets.base import AsyncOffsetProbe, OffsetLog, TopicPublisher


class EmbeddedOffers:
    """The features :class:`~airflow_provider_pulsarstate.engine.backends.embedded.EmbeddedBackend` offers."""

    if TYPE_CHECKING:
        path: Path

    @classmethod
    def from_config(cls, config: ConnectionConfig) -> Backend:
        return cls(config.embedded_path, busy_timeout=config.operation_timeout)  # type: ignore[call-arg,return-value]

    @classmethod
    def check_reachable(cls, config: ConnectionConfig) -> tuple[bool, str]:
        """The state file, when it exists, is opened read-only and read; one that does not exist
        yet is green when the first write can create it (:func:`.embedded_check.check_embedded_file`)."""
        return check_embedded_file(config)

    @classmethod
    def open_http_messages(cls, config: ConnectionConfig) -> None:
        """None: the embedded log keeps no message ids, so it has no HTTP message path."""
        return None

    @classmethod
    def open_async_offset_probe(cls, config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncOffsetProbe:
        from airflow_provider_pulsarstate.engine.offsets.embedded import EmbeddedAsyncOffsetProbe

        return EmbeddedAsyncOffsetProbe(config)

    @classmethod
    def open_async_leadership_probe(cls, config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncLeadershipProbe:
        from airflow_provider_pulsarstate.engine.leadership import EmbeddedAsyncLeadershipProbe

        return EmbeddedAsyncLeadershipProbe(config)

    def open_offset_log(self, topic: str, **options: Any) -> OffsetLog:
        from airflow_provider_pulsarstate.engine.offsets.embedded import EmbeddedOffsetLog

        return EmbeddedOffsetLog(self, topic, **options)  # type: ignore[arg-type]

    def open_publisher(
        self, topic: str, *, batching: bool = True, chunking: bool = False, create: bool = False
    ) -> TopicPublisher:
        from airflow_provider_pulsarstate.engine.offsets.embedded import EmbeddedTopicPublisher

        return EmbeddedTopicPublisher(self, topic, create=create)  # type: ignore[arg-type]

    def create_topic(self, topic: str, *, partitions: int = 0) -> None:
        from airflow_provider_pulsarstate.engine.offsets.embedded import create_embedded_topic

        create_embedded_topic(self, topic, partitions=partitions)  # type: ignore[arg-type]

    def delete_topic_if_last(self, topic: str, last: bytes | None, *, timeout: float) -> bool:
        from airflow_provider_pulsarstate.engine.offsets.embedded import delete_embedded_topic_if_last

        return delete_embedded_topic_if_last(self, topic, last)  # type: ignore[arg-type]

    def read_leadership(self, topic: str) -> list[Leadership]:
        from airflow_provider_pulsarstate.engine.leadership import embedded_leadership

        return embedded_leadership(self, topic)
