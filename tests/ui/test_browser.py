"""The dashboard in a real headless Chromium, against the real API process, a real scheduler node
and a local HTTP receiver: log in with a namespace key, find a job by label, open it, watch a
delivery arrive in its history without reloading, pause it, find another namespace's job nowhere,
log out; then the admin's cluster page. The screenshots taken on the way are the ones in the docs
(docs/img/ui-*.png)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, text

from cronman.dev.receiver import Receiver
from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore
from cronman.store.store import make_engine
from tests.conftest import ADMIN_KEY
from tests.helpers import NodeThread, start_api_process, wait_for
from tests.ui.chromium import csp_violations, screenshot, start_driver
from tests.ui.conftest import add_history

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
NAMESPACE_A, NAMESPACE_B = "payments", "search"


@pytest.fixture
def api_url(settings_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    child, url = start_api_process(settings_env, tmp_path / "api.log")
    try:
        yield url
    finally:
        child.stop(10)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    d = start_driver(tmp_path / "chromium-profile")
    try:
        yield d
    finally:
        d.quit()


def _interval(every: int, url: str, **extra: Any) -> dict[str, Any]:
    return {"schedule": {"type": "interval", "every_seconds": every}, "target": {"type": "http", "url": url}, **extra}


def _seed_jobs(api_url: str, key_a: str, key_b: str, ok_url: str, failing_url: str) -> None:
    a = requests.Session()
    a.headers["Authorization"] = f"Bearer {key_a}"
    b = requests.Session()
    b.headers["Authorization"] = f"Bearer {key_b}"
    nightly = {
        "schedule": {"type": "cron", "expression": "0 7 * * 1-5", "timezone": "America/New_York"},
        "target": {"type": "http", "url": ok_url, "headers": {"Authorization": "Bearer not-shown"}},
    }
    jobs_a = [
        {
            "id": "invoice-reminder",
            "name": "Invoice reminders",
            "labels": {"team": "billing", "env": "prod"},
            **_interval(2, ok_url),
            "payload": {"batch": 50},
        },
        {
            "id": "nightly-settlement",
            "name": "Nightly settlement",
            "labels": {"team": "settlement", "env": "prod"},
            **nightly,
        },
        {
            "id": "ledger-webhook",
            "name": "Ledger webhook",
            "labels": {"team": "ledger", "env": "prod"},
            **_interval(3, failing_url),
            "retry": {"max_attempts": 2, "backoff_seconds": 1},
        },
        {
            "id": "archive-statements",
            "labels": {"team": "billing", "env": "dev"},
            **_interval(86400, ok_url),
            "paused": True,
        },
    ]
    for doc in jobs_a:
        r = a.post(f"{api_url}/v1/jobs", json=doc, timeout=10)
        assert r.status_code == 201, r.text
    same_labels = {"team": "billing", "env": "prod"}  # another namespace's job with the very same labels
    doc = {"id": "b-secret-job", "name": "Bravo private", "labels": same_labels, **_interval(5, ok_url)}
    r = b.post(f"{api_url}/v1/jobs", json=doc, timeout=10)
    assert r.status_code == 201, r.text


def _seed_history(engine: Engine, job_id: str) -> None:
    """Earlier executions, so the timeline and the lag chart have something to show from the start:
    mostly successes, two that succeeded on a retry, one that failed for good."""
    first = datetime.now(UTC) - timedelta(seconds=5)
    for k in range(36, 0, -1):
        at = first - timedelta(seconds=2 * k)
        lag = 180 if k == 12 else 3 + (k * 37) % 23
        if k in (7, 19, 28):
            x = add_history(engine, job_id, "failed", at, lag_ms=lag)
            add_history(
                engine,
                job_id,
                "permanently_failed" if k == 28 else "succeeded",
                at,
                attempt=2,
                execution_id=x,
                lag_ms=lag + 1000,
            )
        else:
            add_history(engine, job_id, "succeeded", at, lag_ms=lag)


def _rows(driver: Any, attribute: str = "data-job-id") -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.get_attribute(attribute) for e in driver.find_elements(By.CSS_SELECTOR, f"tr[{attribute}]")]


def _login(driver: Any, base: str, key: str, shot: Path | None = None) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/ui/")
    assert "/ui/login" in driver.current_url
    driver.find_element(By.ID, "key").send_keys(key)
    if shot is not None:
        screenshot(driver, shot, max_height=HEIGHT_LOGIN)
    driver.find_element(By.ID, "login").click()
    wait_for(lambda: driver.current_url.endswith("/ui/jobs"), 10, "the jobs page after login")


HEIGHT_LOGIN = 560


@pytest.mark.timeout(900)  # room for installing Chromium on a machine without it; the flow takes ~30 s
def test_the_dashboard_in_a_real_browser(settings: Settings, api_url: str, driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    engine = make_engine(settings.database_url, pool_size=1)
    keys = ApiKeyStore(engine)
    key_a = keys.create(NAMESPACE_A, "browser test")[1]
    key_b = keys.create(NAMESPACE_B, "browser test")[1]
    with Receiver() as ok, Receiver(fail_first=1000, fail_status=503) as failing, NodeThread(settings):
        _seed_jobs(api_url, key_a, key_b, f"{ok.url}/hook", f"{failing.url}/hook")
        _seed_history(engine, "invoice-reminder")

        # 1. log in with the namespace key: only its jobs
        _login(driver, api_url, key_a, DOCS_IMG / "ui-login.png")
        assert driver.find_element(By.ID, "session-namespace").text == f"namespace {NAMESPACE_A}"
        assert set(_rows(driver)) == {"invoice-reminder", "nightly-settlement", "ledger-webhook", "archive-statements"}
        assert "b-secret-job" not in driver.page_source and "Bravo private" not in driver.page_source

        # 2. find a job by its labels: the list updates in place (htmx), and the address follows
        selector = driver.find_element(By.ID, "selector")
        selector.send_keys("team=billing,env=prod")
        wait_for(lambda: _rows(driver) == ["invoice-reminder"], 10, "the job with those labels")
        assert "selector=team%3Dbilling%2Cenv%3Dprod" in driver.current_url
        assert "b-secret-job" not in driver.page_source
        selector.clear()
        selector.send_keys("env=prod")
        expected = ["invoice-reminder", "ledger-webhook", "nightly-settlement"]
        wait_for(lambda: _rows(driver) == expected, 10, "the production jobs")
        wait_for(lambda: "failing" in driver.page_source or driver.refresh(), 20, "the failing job, in the list")
        screenshot(driver, DOCS_IMG / "ui-jobs.png", max_height=700)
        selector = driver.find_element(By.ID, "selector")
        selector.clear()
        selector.send_keys("team=billing,env=prod")
        wait_for(lambda: _rows(driver) == ["invoice-reminder"], 10, "the job with those labels, again")

        # 3. open it; a new delivery shows up in its history without reloading the page
        driver.find_element(By.LINK_TEXT, "invoice-reminder").click()
        wait_for(lambda: driver.find_elements(By.ID, "job-title"), 10, "the job page")
        driver.execute_script("window.__sameDocument = true;")
        shown = len(driver.find_elements(By.CSS_SELECTOR, "#history tbody.execution"))
        got = len(ok.snapshot())
        wait_for(
            lambda: len(driver.find_elements(By.CSS_SELECTOR, "#history tbody.execution")) > shown,
            15,
            "a new delivery in the history",
        )
        assert len(ok.snapshot()) > got
        assert driver.execute_script("return window.__sameDocument === true;"), "the page was reloaded"
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ".lag-chart canvas"), 10, "the lag chart")
        assert "Every 2 seconds" in driver.find_element(By.ID, "schedule-words").text
        assert len(driver.find_elements(By.CSS_SELECTOR, "#next-times tbody tr")) == 10
        screenshot(driver, DOCS_IMG / "ui-job.png", max_height=1500)

        # 4. pause it
        driver.find_element(By.ID, "pause").click()
        wait_for(lambda: driver.find_element(By.ID, "job-state").text == "paused", 10, "the paused state")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT paused FROM jobs WHERE id = 'invoice-reminder'")).scalar_one()
        assert "Paused." in driver.page_source

        # 5. failures across jobs
        driver.get(f"{api_url}/ui/failures")
        wait_for(lambda: "ledger-webhook" in _rows(driver), 5, "the failing job's executions")
        screenshot(driver, DOCS_IMG / "ui-failures.png", max_height=700)

        # 6. the other namespace's job is nowhere, not even by its address
        assert "b-secret-job" not in driver.page_source
        driver.get(f"{api_url}/ui/jobs/b-secret-job")
        assert "404" in driver.find_element(By.TAG_NAME, "h1").text
        driver.get(f"{api_url}/ui/jobs?q=secret")
        assert _rows(driver) == []
        driver.get(f"{api_url}/ui/failures?window=1h")
        assert "b-secret-job" not in driver.page_source
        assert csp_violations(driver) == []

        # 7. the session cookie cannot change anything without the page's CSRF token
        cookie = driver.get_cookie("cronman_ui")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        s = requests.Session()
        s.cookies.set("cronman_ui", cookie["value"], path="/ui")
        r = s.post(f"{api_url}/ui/jobs/invoice-reminder/resume", allow_redirects=False, timeout=5)
        assert r.status_code == 403
        page = s.get(f"{api_url}/ui/jobs", allow_redirects=False, timeout=5)
        assert page.status_code == 200 and "unsafe-inline" not in page.headers["Content-Security-Policy"]

        # 8. log out: the cookie opens nothing any more
        driver.get(f"{api_url}/ui/jobs")
        driver.find_element(By.ID, "logout").click()
        wait_for(lambda: "/ui/login" in driver.current_url, 10, "the login page")
        driver.get(f"{api_url}/ui/jobs")
        assert "/ui/login" in driver.current_url
        assert s.get(f"{api_url}/ui/jobs", allow_redirects=False, timeout=5).status_code == 302

        # 9. the admin sees the cluster, from the node's own heartbeat
        _login(driver, api_url, ADMIN_KEY)
        driver.get(f"{api_url}/ui/cluster")
        wait_for(lambda: _rows(driver, "data-node-id") == [settings.node_id], 10, "the node")
        screenshot(driver, DOCS_IMG / "ui-cluster.png", max_height=500)
        assert csp_violations(driver) == []
        driver.find_element(By.ID, "logout").click()
    engine.dispose()
    assert time.monotonic() - started < 90
