"""The "Pulsar State" page in a real browser: headless Chromium (the system's ``chromium``, driven
by Playwright) loads it from a running ``airflow api-server`` with logins on, after the example
pipeline ``price_events_pipeline`` ran (dag.test() in a child process on the API server's
AIRFLOW_HOME and metadata DB, with a real ``spark-submit``, on the embedded default), and the test
checks what each tab shows against what that run produced: the table's rows (the plain-Python
fold of the job's own events), the published counts of its applied view (the run's ``report``
XCom), its lease's transitions and the lag of its subscription after more events were published.
The test also writes what one run cannot show: an open sealed view that would delete most of the
table, a lease still held, a row holding ``<script>`` (shown as text) and XCom / state-store maps.

One back end is enough here: the page only renders what the API returns, and
``test_state_ui_api.py`` runs the API on both. A screenshot of each tab is saved in
``$PULSARSTATE_UI_SCREENSHOTS`` (default: a temp dir); the README shows the committed ones."""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import requests

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses
from tests.airflow.dagruns import dag_bundle_env, load_job, run_pipeline_worker, worker_result
from tests.airflow.test_state_ui_api import (
    _PASSWORDS,
    ASSET,
    CONN_ID,
    DAG,
    HOLDER,
    LEASE,
    N_XCOMS,
    RUN_ID,
    SCRIPT_VALUE,
    TABLE,
    add_dag_runs,
    api_server,
    as_deployment,
    write_state,
)

