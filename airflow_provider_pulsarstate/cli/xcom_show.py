"""``airflow pulsarstate xcom-show``: print the XCom values of one DAG run as the backend stored them.

Read-only: the values of the run in the provider's XCom store (connection, topic and key namespace
of the ``[pulsarstate]`` section, as the workers use them), in both layouts: the last message pushed
for each row of the run's message topic (the ``messages`` layout; a value a retry replaced is not
shown), and the entries of the run's map (the ``map`` layout); deserialized as a task pulling them
would, as one JSON list on one line::

    airflow pulsarstate xcom-show --dag-id price_events_pipeline --run-id manual__2026-01-01T00:00:00+00:00
    airflow pulsarstate xcom-show --dag-id price_events_pipeline --run-id RUN --task-id report
"""

from __future__ import annotations

import argparse
import json

from airflow.cli.cli_config import Arg


def xcom_show(args: argparse.Namespace) -> None:
    """The command: ``[{"task_id", "map_index", "key", "value"}, ...]`` ordered by task, map index and key."""
    from airflow.sdk.serde import deserialize

    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
    from airflow_provider_pulsarstate.provider_settings import settings as provider_settings

    settings = provider_settings()
    hook = PulsarStateHook(settings.conn_id)
    rows: dict[tuple[str, int, str], str] = {}
    with hook.xcom_run_store(
        settings.xcom_topic,
        namespace=settings.key_namespace,
        dag_id=args.dag_id,
        run_id=args.run_id,
    ) as store:
        for e in store.list_run(args.dag_id, args.run_id, latest=True):
            rows[(e.task_id, e.map_index, e.key)] = e.record.json_value()
    with hook.xcom_message_log(
        settings.xcom_topic,
        namespace=settings.key_namespace,
        dag_id=args.dag_id,
        run_id=args.run_id,
    ) as messages:
        for found in messages.scan().messages:  # in push order: the last push of a row wins
            message = found.message
            if message is not None and (message.identity.dag_id, message.identity.run_id) == (args.dag_id, args.run_id):
                identity = message.identity
                rows[(identity.task_id, identity.map_index, identity.key)] = message.record.json_value()
    shown = [
        {"task_id": task_id, "map_index": map_index, "key": key, "value": deserialize(value_json)}
        for (task_id, map_index, key), value_json in sorted(rows.items())
        if args.task_id is None or task_id == args.task_id
    ]
    print(json.dumps(shown, sort_keys=True, default=str), flush=True)


ARGS = (
    Arg(("--dag-id",), required=True, help="The DAG"),
    Arg(("--run-id",), required=True, help="The DAG run"),
    Arg(("--task-id",), default=None, help="Only this task's values"),
)
