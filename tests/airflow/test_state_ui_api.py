"""The "Pulsar State" REST API as users meet it: a real ``airflow api-server`` with logins on,
serving the state the engine wrote (a table, views, leases, a subscription) on the embedded back
end; a user without the right to read the connection is refused; bad input is a 400 naming the
field; no route writes. The XCom and state-store maps of a run show counts and sizes to every
reader of the connection and values only to users the auth manager lets read the DAG's XComs
(a ``no-xcom`` user of :mod:`tests.airflow.xcom_auth_manager` may not)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

# the tests share the module's API servers (the fixture ``deployment``): on one xdist worker, started once
pytestmark = pytest.mark.xdist_group("state-ui-api")

ROOT = Path(__file__).resolve().parents[2]
CONN_ID = "ps_ui"
_RUN = os.urandom(4).hex()  # the shared test broker keeps topics between runs
TABLE = f"ui-prices-{_RUN}"
SOURCE = f"ui-source-{_RUN}"
SUBSCRIPTION = "ui-ingest"
LEASE = f"ui-nightly-{_RUN}"
HOLDER = "worker-ui-7"
SCRIPT_VALUE = "<script>window.__pwned = 1</script>"
N_ROWS = 130
KEY_NAMESPACE = "uitest"
DAG = f"ui_dag_{_RUN}"
OTHER_DAG = f"ui_other_{_RUN}"
RUN_ID = f"manual__2026-11-26T00:00:00+00:00_{_RUN}"
OLD_RUN_ID = f"scheduled__2026-11-25T00:00:00+00:00_{_RUN}"
ASSET = f"ui-prices-asset-{_RUN}"
N_XCOMS = 7
_PASSWORDS = {
    "admin": "ui-admin-" + os.urandom(6).hex(),
    "viewer": "ui-viewer-" + os.urandom(6).hex(),
    "operator": "ui-op-" + os.urandom(6).hex(),
    "no-xcom-op": "ui-op-" + os.urandom(6).hex(),
}


def write_maps(hook: Any) -> dict[str, Any]:
    """A run's XComs in its run map (``xcom_layout = map``) with one key of another run slipped in
    (which must show nowhere), its task state, and an asset's state."""
    from airflow_provider_pulsarstate.engine.recipes.state_store import AssetStateScope, TaskStateScope

    texts = {}
    with hook.xcom_run_store("airflow-xcom", namespace=KEY_NAMESPACE, dag_id=DAG, run_id=RUN_ID) as store:
        for i in range(N_XCOMS):
            text = json.dumps({"rows": i, "note": SCRIPT_VALUE if i == 0 else f"batch {i}"})
            store.put(DAG, RUN_ID, "extract", i, "return_value", text, type_name="dict", try_number=1)
            texts[i] = text
        store.put(OTHER_DAG, "foreign-run", "t", -1, "secret", json.dumps("not yours"), type_name="str", try_number=1)
        xcom_topic = store.topic
    state = hook.get_state_store(namespace=KEY_NAMESPACE)
    state.set(TaskStateScope(DAG, RUN_ID, "extract"), "job_id", {"id": 42})
    state.set(TaskStateScope(DAG, RUN_ID, "load", 3), "cursor", "c-9")
    state.set(AssetStateScope(ASSET), "watermark", "2026-11-25")
    return {"xcom_bytes": sum(len(t) for t in texts.values()), "xcom_topic": xcom_topic}


def add_dag_runs(db: Path) -> None:
    """Rows of the API server's dag_run table for the DAG (the runs the maps tab lists)."""
    with sqlite3.connect(db) as conn:
        for run_id in (OLD_RUN_ID, RUN_ID):
            conn.execute(
                "INSERT INTO dag_run (dag_id, run_id, run_type, run_after, state, clear_number, span_status) "
                "VALUES (?, ?, 'manual', CURRENT_TIMESTAMP, 'success', 0, 'not_started')",
                (DAG, run_id),
            )


