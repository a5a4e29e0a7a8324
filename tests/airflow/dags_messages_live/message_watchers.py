"""DAGs scheduled by Pulsar topics (tests/airflow/test_message_watcher_live.py sets the env vars).

* ``on_orders_a`` / ``on_orders_b``: two watchers of one topic and subscription, one a
  PulsarMessageTrigger and one common-messaging's MessageQueueTrigger(scheme="pulsar"), differing
  only in payload encoding, so the triggerer runs one consumer for both;
* ``on_held``: a watcher whose apply function waits while a file exists (the test kills the
  triggerer in that window: the message was received, its asset event not yet stored).
"""

from __future__ import annotations

import os

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_pulsarstate.triggers.messages import PulsarMessageTrigger

SHARED_TOPIC = os.environ.get("PULSARSTATE_TEST_SHARED_TOPIC", "persistent://public/default/unset-shared")
HELD_TOPIC = os.environ.get("PULSARSTATE_TEST_HELD_TOPIC", "persistent://public/default/unset-held")
CONN = "pulsarstate_default"
common = dict(topics=SHARED_TOPIC, subscription="live-watchers", initial_position="earliest", redelivery_delay=0.5)

orders_a = Asset(
    "pulsar-orders-a",
    watchers=[
        AssetWatcher(
            name="orders_a",
            trigger=PulsarMessageTrigger(**common, payload_encoding="text"),
        )
    ],
)
orders_b = Asset(
    "pulsar-orders-b",
    watchers=[
        AssetWatcher(
            name="orders_b",
            trigger=MessageQueueTrigger(scheme="pulsar", **common, payload_encoding="base64"),
        )
    ],
)
held = Asset(
    "pulsar-held",
    watchers=[
        AssetWatcher(
            name="held",
            trigger=PulsarMessageTrigger(
                topics=HELD_TOPIC,
                subscription="live-held",
                initial_position="earliest",
                redelivery_delay=0.5,
                apply_function="tests.airflow.message_functions.hold_while_file_exists",
            ),
        )
    ],
)


@task
def show(triggering_asset_events=None) -> list:
    return [e.extra.get("payload") for events in (triggering_asset_events or {}).values() for e in events]


for dag_id, asset in (("on_orders_a", orders_a), ("on_orders_b", orders_b), ("on_held", held)):
    with DAG(dag_id, schedule=[asset], catchup=False):
        show()