EVENTS, SKUS = 400, 1500  # one small batch: the Spark job dominates the run either way
MORE_EVENTS = 37  # published after the run: the subscription's lag
PIPELINE_TABLE, PIPELINE_SOURCE, PIPELINE_SUBSCRIPTION = "price-events-table", "price-events", "price-table-ingest"
PIPELINE_LEASE = f"price-events-ingest/{PIPELINE_TABLE}"
PENDING_KEYS = 20
job = load_job("price_events_job")
# the first test's setup runs the pipeline (a spark-submit): minutes on a loaded 2-CPU machine
# the tests share the module's deployment and pipeline run (a module fixture): on one xdist worker, set up once
pytestmark = [pytest.mark.timeout(1200), pytest.mark.xdist_group("state-ui-page")]
CHROMIUM = os.environ.get("PULSARSTATE_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, migrated_db: Path
) -> Iterator[tuple[AirflowProcesses, dict[str, Any]]]:
    """A running API server whose deployment ran the example pipeline once (its state in the
    embedded default under the deployment's AIRFLOW_HOME, which ``CONN_ID`` names), then what the
    test adds: :func:`write_state`, an open sealed view of the pipeline's table keeping only
    ``PENDING_KEYS`` rows, and ``MORE_EVENTS`` new events on the pipeline's source."""
    home = tmp_path_factory.mktemp("state-ui-page")
    state_file = home / "airflow" / "pulsarstate" / "state.db"  # the pipeline's embedded default
    conn = json.dumps({"conn_type": "pulsarstate", "extra": {"service_url": f"file://{state_file}"}})
    af = api_server(home, conn, env=dag_bundle_env(), metadata_db=migrated_db)
    af.start()
    try:
        conf = {"batch": 1, "events": EVENTS, "skus": SKUS}
        started, cpu = time.monotonic(), _children_cpu()
        run = worker_result(run_pipeline_worker(conf, env=af.env))
        print(
            f"price_events_pipeline: {run['state']} in {time.monotonic() - started:.1f}s "
            f"({_children_cpu() - cpu:.1f}s CPU) {run['states']}"
        )
        assert run["state"] == "success", run["states"]
        with as_deployment(conn):
            facts = write_state(CONN_ID)
            facts.update(run=run, **_after_the_run(CONN_ID))
        add_dag_runs(home / "airflow" / "airflow.db")
        yield af, facts
    finally:
        af.stop()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _after_the_run(conn_id: str) -> dict[str, Any]:
    """Stage a view that would delete all but ``PENDING_KEYS`` rows of the pipeline's table (left
    open), publish ``MORE_EVENTS`` more events; the plan and the subscription's lag before them."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with PulsarStateHook(conn_id) as hook:
        table = hook.get_table(PIPELINE_TABLE)
        keep = sorted(table.to_dict(latest=True).items())[:PENDING_KEYS]
        pending = table.create_view(view_id="ui-pending", scope_prefix="sku-")
        with table.stager(pending.view_id) as stager:
            for key, value in keep:
                stager.set(key, value)
        table.seal(pending.view_id, stagers=[stager])
        plan = table.plan(pending.view_id)
        source = hook.topic_name(PIPELINE_SOURCE)
        consumer = hook.get_pull_consumer(source, PIPELINE_SUBSCRIPTION)
        try:
            lag_after_run = sum(consumer.lag().values())
        finally:
            consumer.close()
        publisher = hook.get_publisher(source)
        for event in job.batch_events(2, MORE_EVENTS, SKUS):
            publisher.send(job.encode(event), key=event["sku"])
        publisher.flush(timeout=60)
    return {"pipeline_plan": plan, "lag_after_run": lag_after_run}


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = Path(os.environ.get("PULSARSTATE_UI_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture(scope="module")
def page(deployment: Any) -> Iterator[Any]:
    """A logged-in browser page (the UI's ``_token`` cookie, as after a login)."""
    from playwright.sync_api import sync_playwright

    if shutil.which(CHROMIUM) is None:  # dev/bootstrap.sh installs it; a missing browser is a failure
        pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set PULSARSTATE_CHROMIUM)")
    af = deployment[0]
    token = requests.post(
        af.api_url + "/auth/token", json={"username": "admin", "password": _PASSWORDS["admin"]}, timeout=30
    ).json()["access_token"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_cookies([{"name": "_token", "value": token, "url": af.api_url}])
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.errors = errors
        try:
            yield tab
        finally:
            browser.close()


def _open(page: Any, deployment: Any, **fragment: str) -> None:
    page.goto(f"{deployment[0].api_url}/pulsarstate/#" + urlencode({"conn": CONN_ID, **fragment}))


def _token(deployment: Any, user: str) -> str:
    af = deployment[0]
    answer = requests.post(
        af.api_url + "/auth/token", json={"username": user, "password": _PASSWORDS[user]}, timeout=30
    )
    return str(answer.json()["access_token"])


def test_tables_tab_shows_the_pipelines_table_and_the_apply_chart(page: Any, deployment: Any, shots: Path) -> None:
    expected = job.fold(job.batch_events(1, EVENTS, SKUS))
    assert deployment[1]["run"]["xcoms"]["report"]["table_rows"] == len(expected)
    _open(page, deployment, tab="tables", topic=PIPELINE_TABLE)
    page.wait_for_selector("#summary")
    assert page.inner_text("#summary [data-field='rows']") == str(len(expected))
    assert page.inner_text("#summary [data-field='writer']") == "not held"
    page.wait_for_selector("#rows tr:nth-child(2)")
    assert page.locator("#rows tr").count() == 51  # a header and one page of 50
    keys = sorted(expected)
    assert page.locator("#rows tr:nth-child(2) td").first.inner_text() == keys[0]
    assert json.loads(page.locator("#rows tr:nth-child(2) td").nth(1).inner_text()) == expected[keys[0]]
    assert page.locator("#apply-chart rect").count() == 6  # the run's apply and the open view's plan
    page.screenshot(path=str(shots / "tables.png"), full_page=True)
    page.click("#next")
    # the next page replaces the rows table once it arrived
    page.wait_for_function(f"document.querySelector('#rows tr:nth-child(2) td')?.textContent === '{keys[50]}'")
    assert page.errors == []


def test_a_script_in_a_row_is_shown_as_text(page: Any, deployment: Any) -> None:
    _open(page, deployment, tab="tables", topic=TABLE)
    page.wait_for_selector("#prefix")
    page.fill("#prefix", "zz")
    page.click("text=Filter")
    page.wait_for_function(
        "document.querySelector('#rows') && document.querySelector('#rows').innerText.includes('zz-script')"
    )
    assert SCRIPT_VALUE in page.inner_text("#rows")
    assert page.locator("#rows script").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_views_tab_shows_the_runs_published_counts_and_a_plan(page: Any, deployment: Any, shots: Path) -> None:
    report = deployment[1]["run"]["xcoms"]["report"]
    rows = len(job.fold(job.batch_events(1, EVENTS, SKUS)))
    assert (report["set"], report["delete"], report["unchanged"]) == (rows, 0, 0)  # a first run on an empty table
    _open(page, deployment, tab="views", topic=PIPELINE_TABLE, view="ui-pending")
    applied = f"tr[data-view='{report['view_id']}']"
    page.wait_for_selector(applied)
    assert "applied" in page.inner_text(applied)
    assert (
        f"published: set {report['set']}, delete {report['delete']}, unchanged {report['unchanged']} "
        f"at offset {report['commit_offset']}"
    ) in page.inner_text(applied)
    pending = page.inner_text("tr[data-view='ui-pending']")
    plan = deployment[1]["pipeline_plan"]
    assert (plan.set, plan.delete, plan.unchanged) == (0, rows - PENDING_KEYS, PENDING_KEYS)
    assert f"plan: set {plan.set}, delete {plan.delete}, unchanged {plan.unchanged}" in pending
    assert "hl" in (page.get_attribute("tr[data-view='ui-pending']", "class") or "")
    assert page.locator("tr[data-view='ui-pending'] td.warn").count() == 1  # it would delete most of the table
    page.screenshot(path=str(shots / "views.png"), full_page=True)


def test_leases_tab_shows_the_holder_and_the_pipelines_released_lease(page: Any, deployment: Any, shots: Path) -> None:
    _open(page, deployment, tab="leases", lease=LEASE)
    page.wait_for_selector(f"tr[data-lease='{LEASE}']")
    assert HOLDER in page.inner_text(f"tr[data-lease='{LEASE}']")
    assert "(released)" in page.inner_text(f"tr[data-lease='{PIPELINE_LEASE}']")  # release runs whatever happened
    page.screenshot(path=str(shots / "leases.png"), full_page=True)


def test_subscriptions_tab_shows_the_lag_of_the_events_published_after_the_run(
    page: Any, deployment: Any, shots: Path
) -> None:
    assert deployment[1]["lag_after_run"] == 0  # the run committed its cursor to the table's record
    _open(page, deployment, tab="subscriptions", topic=PIPELINE_SOURCE, subscription=PIPELINE_SUBSCRIPTION)
    page.wait_for_selector("#total-lag")
    assert page.inner_text("#total-lag") == str(MORE_EVENTS)
    cells = [row.locator("td").all_inner_texts() for row in page.locator("#partitions tr").all()[1:]]
    assert len(cells) == 2 and sum(int(end) - int(committed) for _, committed, end, _ in cells) == MORE_EVENTS
    assert page.locator("#lag-chart polyline").count() == 1
    page.screenshot(path=str(shots / "subscriptions.png"), full_page=True)


def test_the_page_is_in_the_ui_navigation(page: Any, deployment: Any, shots: Path) -> None:
    page.goto(f"{deployment[0].api_url}/plugin/pulsar-state")
    frame = page.wait_for_selector("iframe[src*='/pulsarstate/']", timeout=60_000)
    inner = frame.content_frame()
    inner.wait_for_selector("#tabs")
    assert page.get_by_text("Pulsar State").count() >= 1
    page.screenshot(path=str(shots / "in-airflow-ui.png"))


def test_leaders_tab_shows_the_leader_and_the_pipelines_transitions(page: Any, deployment: Any, shots: Path) -> None:
    _open(page, deployment, tab="leaders", topic=PIPELINE_TABLE)
    page.wait_for_selector(f"tr[data-leader='{LEASE}']")
    token = deployment[1]["token"]
    leader = page.inner_text(f"tr[data-leader='{LEASE}']")
    assert HOLDER in leader and str(token) in leader
    acquired = page.inner_text(f"tr[data-transition='{LEASE}:{token}:acquired']")
    assert HOLDER in acquired and "3600 s" in acquired
    # the run took its table's lease under its own name and gave it back
    holder = f"airflow/price_events_pipeline/{deployment[1]['run']['run_id']}"
    events = {
        row.locator("td").nth(2).inner_text()
        for row in page.locator("#transitions tr").all()[1:]
        if row.locator("td").nth(1).inner_text() == PIPELINE_LEASE and holder in row.inner_text()
    }
    assert {"acquired", "released"} <= events, events
    assert page.locator(f"tr[data-leader='{PIPELINE_LEASE}']").count() == 0  # released: no leader
    page.wait_for_selector("#producers")
    assert "no" in page.inner_text("#producers")  # the table's writer is not held
    page.screenshot(path=str(shots / "leaders.png"), full_page=True)
    assert page.errors == []


def test_maps_tab_shows_counts_sizes_and_values_as_text(page: Any, deployment: Any, shots: Path) -> None:
    _open(page, deployment, tab="maps", dag=DAG, run=RUN_ID, asset=ASSET)
    page.wait_for_selector(f"tr[data-run='{RUN_ID}']")
    assert page.locator("#map-runs tr").count() == 3  # a header and the DAG's two runs
    cells = page.locator(f"tr[data-run='{RUN_ID}'] td").all_inner_texts()
    assert cells[2] == str(N_XCOMS) and cells[4] == "2"
    page.wait_for_selector("#map-entries tr:nth-child(2)")
    assert page.locator("#map-entries tr").count() == N_XCOMS + 1
    assert "value" not in page.locator("#map-entries tr").first.inner_text()
    page.click("#show-values")
    page.wait_for_function("document.querySelector('#map-entries')?.innerText.includes('batch 1')")
    assert SCRIPT_VALUE in page.inner_text("#map-entries")
    assert page.locator("#map-entries script").count() == 0
    assert page.evaluate("window.__pwned") is None
    page.wait_for_selector("#asset-summary")
    assert "1 entries" in page.inner_text("#asset-summary")
    page.wait_for_selector("#asset-entries tr:nth-child(2)")
    assert "watermark" in page.inner_text("#asset-entries")
    page.screenshot(path=str(shots / "xcom-and-state.png"), full_page=True)
    assert page.errors == []


def test_maps_tab_refuses_values_to_a_user_who_may_not_read_the_dags_xcoms(
    page: Any,
    deployment: Any,
) -> None:
    context = page.context.browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        context.add_cookies(
            [{"name": "_token", "value": _token(deployment, "no-xcom-op"), "url": deployment[0].api_url}]
        )
        restricted = context.new_page()
        _open(restricted, deployment, tab="maps", dag=DAG, run=RUN_ID)
        restricted.wait_for_selector("#map-entries tr:nth-child(2)")  # counts, sizes and keys: yes
        assert restricted.locator(f"tr[data-run='{RUN_ID}'] td").all_inner_texts()[2] == str(N_XCOMS)
        restricted.click("#show-values")
        restricted.wait_for_selector("#values-error")
        assert "403" in restricted.inner_text("#values-error")
        assert "batch 1" not in restricted.content()
    finally:
        context.close()
