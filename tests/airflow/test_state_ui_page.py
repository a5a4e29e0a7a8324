"""The "Pulsar State" page in a real browser: headless Chromium (the system's ``chromium``, driven
by Playwright) loads it from a running ``airflow api-server`` with logins on, after the engine
wrote a table, views, a lease and a subscription, and the test checks what each tab shows,
including a row holding ``<script>`` shown as text. A screenshot of each tab is saved in
``$PULSARSTATE_UI_SCREENSHOTS`` (default: a temp dir); the README shows the committed ones."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.airflow.test_state_ui_api import (  # noqa: F401  (module-scoped fixtures of the same deployment)
    _PASSWORDS,
    ASSET,
    CONN_ID,
    DAG,
    HOLDER,
    LEASE,
    N_ROWS,
    N_XCOMS,
    RUN_ID,
    SCRIPT_VALUE,
    SOURCE,
    SUBSCRIPTION,
    TABLE,
    deployment,
)

CHROMIUM = os.environ.get("PULSARSTATE_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = Path(os.environ.get("PULSARSTATE_UI_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture(scope="module")
def page(deployment: Any) -> Iterator[Any]:  # noqa: F811
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


def _open(page: Any, deployment: Any, fragment: str) -> None:  # noqa: F811
    page.goto(f"{deployment[0].api_url}/pulsarstate/#conn={CONN_ID}&{fragment}")


def _token(deployment: Any, user: str) -> str:  # noqa: F811
    af = deployment[0]
    answer = requests.post(
        af.api_url + "/auth/token", json={"username": user, "password": _PASSWORDS[user]}, timeout=30
    )
    return str(answer.json()["access_token"])


def test_tables_tab_shows_the_summary_rows_and_the_apply_chart(page: Any, deployment: Any, shots: Path) -> None:  # noqa: F811
    _open(page, deployment, f"tab=tables&topic={TABLE}")
    page.wait_for_selector("#summary")
    assert page.inner_text("#summary [data-field='rows']") == str(N_ROWS + 1)
    assert page.inner_text("#summary [data-field='writer']") == "not held"
    page.wait_for_selector("#rows tr:nth-child(2)")
    assert page.locator("#rows tr").count() == 51  # a header and one page of 50
    assert page.locator("#apply-chart rect").count() >= 3
    page.screenshot(path=str(shots / "tables.png"), full_page=True)
    page.click("#next")
    # the next page replaces the rows table once it arrived
    page.wait_for_function("document.querySelector('#rows tr:nth-child(2) td')?.textContent === 'sku-0050'")
    assert page.errors == []


def test_a_script_in_a_row_is_shown_as_text(page: Any, deployment: Any) -> None:  # noqa: F811
    _open(page, deployment, f"tab=tables&topic={TABLE}")
    page.wait_for_selector("#prefix")
    page.fill("#prefix", "zz")
    page.click("text=Filter")
    page.wait_for_function(
        "document.querySelector('#rows') && document.querySelector('#rows').innerText.includes('zz-script')"
    )
    assert SCRIPT_VALUE in page.inner_text("#rows")
    assert page.locator("#rows script").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_views_tab_shows_the_plan_and_the_published_counts(page: Any, deployment: Any, shots: Path) -> None:  # noqa: F811
    _open(page, deployment, f"tab=views&topic={TABLE}&view=ui-pending")
    page.wait_for_selector("tr[data-view='ui-pending']")
    pending = page.inner_text("tr[data-view='ui-pending']")
    plan = deployment[1]["plan"]
    assert plan.delete == N_ROWS - 20
    assert f"plan: set {plan.set}, delete {plan.delete}, unchanged {plan.unchanged}" in pending
    assert "hl" in (page.get_attribute("tr[data-view='ui-pending']", "class") or "")
    assert "published: set 4, delete 0, unchanged 6" in page.inner_text("tr[data-view='ui-applied']")
    page.screenshot(path=str(shots / "views.png"), full_page=True)


def test_leases_tab_shows_the_holder(page: Any, deployment: Any, shots: Path) -> None:  # noqa: F811
    _open(page, deployment, f"tab=leases&lease={LEASE}")
    page.wait_for_selector(f"tr[data-lease='{LEASE}']")
    assert HOLDER in page.inner_text(f"tr[data-lease='{LEASE}']")
    page.screenshot(path=str(shots / "leases.png"), full_page=True)


def test_subscriptions_tab_shows_the_lag(page: Any, deployment: Any, shots: Path) -> None:  # noqa: F811
    _open(page, deployment, f"tab=subscriptions&topic={SOURCE}&subscription={SUBSCRIPTION}")
    page.wait_for_selector("#total-lag")
    assert page.inner_text("#total-lag") == str(deployment[1]["lag"])
    assert page.locator("#lag-chart polyline").count() == 1
    page.screenshot(path=str(shots / "subscriptions.png"), full_page=True)


def test_the_page_is_in_the_ui_navigation(page: Any, deployment: Any, shots: Path) -> None:  # noqa: F811
    page.goto(f"{deployment[0].api_url}/plugin/pulsar-state")
    frame = page.wait_for_selector("iframe[src*='/pulsarstate/']", timeout=60_000)
    inner = frame.content_frame()
    inner.wait_for_selector("#tabs")
    assert page.get_by_text("Pulsar State").count() >= 1
    page.screenshot(path=str(shots / "in-airflow-ui.png"))


def test_leaders_tab_shows_the_leader_and_its_transitions(page: Any, deployment: Any, shots: Path) -> None:  # noqa: F811
    _open(page, deployment, f"tab=leaders&lease={LEASE}&topic={TABLE}")
    page.wait_for_selector(f"tr[data-leader='{LEASE}']")
    token = deployment[1]["token"]
    leader = page.inner_text(f"tr[data-leader='{LEASE}']")
    assert HOLDER in leader and str(token) in leader
    acquired = page.inner_text(f"tr[data-transition='{LEASE}:{token}:acquired']")
    assert HOLDER in acquired and "3600 s" in acquired
    page.wait_for_selector("#producers")
    assert "no" in page.inner_text("#producers")  # the table's writer is not held
    page.screenshot(path=str(shots / "leaders.png"), full_page=True)
    assert page.errors == []


def test_maps_tab_shows_counts_sizes_and_values_as_text(page: Any, deployment: Any, shots: Path) -> None:  # noqa: F811
    _open(page, deployment, f"tab=maps&dag={DAG}&run={quote(RUN_ID)}&asset={ASSET}")
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
    deployment: Any,  # noqa: F811
) -> None:
    context = page.context.browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        context.add_cookies(
            [{"name": "_token", "value": _token(deployment, "no-xcom-op"), "url": deployment[0].api_url}]
        )
        restricted = context.new_page()
        _open(restricted, deployment, f"tab=maps&dag={DAG}&run={quote(RUN_ID)}")
        restricted.wait_for_selector("#map-entries tr:nth-child(2)")  # counts, sizes and keys: yes
        assert restricted.locator(f"tr[data-run='{RUN_ID}'] td").all_inner_texts()[2] == str(N_XCOMS)
        restricted.click("#show-values")
        restricted.wait_for_selector("#values-error")
        assert "403" in restricted.inner_text("#values-error")
        assert "batch 1" not in restricted.content()
    finally:
        context.close()