def write_state(conn_id: str) -> dict[str, Any]:
    """What the example pipeline leaves behind, written through the hook: a table with one
    applied view and one open sealed view (which would delete most rows), a held lease and a
    subscription that committed part of its source. Returns the figures the page must show."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with PulsarStateHook(conn_id) as hook:
        table = hook.get_table(TABLE)
        for i in range(N_ROWS):
            table.put(f"sku-{i:04d}", {"price": i, "currency": "EUR"})
        table.put("zz-script", {"note": SCRIPT_VALUE})
        applied = table.create_view(view_id="ui-applied", scope_prefix="sku-000")
        with table.stager(applied.view_id) as stager:
            for i in range(10):
                stager.set(f"sku-{i:04d}", {"price": i + (1 if i < 4 else 0), "currency": "EUR"})
        table.seal(applied.view_id, stagers=[stager])
        result = table.apply(applied.view_id)
        pending = table.create_view(view_id="ui-pending", scope_prefix="sku-")
        with table.stager(pending.view_id) as stager:
            for i in range(20):
                stager.set(f"sku-{i:04d}", {"price": i, "currency": "EUR"})
        table.seal(pending.view_id, stagers=[stager])
        plan = table.plan(pending.view_id)
        rows = table.size(latest=True)

        lease = hook.get_leases().acquire(LEASE, HOLDER, ttl=3600)

        hook.create_topic(SOURCE)
        publisher = hook.get_publisher(SOURCE)
        for i in range(12):
            publisher.send(f"m{i}".encode())
        publisher.flush(timeout=30)
        consumer = hook.get_pull_consumer(SOURCE, SUBSCRIPTION)
        consumer.commit(5)
        lag = sum(consumer.lag().values())
        maps = write_maps(hook)
    return {"rows": rows, "result": result, "plan": plan, "token": lease.token, "lag": lag, **maps}


@contextmanager
def as_deployment(conn: str) -> Iterator[None]:
    """This process sees the deployment's connection ``CONN_ID`` (``conn``, JSON) and key namespace
    while the block writes through the hook; the process-wide maps are closed on both sides."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import close_shared_state_maps

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", conn)
        mp.setenv("AIRFLOW__PULSARSTATE__KEY_NAMESPACE", KEY_NAMESPACE)
        close_shared_state_maps()
        try:
            yield
        finally:
            close_shared_state_maps()


def api_server(
    home: Path, conn: str, *, env: Mapping[str, str] | None = None, metadata_db: Path | None = None
) -> AirflowProcesses:
    """A real API server, not started yet (AIRFLOW_HOME ``home/airflow``; simple auth manager:
    ``admin`` with the Admin role, ``viewer`` with the Viewer role, which may not read connections,
    ``no-xcom-op`` who may not read XComs) whose deployment defines ``CONN_ID`` as ``conn`` and no
    ``pulsarstate_default``; its metadata DB a copy of ``metadata_db`` (the run's migrated one)."""
    (home / "dags").mkdir(exist_ok=True)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(_PASSWORDS))
    af = AirflowProcesses(
        home=home / "airflow",
        dags_folder=home / "dags",
        components=("api-server",),
        metadata_db=metadata_db,
        env={
            "PYTHONPATH": str(ROOT),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer,operator:op,no-xcom-op:op",
            "AIRFLOW__CORE__AUTH_MANAGER": "tests.airflow.xcom_auth_manager.XComRestrictedAuthManager",
            "AIRFLOW__PULSARSTATE__KEY_NAMESPACE": KEY_NAMESPACE,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            # the editable install of the checkout may predate the airflow.plugins entry point:
            # load the plugin through the provider info (the other declared way)
            "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
            f"AIRFLOW_CONN_{CONN_ID.upper()}": conn,
            **(env or {}),
        },
    )
    af.env.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)
    return af


