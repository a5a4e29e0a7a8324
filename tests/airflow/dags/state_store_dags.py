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


@dag(dag_id="state_store_isolation", schedule=None, catchup=False, params={"secret_ref": "", "other_run": ""})
def state_store_isolation():
    """What a task may not reach: a value shaped like a reference, a forged DB row, another task's scope."""

    def refused(fn) -> str:
        try:
            fn()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "allowed"

    @task
    def value_shaped_like_a_reference() -> dict:
        ctx = get_current_context()
        store = ctx["task_state_store"]
        store.set("looks_like_ref", {"__airflow_state_ref__": ctx["params"]["secret_ref"]})
        return {"read": store.get("looks_like_ref")}

    @task
    def forged_rows() -> dict:
        from airflow.sdk.execution_time.comms import SetTaskStateStore
        from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

        ctx = get_current_context()
        ti, store = ctx["ti"], ctx["task_state_store"]
        store.set("mine", "own value")
        forged = {"other_dag": ctx["params"]["secret_ref"]}
        # a row of this task whose reference names another key of this very task
        from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook, TaskStateScope

        mine = PulsarStateHook().get_state_store().map_key(TaskStateScope(ti.dag_id, ti.run_id, ti.task_id, -1), "mine")
        forged["other_key"] = mine
        out = {}
        for key, ref in forged.items():
            SUPERVISOR_COMMS.send(
                SetTaskStateStore(ti_id=ti.id, key=key, value={"__airflow_state_ref__": ref}, expires_at=None)
            )
            out[key] = refused(lambda key=key: out.setdefault(f"{key}-value", store.get(key)))
        return out

    @task
    def other_scopes() -> dict:
        from airflow.sdk.state import TaskScope

        from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

        ctx = get_current_context()
        ti = ctx["ti"]
        backend = PulsarStateStoreBackend()
        other = TaskScope(dag_id=ti.dag_id, run_id=ti.run_id, task_id="forged_rows", map_index=-1)
        elsewhere = TaskScope(dag_id="state_store_secret", run_id=ctx["params"]["other_run"], task_id="t", map_index=-1)
        return {
            "get": refused(lambda: backend.get(elsewhere, "password")),
            "set": refused(lambda: backend.set(other, "mine", '"overwritten"')),
            "ref": refused(lambda: backend.serialize_task_state_store_to_ref(value=1, key="mine", scope=other)),
            "delete": refused(lambda: backend.delete(other, "mine")),
            "clear": refused(lambda: backend.clear(other)),
            "own": refused(
                lambda: backend.serialize_task_state_store_to_ref(
                    value=1,
                    key="own",
                    scope=TaskScope(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=-1),
                )
            ),
        }

    value_shaped_like_a_reference() >> forged_rows() >> other_scopes()


state_store_basics()
state_store_outage()
state_store_isolation()
