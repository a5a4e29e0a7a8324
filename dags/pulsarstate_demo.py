"""Shared state across runs and tasks: configuration, a run counter and shard assignments.

Every task talks to the same PulsarMap topics through PulsarStateHook. With no
``pulsarstate_default`` connection the state lives in the embedded log under AIRFLOW_HOME; set
``AIRFLOW_CONN_PULSARSTATE_DEFAULT='{"conn_type": "pulsarstate", "extra": {"service_url":
"pulsar://localhost:6650"}}'`` to keep it in a Pulsar broker instead: the DAG does not change.

(The main example is price_table_pipeline.py: a Spark job feeding a state table through temp views.)
"""

from __future__ import annotations

import logging

import pendulum
from airflow.sdk import dag, task

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

log = logging.getLogger(__name__)

CONFIG_TOPIC = "pulsarstate-demo-config"
ASSIGNMENT_TOPIC = "pulsarstate-demo-assignments"
WORKERS = ("worker-a", "worker-b", "worker-c")
SHARDS = 12


@dag(
    dag_id="pulsarstate_demo",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["pulsarstate", "example"],
)
def pulsarstate_demo() -> None:
    @task
    def publish_config() -> dict:
        """Seed defaults once (put_if_absent keeps what operators changed by hand)."""
        with PulsarStateHook() as hook, hook.get_map(CONFIG_TOPIC) as config:
            config.put_if_absent("batch_size", 500)
            config.put_if_absent("feature.dedupe", True)
            runs = config.update("runs", lambda k, v: (v or 0) + 1)
            return {"runs": runs, **config.to_dict()}

    @task
    def assign_shards(config: dict) -> dict:
        """Rebalance shards round-robin, rotated by run number (the puts share one group commit)."""
        offset = config["runs"] % len(WORKERS)
        with PulsarStateHook() as hook, hook.get_map(ASSIGNMENT_TOPIC) as assignments:
            pending = [
                assignments.put_async(f"shard-{shard:02d}", WORKERS[(shard + offset) % len(WORKERS)])
                for shard in range(SHARDS)
            ]
            for done in pending:  # concurrent puts share one commit; surface any failure here
                done.result()
            table = assignments.to_dict(latest=True)
        per_worker = {w: sum(1 for owner in table.values() if owner == w) for w in WORKERS}
        log.info("shard assignment\n%s", "\n".join(f"  {w:<10} {n:>3} shards" for w, n in per_worker.items()))
        return per_worker

    @task
    def report(config: dict, per_worker: dict) -> dict:
        with PulsarStateHook() as hook, hook.get_map(CONFIG_TOPIC) as cfg:
            runs = cfg.get("runs", latest=True)
        summary = {"runs": runs, "shards": sum(per_worker.values()), **per_worker}
        log.info("summary\n%s", "\n".join(f"  {k:<10} {v!s:>5}" for k, v in summary.items()))
        return summary

    config = publish_config()
    report(config, assign_shards(config))


pulsarstate_demo()