@pytest.fixture(scope="module", params=["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, migrated_db: Path
) -> Iterator[tuple[AirflowProcesses, dict[str, Any]]]:
    """The engine's state (in an embedded file, or on the test broker), and a real API server
    (:func:`api_server`) whose deployment defines the connection."""
    home = tmp_path_factory.mktemp("state-ui")
    if request.param == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
    else:
        extra = {"service_url": f"file://{home / 'state.db'}"}
    conn = json.dumps({"conn_type": "pulsarstate", "extra": extra})
    with as_deployment(conn):
        facts = write_state(CONN_ID)
    af = api_server(home, conn, metadata_db=migrated_db)
    af.start()
    add_dag_runs(home / "airflow" / "airflow.db")
    try:
        yield af, facts
    finally:
        af.stop()


def login(af: AirflowProcesses, user: str) -> requests.Session:
    answer = requests.post(
        af.api_url + "/auth/token", json={"username": user, "password": _PASSWORDS[user]}, timeout=30
    )
    assert answer.status_code == 201, answer.text
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {answer.json()['access_token']}"
    return session


@pytest.fixture(scope="module")
def admin(deployment: tuple[AirflowProcesses, dict[str, Any]]) -> Iterator[requests.Session]:
    with login(deployment[0], "admin") as session:
        yield session


def api(deployment: tuple[AirflowProcesses, dict[str, Any]], path: str, conn_id: str = CONN_ID) -> str:
    return f"{deployment[0].api_url}/pulsarstate/api/connections/{conn_id}{path}"


def test_the_plugin_is_registered(deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session) -> None:
    plugins = admin.get(deployment[0].api_url + "/api/v2/plugins", timeout=30).json()["plugins"]
    ours = [p for p in plugins if p["name"] == "pulsarstate"]
    assert ours, plugins
    assert [v["name"] for v in ours[0]["external_views"]] == ["Pulsar State"]
    assert ours[0]["fastapi_apps"][0]["url_prefix"] == "/pulsarstate"


def test_table_summary_and_rows(deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session) -> None:
    facts = deployment[1]
    summary = admin.get(api(deployment, "/table"), params={"topic": TABLE}, timeout=60)
    assert summary.status_code == 200, summary.text
    s = summary.json()
    assert s["topic"] == f"persistent://public/default/{TABLE}"
    assert s["rows"] == facts["rows"] == N_ROWS + 1
    assert s["log_length"] >= N_ROWS + 1 and s["last_commit_offset"] == s["log_length"] - 1
    assert s["last_commit_time"] > time.time() - 3600
    assert s["writer"]["held"] is False  # the writing process is gone
    assert s["open_views"] == 1

    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = admin.get(
            api(deployment, "/table/rows"),
            params={"topic": TABLE, "prefix": "sku-", "limit": 50, **({"cursor": cursor} if cursor else {})},
            timeout=30,
        )
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["rows"]) <= 50
        seen += [r["key"] for r in body["rows"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(f"sku-{i:04d}" for i in range(N_ROWS))
    script = admin.get(api(deployment, "/table/rows"), params={"topic": TABLE, "prefix": "zz"}, timeout=30).json()
    assert script["rows"] == [{"key": "zz-script", "value": {"note": SCRIPT_VALUE}}]


def test_views_with_results_and_a_plan(
    deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session
) -> None:
    facts = deployment[1]
    answer = admin.get(api(deployment, "/table/views"), params={"topic": TABLE}, timeout=60)
    assert answer.status_code == 200, answer.text
    views = {v["view_id"]: v for v in answer.json()["views"]}
    applied, pending = views["ui-applied"], views["ui-pending"]
    assert applied["state"] == "applied"
    assert (
        (applied["result"]["set"], applied["result"]["delete"], applied["result"]["unchanged"])
        == (facts["result"].set, facts["result"].delete, facts["result"].unchanged)
        == (4, 0, 6)
    )
    assert pending["state"] == "open" and pending["sealed"] and pending["staged_rows"] == 20
    plan = pending["plan"]
    assert (plan["set"], plan["delete"], plan["unchanged"]) == (
        facts["plan"].set,
        facts["plan"].delete,
        facts["plan"].unchanged,
    )
    assert plan["delete"] == N_ROWS - 20
    # planning published nothing: the table still has every row, the view is still open
    assert admin.get(api(deployment, "/table"), params={"topic": TABLE}, timeout=30).json()["rows"] == N_ROWS + 1
    again = admin.get(api(deployment, "/table/views"), params={"topic": TABLE}, timeout=60).json()
    assert {v["view_id"]: v["state"] for v in again["views"]}["ui-pending"] == "open"


def test_leases_and_subscription(deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session) -> None:
    facts = deployment[1]
    leases = admin.get(api(deployment, "/leases"), timeout=60)
    assert leases.status_code == 200, leases.text
    (lease,) = [item for item in leases.json()["leases"] if item["name"] == LEASE]
    assert lease["holder"] == HOLDER and lease["token"] == facts["token"]
    assert 0 < lease["time_left"] <= 3600

    sub = admin.get(
        api(deployment, "/subscription"), params={"topic": SOURCE, "subscription": SUBSCRIPTION}, timeout=60
    )
    assert sub.status_code == 200, sub.text
    body = sub.json()
    assert body["total_lag"] == facts["lag"] > 0
    (partition,) = body["partitions"]
    assert partition["committed"] == 5 and partition["end"] - 5 == partition["lag"] == facts["lag"]


def test_a_role_without_connection_access_is_refused(deployment: tuple[AirflowProcesses, dict[str, Any]]) -> None:
    with login(deployment[0], "viewer") as viewer:
        for path, params in (
            ("/table", {"topic": TABLE}),
            ("/table/rows", {"topic": TABLE}),
            ("/leases", {}),
            ("/table/views", {"topic": TABLE}),
            ("/topics", {}),
        ):
            answer = viewer.get(api(deployment, path), params=params, timeout=30)
            assert answer.status_code == 403, (path, answer.status_code, answer.text)
    anonymous = requests.get(api(deployment, "/table"), params={"topic": TABLE}, timeout=30)
    assert anonymous.status_code in (401, 403)


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/table", {"topic": "persistent://other-tenant/ns/prices"}, "topic"),
        ("/table", {"topic": "a/b"}, "topic"),
        ("/table", {"topic": "non-persistent://public/default/x"}, "topic"),
        ("/table/rows", {"topic": TABLE, "limit": 0}, "limit"),
        ("/table/rows", {"topic": TABLE, "limit": 100000}, "limit"),
        ("/table/rows", {"topic": TABLE, "prefix": "sku-\x00"}, "prefix"),
        ("/table/rows", {"topic": TABLE, "prefix": "x" * 600}, "prefix"),
        ("/table/rows", {"topic": TABLE, "prefix": "sku-", "cursor": "aaa"}, "cursor"),
        ("/subscription", {"topic": SOURCE, "subscription": ""}, "subscription"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    deployment: tuple[AirflowProcesses, dict[str, Any]],
    admin: requests.Session,
    path: str,
    params: dict[str, Any],
    field: str,
) -> None:
    answer = admin.get(api(deployment, path.format(dag=DAG)), params=params, timeout=30)
    assert answer.status_code == 400, (answer.status_code, answer.text)
    assert answer.json()["detail"].startswith(field + ":"), answer.text


def test_missing_things_are_404_not_the_embedded_default(
    deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session
) -> None:
    missing_conn = admin.get(
        api(deployment, "/table", conn_id="pulsarstate_default"), params={"topic": TABLE}, timeout=30
    )
    assert missing_conn.status_code == 404 and "pulsarstate_default" in missing_conn.text
    missing_topic = admin.get(api(deployment, "/table"), params={"topic": "no-such-table"}, timeout=30)
    assert missing_topic.status_code == 404 and "no-such-table" in missing_topic.text
    # asking created nothing
    topics = admin.get(api(deployment, "/topics"), params={"prefix": "no-such"}, timeout=30).json()
    assert topics["topics"] == []


def test_every_route_is_read_only(deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session) -> None:
    from airflow_provider_pulsarstate.plugins.state_api import create_app

    methods = {m for route in create_app().routes for m in getattr(route, "methods", set())}
    assert methods <= {"GET", "HEAD"}, methods
    answer = admin.post(api(deployment, "/table"), params={"topic": TABLE}, timeout=30)
    assert answer.status_code == 405


def test_lease_transitions(deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session) -> None:
    answer = admin.get(api(deployment, "/leases/transitions"), params={"name": LEASE}, timeout=60)
    assert answer.status_code == 200, answer.text
    (acquired,) = answer.json()["transitions"]
    assert (acquired["event"], acquired["holder"], acquired["token"], acquired["ttl"]) == (
        "acquired",
        HOLDER,
        deployment[1]["token"],
        3600,
    )
    assert acquired["at"] > time.time() - 3600
    every = admin.get(api(deployment, "/leases/transitions"), timeout=60).json()["transitions"]
    assert acquired in every


def test_map_counts_and_sizes_for_every_reader_of_the_connection(
    deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session
) -> None:
    facts = deployment[1]
    with login(deployment[0], "no-xcom-op") as restricted:
        for session in (admin, restricted):
            runs = session.get(api(deployment, f"/maps/dags/{DAG}/runs"), timeout=60)
            assert runs.status_code == 200, runs.text
            body = runs.json()
            assert [r["run_id"] for r in body["runs"]] == [RUN_ID, OLD_RUN_ID]  # newest first
            newest, old = body["runs"]
            assert newest["xcom"]["entries"] == N_XCOMS and newest["xcom"]["bytes"] > facts["xcom_bytes"]
            assert newest["task_state"]["entries"] == 2
            assert old["xcom"] == {"entries": 0, "bytes": 0} and old["task_state"]["entries"] == 0
            paged = session.get(api(deployment, f"/maps/dags/{DAG}/runs"), params={"limit": 1}, timeout=60).json()
            assert [r["run_id"] for r in paged["runs"]] == [RUN_ID]
            rest = session.get(
                api(deployment, f"/maps/dags/{DAG}/runs"), params={"cursor": paged["next_cursor"]}, timeout=60
            ).json()
            assert [r["run_id"] for r in rest["runs"]] == [OLD_RUN_ID] and rest["next_cursor"] is None

            run = session.get(api(deployment, f"/maps/dags/{DAG}/run"), params={"run_id": RUN_ID}, timeout=60).json()
            assert run["xcom"]["topic"] == facts["xcom_topic"] and run["xcom"]["exists"]
            assert run["xcom"]["tasks"] == {"extract": {"entries": N_XCOMS, "bytes": run["xcom"]["bytes"]}}
            assert set(run["task_state"]["tasks"]) == {"extract", "load"}
            assert run["xcom_messages"]["exists"] is False

            entries = session.get(
                api(deployment, f"/maps/dags/{DAG}/run/entries"), params={"run_id": RUN_ID, "limit": 5}, timeout=60
            ).json()
            assert [(e["task_id"], e["map_index"], e["key"]) for e in entries["rows"]] == [
                ("extract", i, "return_value") for i in range(5)
            ]
            assert all("value" not in e and e["bytes"] > 0 and e["type"] == "dict" for e in entries["rows"])
            more = session.get(
                api(deployment, f"/maps/dags/{DAG}/run/entries"),
                params={"run_id": RUN_ID, "cursor": entries["next_cursor"]},
                timeout=60,
            ).json()
            assert [e["map_index"] for e in more["rows"]] == [5, 6] and more[
                "next_cursor"
            ] is None  # never the foreign key
            state = session.get(
                api(deployment, f"/maps/dags/{DAG}/run/entries"),
                params={"run_id": RUN_ID, "store": "task_state"},
                timeout=60,
            ).json()
            assert [(e["task_id"], e["map_index"], e["key"]) for e in state["rows"]] == [
                ("extract", -1, "job_id"),
                ("load", 3, "cursor"),
            ]
            asset = session.get(api(deployment, "/maps/asset"), params={"name": ASSET}, timeout=60).json()
            assert asset["exists"] and asset["entries"] == 1


def test_values_only_for_users_who_may_read_the_dags_xcoms(
    deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session
) -> None:
    params = {"run_id": RUN_ID, "limit": 2}
    with login(deployment[0], "operator") as allowed:
        for session in (admin, allowed):
            values = session.get(api(deployment, f"/maps/dags/{DAG}/run/values"), params=params, timeout=60)
            assert values.status_code == 200, values.text
            rows = values.json()["rows"]
            assert rows[0]["value"] == {"rows": 0, "note": SCRIPT_VALUE} and rows[1]["value"]["rows"] == 1
            state = session.get(
                api(deployment, f"/maps/dags/{DAG}/run/values"), params={**params, "store": "task_state"}, timeout=60
            ).json()
            assert [json.loads(r["value"]) for r in state["rows"]] == [{"id": 42}, "c-9"]
            asset = session.get(api(deployment, "/maps/asset/values"), params={"name": ASSET}, timeout=60).json()
            assert [(r["key"], json.loads(r["value"])) for r in asset["rows"]] == [("watermark", "2026-11-25")]
    with login(deployment[0], "no-xcom-op") as refused:
        for store in ("xcom", "task_state"):
            answer = refused.get(
                api(deployment, f"/maps/dags/{DAG}/run/values"), params={**params, "store": store}, timeout=60
            )
            assert answer.status_code == 403, (store, answer.text)
            assert "value" not in answer.text.replace("values", "")
    with login(deployment[0], "viewer") as viewer:  # may read XComs, not the connection
        answer = viewer.get(api(deployment, f"/maps/dags/{DAG}/run/values"), params=params, timeout=60)
        assert answer.status_code == 403
        assert viewer.get(api(deployment, f"/maps/dags/{DAG}/runs"), timeout=60).status_code == 403


def test_maps_are_reached_only_from_their_own_ids(
    deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session
) -> None:
    facts = deployment[1]
    probes = (
        (OTHER_DAG, "foreign-run"),  # its key sits in DAG's run map, but it has no map of its own
        (DAG, facts["xcom_topic"]),  # a topic name is just an unknown run id
        (DAG, "../" + RUN_ID),
        (OTHER_DAG, RUN_ID),
    )
    for dag_id, run_id in probes:
        answer = admin.get(api(deployment, f"/maps/dags/{dag_id}/run/values"), params={"run_id": run_id}, timeout=60)
        assert answer.status_code == 404, (dag_id, run_id, answer.text)
        summary = admin.get(api(deployment, f"/maps/dags/{dag_id}/run"), params={"run_id": run_id}, timeout=60)
        assert summary.json()["xcom"]["exists"] is False and summary.json()["xcom"]["entries"] == 0
    # a cursor cannot leave the run's own key prefix
    crafted = admin.get(
        api(deployment, f"/maps/dags/{DAG}/run/values"),
        params={"run_id": RUN_ID, "cursor": "../../" + OTHER_DAG},
        timeout=60,
    ).json()
    assert {r["key"] for r in crafted["rows"]} <= {"return_value"}
    missing_asset = admin.get(api(deployment, "/maps/asset/entries"), params={"name": "no-such-asset"}, timeout=60)
    assert missing_asset.status_code == 404
    # nothing was created: no map of any kind exists for a probed id (the broker is shared, so
    # other tests' topics may come and go meanwhile; only the names these reads could make count)
    topics = {t.rsplit("/", 1)[-1] for t in admin.get(api(deployment, "/topics"), timeout=60).json()["topics"]}
    written = _probe_topics([(DAG, RUN_ID)], assets=[ASSET]) & topics  # the names are computed right
    assert len(written) == 3 and facts["xcom_topic"].rsplit("/", 1)[-1] in written, written
    assert not topics & _probe_topics(probes, assets=["no-such-asset"])


def _probe_topics(runs: Iterable[tuple[str, str]], *, assets: list[str]) -> set[str]:
    """Every map topic a read of these runs or assets would create, of every kind and base topic."""
    from airflow_provider_pulsarstate.engine.recipes.scope_topics import ASSET_KIND, RUN_KIND, scope_topic
    from airflow_provider_pulsarstate.engine.recipes.xcom_messages import MESSAGE_KIND

    names = set()
    for base in ("airflow-xcom", "airflow-state-store"):
        for kind in (RUN_KIND, MESSAGE_KIND, ASSET_KIND):
            names |= {scope_topic(base, KEY_NAMESPACE, kind, dag_id, run_id) for dag_id, run_id in runs}
            names |= {scope_topic(base, KEY_NAMESPACE, kind, asset) for asset in assets}
    return names


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/maps/dags/{dag}/run/entries", {"run_id": RUN_ID, "store": "bogus"}, "store"),
        ("/maps/dags/{dag}/run/entries", {"run_id": RUN_ID, "limit": 0}, "limit"),
        ("/maps/dags/{dag}/run/entries", {"run_id": ""}, "run_id"),
        ("/maps/dags/{dag}/run", {"run_id": "x\x01y"}, "run_id"),
        ("/maps/dags/{dag}/run", {"run_id": "r" * 300}, "run_id"),
        ("/maps/dags/{dag}/runs", {"limit": 1000}, "limit"),
        ("/maps/dags/{dag}/runs", {"cursor": 0}, "cursor"),
        ("/maps/asset", {"name": " "}, "name"),
        ("/leases/transitions", {"limit": 0}, "limit"),
    ],
)
def test_bad_map_input_is_a_400_naming_the_field(
    deployment: tuple[AirflowProcesses, dict[str, Any]],
    admin: requests.Session,
    path: str,
    params: dict[str, Any],
    field: str,
) -> None:
    answer = admin.get(api(deployment, path.format(dag=DAG)), params=params, timeout=30)
    assert answer.status_code == 400, (answer.status_code, answer.text)
    assert answer.json()["detail"].startswith(field + ":"), answer.text


def test_leadership_of_any_topic(deployment: tuple[AirflowProcesses, dict[str, Any]], admin: requests.Session) -> None:
    for topic in (TABLE, SOURCE):
        answer = admin.get(api(deployment, "/leadership"), params={"topic": topic}, timeout=60)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["topic"].endswith("/" + topic) and body["held"] is False  # the writing process is gone
        (partition,) = body["partitions"]
        if topic == TABLE:  # its writer held it exclusively once: the epoch says so
            assert partition["epoch"] is not None and partition["epoch"] >= 0
    assert admin.get(api(deployment, "/leadership"), params={"topic": "no-such-topic"}, timeout=60).status_code == 404
