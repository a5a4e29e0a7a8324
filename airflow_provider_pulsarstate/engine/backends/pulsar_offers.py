"""What a Pulsar back end offers beyond the log contract (offsets, publishers, topic creation,
leadership, message reads, the reachability check and the async probes), so that callers ask
the back end instead of testing its type."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url

if TYPE_CHECKING:
    import pulsar

    from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin
    from airflow_provider_pulsarstate.engine.backends.base import Backend
    from airflow_provider_pulsarstate.engine.leadership import AsyncLeadershipProbe, Leadership
    from airflow_provider_pulsarstate.engine.offsets.base import AsyncOffsetProbe, OffsetLog, TopicPublisher
    from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PulsarHttpMessages
    from airflow_provider_pulsarstate.engine.topic_stream import TopicMessage

log = logging.getLogger(__name__)

HEALTHCHECK_TOPIC = "__pulsarstate_healthcheck"
"""Short name of the topic the reachability check asks the partition metadata of in an empty namespace."""


class PulsarOffers:
    """The features :class:`~airflow_provider_pulsarstate.engine.backends.pulsar.PulsarBackend` offers."""

    if TYPE_CHECKING:
        config: ConnectionConfig
        admin: PulsarAdmin

        @property
        def client(self) -> pulsar.Client: ...

    @classmethod
    def from_config(cls, config: ConnectionConfig) -> Backend:
        return cls(config)  # type: ignore[call-arg,return-value]

    @classmethod
    def check_reachable(cls, config: ConnectionConfig) -> tuple[bool, str]:
        """The admin API lists the topics of the connection's namespace (allowed to any role that
        may produce or consume there; no super-user needed), then the binary protocol asks for the
        partition metadata of one of them, or of ``__pulsarstate_healthcheck`` in an empty
        namespace (a metadata lookup creates no topic)."""
        target = (
            f"{config.source}: Pulsar broker {redact_url(config.url)} (admin {redact_url(config.resolved_admin_url)})"
        )
        from airflow_provider_pulsarstate.engine.backends import open_backend

        backend: Any = None
        field = "admin_url"  # the one the failing step reaches
        try:
            backend = open_backend(config)
            topics = backend.admin.namespace_topics(config.tenant, config.namespace)
            persistent = sorted(t for t in topics if t.startswith("persistent://"))
            probe = (
                persistent[0] if persistent else f"persistent://{config.tenant}/{config.namespace}/{HEALTHCHECK_TOPIC}"
            )
            field = "service_url"
            backend.client.get_topic_partitions(probe)
        except Exception as exc:
            named = "" if f"field {field!r}" in str(exc) else f" (field {field!r})"
            return False, f"{target}{named}: {type(exc).__name__}: {exc}"
        finally:
            if backend is not None:
                try:
                    backend.close()
                except Exception:
                    log.debug("closing the back end after the reachability check failed", exc_info=True)
        return True, f"Connected to {target}, namespace {config.tenant}/{config.namespace} ({len(topics)} topics)"

    @classmethod
    def open_async_offset_probe(cls, config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncOffsetProbe:
        from airflow_provider_pulsarstate.engine.offsets.pulsar_async import PulsarAsyncOffsetProbe

        return PulsarAsyncOffsetProbe(config, freshness=freshness)

    @classmethod
    def open_async_leadership_probe(cls, config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncLeadershipProbe:
        from airflow_provider_pulsarstate.engine.leadership import PulsarAsyncLeadershipProbe

        return PulsarAsyncLeadershipProbe(config, freshness=freshness)

    @classmethod
    def open_http_messages(cls, config: ConnectionConfig) -> PulsarHttpMessages:
        from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PulsarHttpMessages

        return PulsarHttpMessages(config)

    def open_offset_log(self, topic: str, **options: Any) -> OffsetLog:
        from airflow_provider_pulsarstate.engine.offsets.pulsar import PulsarOffsetLog

        return PulsarOffsetLog(self, topic, **options)  # type: ignore[arg-type]

    def open_publisher(
        self, topic: str, *, batching: bool = True, chunking: bool = False, create: bool = False
    ) -> TopicPublisher:
        from airflow_provider_pulsarstate.engine.offsets.pulsar import PulsarTopicPublisher

        return PulsarTopicPublisher(self, topic, batching=batching, chunking=chunking, create=create)  # type: ignore[arg-type]

    def create_topic(self, topic: str, *, partitions: int = 0) -> None:
        from airflow_provider_pulsarstate.engine.offsets.pulsar import create_pulsar_topic

        create_pulsar_topic(self, topic, partitions=partitions)  # type: ignore[arg-type]

    def delete_topic_if_last(self, topic: str, last: bytes | None, *, timeout: float) -> bool:
        from airflow_provider_pulsarstate.engine.offsets.pulsar import delete_pulsar_topic_if_last

        return delete_pulsar_topic_if_last(self, topic, last, timeout=timeout)  # type: ignore[arg-type]

    def read_leadership(self, topic: str) -> list[Leadership]:
        from airflow_provider_pulsarstate.engine.leadership import pulsar_leadership

        return pulsar_leadership(self, topic)

    def read_topic_message(self, topic: str, message_id: bytes, *, timeout: float) -> TopicMessage:
        from airflow_provider_pulsarstate.engine.topic_stream import read_topic_message

        return read_topic_message(self.client, topic, message_id, timeout=timeout)
