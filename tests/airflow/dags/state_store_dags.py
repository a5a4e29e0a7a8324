"""Test DAGs for PulsarStateStoreBackend: task and asset state through context["task_state_store"] /
context["asset_state_store"], mapped tasks, a retry, expiry, and the hook's atomic update."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Asset, dag, get_current_context, task

STATE_ASSET = Asset(name="pulsarstate-state-asset", uri="test://pulsarstate/state-asset")


@dag(dag_id="state_store_basics", schedule=None, catchup=False, params={"tag": "t", "marker": ""})
def state_store_basics():
    @task
    def task_state(index: int) -> dict:
        store = get_current_context()["task_state_store"]
        before = store.get("k", "absent")
        store.set("k", {"index": index})
        store.set("gone", 1)
        store.delete("gone")
        store.set("short", index, retention=timedelta(seconds=1))
        return {"before": before, "k": store.get("k"), "gone": store.get("gone", "absent"), "short": store.get("short")}

    @task(outlets=[STATE_ASSET])
    def asset_state() -> dict:
        ctx = get_current_context()
        tag = ctx["params"]["tag"]
        store = ctx["asset_state_store"]
        store.set(f"{tag}-a", [1, "two"])
        store.set(f"{tag}-b", 2)
        store.delete(f"{tag}-b")
        return {"a": store.get(f"{tag}-a"), "b": store.get(f"{tag}-b", "absent")}

    @task(retries=1, retry_delay=timedelta(seconds=0))
    def retried() -> dict:
        ctx = get_current_context()
        store = ctx["task_state_store"]
        attempts = store.get("attempts", [])
        store.set("attempts", [*attempts, ctx["ti"].try_number])
        if ctx["ti"].try_number == 1:
            raise RuntimeError("first try fails on purpose")
        return {"attempts": store.get("attempts")}

    @task
    def hook_update() -> dict:
        from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

        ctx = get_current_context()
        ti = ctx["ti"]
        store = ctx["task_state_store"]
        store.set("counter", 10)
        hook = PulsarStateHook()
        for _ in range(3):
            hook.update_state(ti, "counter", lambda n: (n or 0) + 1)
        swapped = hook.compare_and_set_state(ti, "counter", 13, 100)
        refused = hook.compare_and_set_state(ti, "counter", 13, 200)
        return {"counter": store.get("counter"), "swapped": swapped, "refused": refused}

    @task
    def clear_all() -> dict:
        ctx = get_current_context()
        store = ctx["task_state_store"]
        store.set("x", 1)
        store.set("y", 2)
        store.clear()
        return {"x": store.get("x", "absent"), "y": store.get("y", "absent")}

    task_state.expand(index=[0, 1, 2])
    asset_state()
    retried()
    hook_update()
    clear_all()


@dag(dag_id="state_store_outage", schedule=None, catchup=False)
def state_store_outage():
    @task(outlets=[STATE_ASSET])
    def write_during_outage() -> None:
        get_current_context()["asset_state_store"].set("outage", 1)

    write_during_outage()


state_store_basics()
state_store_outage()
