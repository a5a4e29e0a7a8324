"""Eight mapped task instances of one run increment one asset-scoped state key at once (real processes).

``pattern=atomic``: PulsarStateHook.update_state (the map's single writer applies every +1).
``pattern=get_set``: upstream's example, ``set(key, get(key) + 1)`` through context["asset_state_store"],
with ``gap`` seconds between get and set so that the tasks' read-modify-write cycles overlap
reliably (that is what loses increments; the gap only widens the window).
A file barrier makes the eight tasks start their increments together.
"""

from __future__ import annotations

import time
from pathlib import Path

from airflow.sdk import Asset, dag, get_current_context, task

COUNTER = Asset(name="pulsarstate-counter", uri="test://pulsarstate/counter")
WORKERS = 8


@dag(
    dag_id="state_store_concurrency",
    schedule=None,
    catchup=False,
    max_active_tasks=WORKERS,
    params={"pattern": "atomic", "n": 5, "key": "n", "gap": 0.3, "barrier": ""},
)
def state_store_concurrency():
    @task(outlets=[COUNTER])
    def increment(worker: int) -> dict:
        from airflow.sdk.state import AssetScope

        from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

        ctx = get_current_context()
        p = ctx["params"]
        barrier = Path(p["barrier"])
        (barrier / f"{worker}").touch()
        deadline = time.monotonic() + 120
        while len(list(barrier.iterdir())) < WORKERS and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.time()
        store, hook = ctx["asset_state_store"], PulsarStateHook()
        for _ in range(int(p["n"])):
            if p["pattern"] == "atomic":
                hook.update_state(AssetScope(name=COUNTER.name), p["key"], lambda v: (v or 0) + 1)
                time.sleep(0.01)
            else:
                value = store.get(p["key"], 0)
                time.sleep(float(p["gap"]))
                store.set(p["key"], value + 1)
        return {"start": started, "end": time.time()}

    @task(outlets=[COUNTER])
    def total() -> int:
        return get_current_context()["asset_state_store"].get(get_current_context()["params"]["key"])

    increment.expand(worker=list(range(WORKERS))) >> total()


state_store_concurrency()
