"""``airflow pulsarstate xcom-show``: print the XCom values of one DAG run as the backend stored them.

Read-only: the entries of the run's map in the provider's XCom store (connection, topic and key
namespace of the ``[pulsarstate]`` section, as the workers use them), deserialized as a task
pulling them would, as one JSON list on one line::

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

    from airflow_provider_pulsarstate.hooks.provider_config import settings as provider_settings
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    settings = provider_settings()
    with PulsarStateHook(settings.conn_id).xcom_run_store(
        settings.xcom_topic, namespace=settings.key_namespace, dag_id=args.dag_id, run_id=args.run_id,
    ) as store:
        entries = store.list_run(args.dag_id, args.run_id, latest=True)
    shown = [
        {"task_id": e.task_id, "map_index": e.map_index, "key": e.key, "value": deserialize(e.record.json_value())}
        for e in entries
        if args.task_id is None or e.task_id == args.task_id
    ]
    print(json.dumps(shown, sort_keys=True, default=str), flush=True)


ARGS = (
    Arg(("--dag-id",), required=True, help="The DAG"),
    Arg(("--run-id",), required=True, help="The DAG run"),
    Arg(("--task-id",), default=None, help="Only this task's values"),
)
