"""The "Pulsar State" REST API as users meet it: a real ``airflow api-server`` with logins on,
serving the state the engine wrote (a table, views, leases, a subscription) on the embedded back
end; a user without the right to read the connection is refused; bad input is a 400 naming the
field; no route writes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

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
_PASSWORDS = {"admin": "ui-admin-" + os.urandom(6).hex(), "viewer": "ui-viewer-" + os.urandom(6).hex()}


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
    return {"rows": rows, "result": result, "plan": plan, "token": lease.token, "lag": lag}


@pytest.fixture(scope="module", params=["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AirflowProcesses, dict[str, Any]]]:
    """The engine's state (in an embedded file, or on the test broker), and a real API server
    (simple auth manager: ``admin`` with the Admin role, ``viewer`` with the Viewer role, which may
    not read connections) whose deployment defines the connection."""
    home = tmp_path_factory.mktemp("state-ui")
    (home / "dags").mkdir()
    if request.param == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
    else:
        extra = {"service_url": f"file://{home / 'state.db'}"}
    conn = json.dumps({"conn_type": "pulsarstate", "extra": extra})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", conn)
        facts = write_state(CONN_ID)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(_PASSWORDS))
    af = AirflowProcesses(
        home=home / "airflow",
        dags_folder=home / "dags",
        components=("api-server",),
        env={
            "PYTHONPATH": str(ROOT),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            # the editable install of the checkout may predate the airflow.plugins entry point:
            # load the plugin through the provider info (the other declared way)
            "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
            f"AIRFLOW_CONN_{CONN_ID.upper()}": conn,
        },
    )
    af.env.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)
    af.start()
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
    answer = admin.get(api(deployment, path), params=params, timeout=30)
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
