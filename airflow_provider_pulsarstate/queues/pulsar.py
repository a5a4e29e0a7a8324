"""The ``pulsar`` scheme of the common-messaging provider.

``MessageQueueTrigger(scheme="pulsar", **kwargs)`` builds a
:class:`~airflow_provider_pulsarstate.triggers.messages.PulsarMessageTrigger` from ``kwargs`` (its
serialized form is that trigger's, so an asset watcher runs our trigger in the triggerer)::

    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    trigger = MessageQueueTrigger(scheme="pulsar", topics="orders", subscription="orders-dag")
    orders = Asset("orders", watchers=[AssetWatcher(name="orders-topic", trigger=trigger)])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger


class PulsarMessageQueueProvider(BaseMessageQueueProvider):
    """Scheme ``pulsar``: messages of Pulsar topics on a durable subscription (see PulsarMessageTrigger)."""

    scheme = "pulsar"

    def trigger_class(self) -> type[BaseEventTrigger]:
        from airflow_provider_pulsarstate.triggers.messages import PulsarMessageTrigger

        return PulsarMessageTrigger
