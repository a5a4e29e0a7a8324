"""Move a subscription's cursor to the offsets a state table recorded (exactly-once ingestion).

In an ingestion pipeline the table's record (the source offsets published with each applied
view, :meth:`~airflow_provider_pulsarstate.engine.recipes.table.StateTable.source_offsets`) is the
truth about what was consumed; the subscription's cursor only follows it, so that lag, retention
and :class:`~airflow_provider_pulsarstate.sensors.offsets.OffsetProgressSensor` see the progress.
:class:`CommitSourceOffsetsOperator` runs after the apply: killed before it, the cursor lags the
record until the next run commits, and nothing is consumed twice because runs start from the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pulsarstate.engine.errors import OffsetError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.lineage.operators import TaskLineageMixin, record_ranges
from airflow_provider_pulsarstate.operators.leases import LeaseGuardMixin
from airflow_provider_pulsarstate.plugins.links import PulsarStateSubscriptionLink, PulsarStateTableLink

if TYPE_CHECKING:
    from airflow.sdk import Context


class CommitSourceOffsetsOperator(TaskLineageMixin, LeaseGuardMixin, BaseOperator):
    """Commit ``subscription`` on ``source_topic`` to the next offsets ``table_topic`` recorded.

    Returns ``{"topic", "subscription", "committed": {partition: offset}, "previous": {...}}``
    (partitions as strings, as XCom keeps them). Idempotent: run it again, or in the next run,
    and it commits the same record. A cursor ahead of the record is moved back to it (the table
    is the truth; a warning says so); a table that recorded nothing commits nothing.

    :param table_topic: the state table fed from ``source_topic``. Templated.
    :param source_topic: the consumed topic. Templated.
    :param subscription: the durable subscription whose cursor follows the table. Templated.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    :raises AirflowFailException: the recorded offsets are outside the topic's retained range, or
        the topic or a partition is unknown (retrying cannot help).
    """

    template_fields: Sequence[str] = ("table_topic", "source_topic", "subscription")
    operator_extra_links = (PulsarStateSubscriptionLink(), PulsarStateTableLink())
    ui_color = "#e0ecd4"

    def __init__(
        self,
        *,
        table_topic: str,
        source_topic: str,
        subscription: str,
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table_topic = table_topic
        self.source_topic = source_topic
        self.subscription = subscription
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        # guarded: renewed on start and while it runs; the cursor is no state log (no fencing), and the
        # commit is idempotent: it moves the cursor to what the table recorded, whoever runs it
        with self.lease_guard(context), PulsarStateHook(self.pulsarstate_conn_id) as hook:
            source = hook.topic_name(self.source_topic)
            table = hook.get_table(self.table_topic)
            recorded = table.source_offsets(source)
            consumer = hook.get_pull_consumer(source, self.subscription)
            previous: dict[int, int | None] = {}
            try:
                for partition, offset in sorted(recorded.items()):
                    previous[partition] = consumer.committed(partition=partition)
                    if previous[partition] is not None and previous[partition] > offset:  # type: ignore[operator]
                        self.log.warning(
                            "%s partition %d: subscription %s was at %s, ahead of the table's record %d; "
                            "moving it back to the record",
                            source,
                            partition,
                            self.subscription,
                            previous[partition],
                            offset,
                        )
                    consumer.commit(offset, partition=partition)
            except OffsetError as exc:
                raise AirflowFailException(
                    f"cannot commit {self.subscription} on {source} to the offsets {table.topic} recorded {recorded}: {exc}"
                ) from exc
            if lineage := self.start_lineage(hook.get_config()):
                lineage.reads.append(table.topic)
                record_ranges(lineage, source, start=previous, end=recorded)
        if not recorded:
            self.log.info("%s records no offsets of %s yet: nothing to commit", table.topic, source)
        else:
            self.log.info(
                "subscription %s on %s committed to %s's record:\n%s",
                self.subscription,
                source,
                table.topic,
                "\n".join(f"  partition {p:>4}: {previous[p]} -> {o}" for p, o in sorted(recorded.items())),
            )
        return {
            "topic": source,
            "subscription": self.subscription,
            "committed": {str(p): o for p, o in sorted(recorded.items())},
            "previous": {str(p): o for p, o in sorted(previous.items())},
        }
