"""The dashboard's server side through the Flask test client, against real PostgreSQL and Redis:
login and sessions, CSRF, the security headers, namespace scoping on every page, the jobs list's
filters, sorts and pages, bulk changes, failures and the polled history. The browser tests
(test_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from flask import Flask
from sqlalchemy import Engine, text

from api.ui import queries
from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore
from cronman.store.health import auto_paused
from cronman.store.partitions import ensure_partitions
from tests.conftest import ADMIN_KEY
from tests.ui.conftest import Browser, add_history, job, keyed, send


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-job-id="([^"]+)"', html)


def _paused(engine: Engine, job_id: str) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT paused FROM jobs WHERE id = :i"), {"i": job_id}).scalar_one())


# -- login, sessions, headers ----------------------------------------------------------------------


def test_every_page_sends_a_csp_without_unsafe_inline_and_has_no_inline_script_or_style(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    send(keyed(app, key), "post", "/v1/jobs", job("a-1"))
    add_history(engine, "a-1", "failed", datetime.now(UTC) - timedelta(minutes=1))
    b = browser()
    login_page = b.get("/ui/login")
    b.login(key)
    pages = [login_page] + [
        b.get(p) for p in ("/ui/jobs", "/ui/jobs/a-1", "/ui/jobs/a-1/history", "/ui/failures", "/ui/jobs/nope")
    ]
    for r in pages:
        csp = r.headers["Content-Security-Policy"]
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "script-src 'self'" in csp and "style-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert r.headers["X-Frame-Options"] == "DENY" and r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Cache-Control"] == "no-store"
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", r.text), "an inline script"
        assert "<style" not in r.text and not re.search(r"\sstyle=", r.text), "an inline style"
        assert not re.search(r"\son[a-z]+=", r.text), "an inline event handler"
        assert "//" not in re.sub(
            r"https?://[^\s\"'<]*example\.com[^\s\"'<]*", "", "".join(re.findall(r'(?:src|href)="([^"]*)"', r.text))
        ), "an asset from another origin"


def test_login_sets_an_httponly_strict_cookie_and_logout_ends_the_session(
    app: Flask, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    b = browser()
    assert b.get("/ui/jobs").headers["Location"].startswith("/ui/login")
    r = b.login(new_key("team-a"))
    cookie = next(v for k, v in r.headers.items() if k == "Set-Cookie" and v.startswith("cronman_ui="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    assert b.get("/ui/jobs").status_code == 200
    stolen = b.client.get_cookie("cronman_ui", path="/ui")
    assert stolen is not None
    assert b.post("/ui/logout").headers["Location"] == "/ui/login"
    # the old cookie value no longer opens anything, even if a client kept it
    other = app.test_client()
    other.set_cookie("cronman_ui", stolen.value, path="/ui")
    r = other.get("/ui/jobs")
    assert r.status_code == 302 and r.headers["Location"].startswith("/ui/login")


def test_a_revoked_key_ends_its_sessions(
    key_store: ApiKeyStore, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    record, key = key_store.create("team-a", "to revoke")
    b = browser()
    b.login(key)
    assert b.get("/ui/jobs").status_code == 200
    key_store.revoke(record.prefix)
    assert b.get("/ui/jobs").status_code == 302


def test_bad_keys_are_refused_and_failed_logins_are_limited(settings: Settings, new_key: Callable[[str], str]) -> None:
    from api import create_app

    app = create_app(settings.model_copy(update={"ui_login_attempts": 3, "ui_login_client_attempts": 4}))
    try:
        b = Browser(app)
        for bad in ("wrong", "cmk_000000000000_nope", ""):
            r = b.login(bad, expect=401)
            assert "unknown or revoked" in r.text
        Browser(app).login(new_key("team-a"))  # a key of its own: not yet over any limit
        b.login("wrong-again", expect=401)
        r = b.login(new_key("team-a"), expect=429)  # four failures from this address: even a good key waits
        assert int(r.headers["Retry-After"]) > 0 and "Too many failed logins" in r.text
    finally:
        app.extensions["cronman"].store.engine.dispose()


def test_the_login_form_needs_its_own_token_and_never_redirects_elsewhere(
    app: Flask, new_key: Callable[[str], str]
) -> None:
    key = new_key("team-a")
    client = app.test_client()
    assert client.post("/ui/login", data={"key": key}).status_code == 400  # no form token: a cross-site login
    b = Browser(app)
    page = b.get("/ui/login?next=https://evil.example/")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    r = b.client.post("/ui/login", data={"csrf_token": token, "key": key, "next": "https://evil.example/"})
    assert r.status_code == 302 and r.headers["Location"] == "/ui/jobs"


def test_a_change_without_the_csrf_token_or_from_another_origin_is_refused(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    send(keyed(app, key), "post", "/v1/jobs", job("a-1"))
    b = browser()
    b.login(key)
    r = b.post("/ui/jobs/a-1/pause", token=False)
    assert r.status_code == 403 and "CSRF" in r.text
    r = b.post("/ui/jobs/a-1/pause", data={"csrf_token": "forged"}, token=False)
    assert r.status_code == 403
    r = b.post("/ui/jobs/a-1/pause", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    r = b.post("/ui/jobs/a-1/pause", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    assert not _paused(engine, "a-1")
    r = b.post("/ui/jobs/a-1/pause", headers={"Origin": "http://localhost"})
    assert r.status_code == 302 and _paused(engine, "a-1")
    # htmx sends the token as a header
    r = b.client.post("/ui/jobs/a-1/resume", headers={"X-CSRF-Token": b.token})
    assert r.status_code == 302 and not _paused(engine, "a-1")


# -- namespace scoping ---------------------------------------------------------------------------------


def test_a_namespace_key_sees_its_own_jobs_nowhere_another_namespaces(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    ka, kb = new_key("team-a"), new_key("team-b")
    send(keyed(app, ka), "post", "/v1/jobs", job("a-1", name="alpha"))
    send(keyed(app, kb), "post", "/v1/jobs", job("b-secret", name="bravo"))
    now = datetime.now(UTC)
    add_history(engine, "a-1", "permanently_failed", now - timedelta(minutes=2))
    b_exec = add_history(engine, "b-secret", "permanently_failed", now - timedelta(minutes=1))

    b = browser()
    b.login(ka)
    everywhere = [
        b.get(p).text
        for p in (
            "/ui/jobs",
            "/ui/jobs?q=b-",
            "/ui/jobs?state=failing",
            "/ui/jobs?sort=next",
            "/ui/jobs?sort=result",
            "/ui/failures?window=45d",
            "/ui/jobs/a-1",
        )
    ]
    assert all("b-secret" not in html and "bravo" not in html for html in everywhere)
    assert _job_ids(everywhere[0]) == ["a-1"]
    for path in ("/ui/jobs/b-secret", "/ui/jobs/b-secret/history"):
        assert b.get(path).status_code == 404
    assert b.get("/ui/jobs?namespace=team-b").status_code == 403
    assert b.get("/ui/cluster").status_code == 403
    for action in ("pause", "trigger", "delete"):
        assert b.post(f"/ui/jobs/b-secret/{action}").status_code == 404
    assert b.post(f"/ui/jobs/b-secret/executions/{b_exec}/redeliver").status_code == 404
    b.post("/ui/jobs/bulk", {"action": "pause", "id": ["a-1", "b-secret"]})
    assert _paused(engine, "a-1") and not _paused(engine, "b-secret")

    admin = browser()
    admin.login(ADMIN_KEY)
    assert set(_job_ids(admin.get("/ui/jobs").text)) == {"a-1", "b-secret"}
    assert _job_ids(admin.get("/ui/jobs?namespace=team-b").text) == ["b-secret"]
    typed = admin.get("/ui/jobs?namespace=team+b", headers={"HX-Request": "true", "HX-Target": "results"})
    assert typed.status_code == 400 and typed.text.startswith('<div id="results">') and "namespace" in typed.text
    broken = admin.get("/ui/jobs/nope/history", headers={"HX-Request": "true"})
    assert broken.status_code == 404 and broken.headers["HX-Reswap"] == "none"
    assert admin.get("/ui/cluster").status_code == 200


# -- the jobs list ---------------------------------------------------------------------------------------


def test_states_search_and_sorts(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    api = keyed(app, key)
    hourly = {"type": "interval", "every_seconds": 3600, "start_at": _at(-1800)}  # next in about 30 min
    soon = {"type": "interval", "every_seconds": 3600, "start_at": _at(-3590)}  # next in about 10 s
    for doc in (
        job("active-late", name="Nightly report", schedule=hourly),
        job("active-soon", schedule=soon),
        job("paused-1", paused=True),
        job("done-once", schedule={"type": "once", "at": _at(60)}),  # moved into the past below
        job("failing-1", schedule={"type": "cron", "expression": "0 7 * * *", "timezone": "America/New_York"}),
        # (not every 5 minutes: the next 5-minute mark falls before active-soon's 10 s one minute in 30)
        job("recovered", schedule={"type": "cron", "expression": "30 3 1 1 *"}),
    ):
        assert send(api, "post", "/v1/jobs", doc).status_code == 201
    with engine.begin() as conn:  # a once job that fired two hours ago (the API refuses one in the past)
        conn.execute(
            text("UPDATE jobs SET schedule = jsonb_set(schedule, '{at}', to_jsonb(CAST(:at AS text))) WHERE id = :id"),
            {"at": _at(-7200), "id": "done-once"},
        )
    now = datetime.now(UTC)
    add_history(engine, "failing-1", "succeeded", now - timedelta(hours=2))
    add_history(engine, "failing-1", "permanently_failed", now - timedelta(hours=1))
    add_history(engine, "recovered", "failed", now - timedelta(hours=1))
    add_history(engine, "recovered", "succeeded", now - timedelta(minutes=30))
    add_history(engine, "done-once", "succeeded", now - timedelta(hours=2))

    b = browser()
    b.login(key)
    by_state = {s.value: _job_ids(b.get(f"/ui/jobs?state={s.value}").text) for s in queries.State}
    assert by_state == {
        "active": ["active-late", "active-soon", "recovered"],
        "paused": ["paused-1"],
        "failing": ["failing-1"],
        "completed": ["done-once"],
    }
    page = b.get("/ui/jobs").text
    assert "At 07:00 (America/New_York)" in page and "Every 1 hour, counted from" in page
    assert _job_ids(b.get("/ui/jobs?q=NIGHTLY").text) == ["active-late"]  # names too, any case
    assert _job_ids(b.get("/ui/jobs?q=_").text) == []  # LIKE wildcards are literal
    by_next = _job_ids(b.get("/ui/jobs?sort=next").text)
    assert by_next[0] == "active-soon"
    assert by_next.index("active-soon") < by_next.index("active-late") < by_next.index("paused-1")
    assert set(by_next[-2:]) == {"paused-1", "done-once"}  # nothing to fire: last
    by_result = _job_ids(b.get("/ui/jobs?sort=result").text)
    assert by_result[0] == "failing-1" and set(by_result[1:3]) == {"recovered", "done-once"}
    assert b.get("/ui/jobs?state=nope").status_code == 400
    assert b.get("/ui/jobs?sort=nope").status_code == 400
    assert b.get("/ui/jobs?cursor=garbage").status_code == 400


def test_label_selectors_filter_the_list_within_the_namespace(
    app: Flask, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    ka, kb = new_key("team-a"), new_key("team-b")
    a, b_api = keyed(app, ka), keyed(app, kb)
    for job_id, labels in (
        ("pay-prod", {"team": "payments", "env": "prod"}),
        ("pay-dev", {"team": "payments", "env": "dev"}),
        ("search-prod", {"team": "search", "env": "prod", "legacy": ""}),
        ("bare", {}),
    ):
        assert send(a, "post", "/v1/jobs", job(job_id, labels=labels)).status_code == 201
    send(b_api, "post", "/v1/jobs", job("b-pay-prod", labels={"team": "payments", "env": "prod"}))
    b = browser()
    b.login(ka)

    def ids(selector: str, extra: str = "") -> list[str]:
        r = b.get("/ui/jobs", query_string={"selector": selector, **dict([extra.split("=")] if extra else [])})
        assert r.status_code == 200, r.text
        return _job_ids(r.text)

    assert ids("team=payments") == ["pay-dev", "pay-prod"]
    assert ids("team=payments,env!=dev") == ["pay-prod"]
    assert ids("env in (prod,staging)") == ["pay-prod", "search-prod"]
    assert ids("!team") == ["bare"]
    assert ids("legacy") == ["search-prod"]
    assert ids("team=payments", "state=paused") == []
    assert ids("env=prod", "sort=next") in (["pay-prod", "search-prod"], ["search-prod", "pay-prod"])
    html = b.get("/ui/jobs?selector=team%3Dpayments").text
    assert "env=prod" in html and "team=payments" in html  # the labels are shown
    r = b.get("/ui/jobs?selector=team+in+(")
    assert r.status_code == 400 and 'id="filter-error"' in r.text and "selector:" in r.text
    assert 'value="team in ("' in r.text  # the text stays in the box to be corrected


def test_pages_follow_each_other_without_gaps_or_repeats(
    app: Flask, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    api = keyed(app, key)
    docs = [job(f"job-{i:03d}", paused=i % 3 == 0) for i in range(60)]
    assert send(api, "post", "/v1/jobs:batch", {"jobs": docs}).status_code == 200
    b = browser()
    b.login(key)
    for query, expected in (
        ("", [d["id"] for d in docs]),
        ("state=paused&", [d["id"] for d in docs if d["paused"]]),
        ("state=active&", [d["id"] for d in docs if not d["paused"]]),
        ("sort=next&", None),
    ):
        seen: list[str] = []
        url: str | None = f"/ui/jobs?{query}limit=25"
        while url:
            html = b.get(url).text
            seen += _job_ids(html)
            found = re.search(r'href="([^"]+)" id="next-page"', html)
            url = found.group(1).replace("&amp;", "&") if found else None
        assert len(seen) == len(set(seen))
        assert seen == expected if expected is not None else sorted(seen) == [d["id"] for d in docs]


def test_bulk_pause_and_resume_record_who_did_it(
    app: Flask, engine: Engine, key_store: ApiKeyStore, browser: Callable[[], Browser]
) -> None:
    record, key = key_store.create("team-a", "bulk")
    api = keyed(app, key)
    for i in range(3):
        send(api, "post", "/v1/jobs", job(f"j-{i}"))
    b = browser()
    b.login(key)
    r = b.post("/ui/jobs/bulk", {"action": "pause", "id": ["j-0", "j-2", "missing"], "next": "/ui/jobs?q=j-"})
    assert r.status_code == 302 and r.headers["Location"] == "/ui/jobs?q=j-&done=bulk-paused&n=2"
    assert [_paused(engine, f"j-{i}") for i in range(3)] == [True, False, True]
    assert "Paused 2 job(s)." in b.get(r.headers["Location"]).text
    b.post("/ui/jobs/bulk", {"action": "resume", "id": ["j-0", "j-1"]})
    assert [_paused(engine, f"j-{i}") for i in range(3)] == [False, False, True]
    events = api.get("/v1/jobs/j-0/events").json["events"]
    assert [(e["action"], e["actor"]) for e in events[:2]] == [
        ("resume", f"key:{record.prefix}"),
        ("pause", f"key:{record.prefix}"),
    ]
    assert events[0]["detail"] == {"via": "ui", "bulk": True}
    assert b.post("/ui/jobs/bulk", {"action": "explode", "id": ["j-0"]}).status_code == 400


def test_bulk_pause_and_resume_keep_paused_reason_as_the_api_s_pause_and_resume_do(
    app: Flask, engine: Engine, key_store: ApiKeyStore, browser: Callable[[], Browser]
) -> None:
    """A bulk pause records who paused each job; a bulk resume clears the reason, so that an
    auto-pause's reason does not come back when the job is paused again in its definition."""
    record, key = key_store.create("team-a", "bulk")
    api = keyed(app, key)
    for i in range(2):
        send(api, "post", "/v1/jobs", job(f"r-{i}", failure_policy={"pause_after_consecutive_failures": 3}))
    with engine.begin() as conn:  # r-1 paused itself, as a node's history writer pauses a job
        conn.execute(
            text("UPDATE jobs SET paused = true, paused_reason = CAST(:r AS jsonb) WHERE id = 'r-1'"),
            {"r": json.dumps({**auto_paused(3), "since": _at(0)})},
        )
    b = browser()
    b.login(key)
    b.post("/ui/jobs/bulk", {"action": "pause", "id": ["r-0", "r-1"]})
    reasons = [send(api, "get", f"/v1/jobs/r-{i}").json["paused_reason"] for i in range(2)]
    assert reasons[0]["reason"] == "paused" and reasons[0]["by"] == f"key:{record.prefix}" and reasons[0]["since"]
    assert reasons[1]["reason"] == "consecutive_failures"  # paused already: untouched
    b.post("/ui/jobs/bulk", {"action": "resume", "id": ["r-0", "r-1"]})
    assert [send(api, "get", f"/v1/jobs/r-{i}").json["paused_reason"] for i in range(2)] == [None, None]
    paused_again = send(api, "patch", "/v1/jobs/r-1", {"paused": True}).json["paused_reason"]
    assert paused_again["reason"] == "paused" and paused_again["message"] == "paused in the job's definition"


# -- a job, its history, failures -----------------------------------------------------------------------


def test_a_job_page_shows_schedule_times_target_payload_history_and_events(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    api = keyed(app, key)
    doc = job(
        "report",
        schedule={"type": "cron", "expression": "30 2 * * *", "timezone": "America/New_York"},
        target={"type": "http", "url": "https://example.com/hook", "headers": {"Authorization": "Bearer s3cret"}},
        payload={"report": "daily"},
    )
    assert send(api, "post", "/v1/jobs", doc).status_code == 201
    now = datetime.now(UTC)
    x = add_history(engine, "report", "failed", now - timedelta(minutes=3), lag_ms=40)
    add_history(engine, "report", "permanently_failed", now - timedelta(minutes=3), attempt=2, execution_id=x)
    b = browser()
    b.login(key)
    html = b.get("/ui/jobs/report").text
    assert "At 02:30 (America/New_York)" in html
    next_times = api.get("/v1/jobs/report/next?count=10").json["next"]
    assert len(re.findall(r"<td>\d+</td><td>\d{4}-\d\d-\d\d 02:30:00 E[SD]T</td>", html)) == 10
    assert next_times[0].replace("T", " ") in html  # the same instants, in UTC
    assert "s3cret" not in html and "&lt;redacted&gt;" in html
    assert "&#34;report&#34;: &#34;daily&#34;" in html
    group = re.search(rf'<tbody class="execution"[^>]*data-execution-id="{x}">(.*?)</tbody>', html, re.S)
    assert group is not None and group.group(1).count('<tr class="attempt') == 2  # attempts together
    assert "timeline" in html and 'data-lag-chart="[[' in html
    assert "<td>create</td>" in html  # the events

    b.post("/ui/jobs/report/pause")
    b.post("/ui/jobs/report/trigger")
    r = b.post(f"/ui/jobs/report/executions/{x}/redeliver")
    assert r.headers["Location"] == "/ui/jobs/report?done=redelivered"
    events = [e["action"] for e in api.get("/v1/jobs/report/events").json["events"]]
    assert events == ["redeliver", "trigger", "pause", "create"]
    assert b.post("/ui/jobs/report/delete").headers["Location"] == "/ui/jobs?done=deleted"
    assert api.get("/v1/jobs/report").status_code == 404


def test_the_history_fragment_answers_204_until_something_new_arrives(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    send(keyed(app, key), "post", "/v1/jobs", job("poll"))
    b = browser()
    b.login(key)
    first = b.get("/ui/jobs/poll/history", headers={"HX-Request": "true"})
    digest = re.search(r"digest=([0-9a-f]+)", first.text).group(1)  # type: ignore[union-attr]
    assert b.get(f"/ui/jobs/poll/history?digest={digest}").status_code == 204
    add_history(engine, "poll", "succeeded", datetime.now(UTC))
    r = b.get(f"/ui/jobs/poll/history?digest={digest}")
    assert r.status_code == 200 and r.text.count('<tbody class="execution"') == 1


def test_failures_across_jobs_with_their_kinds(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    api = keyed(app, key)
    for i in range(3):
        send(api, "post", "/v1/jobs", job(f"f-{i}"))
    now = datetime.now(UTC)
    retried = add_history(engine, "f-0", "failed", now - timedelta(minutes=9))
    add_history(engine, "f-0", "succeeded", now - timedelta(minutes=9), attempt=2, execution_id=retried)
    failing = add_history(engine, "f-1", "failed", now - timedelta(minutes=5))
    dead = add_history(engine, "f-2", "permanently_failed", now - timedelta(minutes=2), dead_lettered=True)
    old = add_history(engine, "f-2", "permanently_failed", now - timedelta(days=3))
    b = browser()
    b.login(key)

    def shown(query: str) -> list[str]:
        return re.findall(r'<code title="([0-9a-f-]+)">', b.get(f"/ui/failures?{query}").text)

    assert shown("") == [dead, failing]  # an execution that succeeded on retry is no failure
    assert shown("window=7d") == [dead, failing, old]
    assert shown("kind=dead_lettered&window=7d") == [dead]
    assert shown("kind=failed") == [failing]
    r = b.post(f"/ui/jobs/f-1/executions/{failing}/redeliver", {"next": "/ui/failures?window=7d"})
    assert r.headers["Location"] == "/ui/failures?window=7d&done=redelivered"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT execution_id::text FROM job_triggers")).scalar_one() == failing
    assert b.get("/ui/failures?window=1y").status_code == 400


def _fail_every_second(engine: Engine, job_id: str, count: int) -> None:
    """``count`` failed attempts of ``job_id``, one a second back from now (one statement)."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        days = {(now - timedelta(seconds=s)).date() for s in (0, count // 2, count)}
        ensure_partitions(conn, sorted(days))
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (job_id, scheduled_for, attempt, execution_id, status, node, error, "
                "incarnation, namespace) "
                "SELECT :j, :now - g * interval '1 second', 1, gen_random_uuid(), 'failed', 'node-a', 'HTTP 503', "
                "j.incarnation, j.namespace FROM generate_series(1, :n) AS g, jobs j WHERE j.id = :j"
            ),
            {"j": job_id, "now": now, "n": count},
        )


def test_failing_jobs_of_one_namespace_are_not_hidden_by_anothers_failures(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    ka, kb = new_key("team-a"), new_key("team-b")
    send(keyed(app, ka), "post", "/v1/jobs", job("noisy"))
    send(keyed(app, kb), "post", "/v1/jobs", job("quiet"))
    add_history(engine, "quiet", "permanently_failed", datetime.now(UTC) - timedelta(days=1))
    _fail_every_second(engine, "noisy", queries.MAX_FAILED_READ + 1)  # all newer than quiet's failure

    b = browser()
    b.login(kb)
    assert _job_ids(b.get("/ui/jobs?state=failing").text) == ["quiet"]
    admin = browser()
    admin.login(ADMIN_KEY)
    page = admin.get("/ui/jobs?state=failing").text
    assert _job_ids(page) == ["noisy", "quiet"]
    assert "Many failures lately" in page  # team-a's share was read, not all of it
    with engine.connect() as conn:
        failed, capped = queries.recently_failed(conn, datetime.now(UTC), "team-b")
    assert (failed, capped) == (["quiet"], False)


def test_query_parameters_named_like_url_for_arguments_are_only_query_parameters(
    app: Flask, engine: Engine, browser: Callable[[], Browser]
) -> None:
    import html

    api = keyed(app, ADMIN_KEY)
    for i in range(27):
        send(api, "post", "/v1/jobs", job(f"p-{i:02d}"))
    for k in range(52):
        add_history(engine, "p-00", "failed", datetime.now(UTC) - timedelta(minutes=k + 1))
    b = browser()
    b.login(ADMIN_KEY)
    odd = "endpoint=x&_external=1&_scheme=javascript&_anchor=%0Aalert(1)&_method=POST"
    for path in (f"/ui/jobs?limit=25&{odd}", f"/ui/failures?{odd}"):
        r = b.get(path)
        assert r.status_code == 200, (path, r.status_code)
        links = [html.unescape(h) for h in re.findall(r'href="([^"]*cursor=[^"]*)"', r.text)]
        assert links, path
        for link in links:  # a path of this site, the names carried as query parameters
            assert link.startswith(path.split("?")[0] + "?") and "endpoint=x" in link and "_external=1" in link
            assert "#" not in link and "javascript" in link  # (as a parameter's value, nothing else)
            follow = b.get(link)
            assert follow.status_code == 200 and ("Newest" in follow.text or "First page" in follow.text)


def test_the_cluster_page_shows_what_each_node_reports(
    app: Flask, settings: Settings, browser: Callable[[], Browser]
) -> None:
    import json
    import time

    svc = app.extensions["cronman"]
    full = {
        "ts": time.time(),
        "ready": True,
        "jobs": 1200,
        "slots": 2731,
        "in_flight": 7,
        "fires_per_s": 41.5,
        "lag_p99_ms": 18.2,
        "started_at": time.time() - 60,
    }
    bare = {"ts": time.time() - 4}
    from cronman.redis.keys import lua

    beat = svc.redis.register_script(lua("beat"))  # what a node's heartbeat writes
    for node_id, info in (("node-full", full), ("node-bare", bare)):
        beat(
            keys=[svc.keys.members, svc.keys.epoch, svc.keys.progress],
            args=[node_id, 30_000, json.dumps(info), "e", ""],
        )
    b = browser()
    b.login(ADMIN_KEY)
    html = b.get("/ui/cluster").text
    row = re.search(r'<tr data-node-id="node-full">(.*?)</tr>', html, re.S).group(1)  # type: ignore[union-attr]
    cells = re.findall(r"<td>(.*?)</td>", row, re.S)
    assert cells[3:8] == ["2731", "1200", "7", "41.5", "18 ms"]
    bare_row = re.search(r'<tr data-node-id="node-bare">(.*?)</tr>', html, re.S).group(1)  # type: ignore[union-attr]
    assert re.findall(r"<td>(.*?)</td>", bare_row, re.S)[5:8] == ["—", "—", "—"]
    partial = b.get("/ui/cluster", headers={"HX-Request": "true"}).text
    assert partial.startswith('<table class="grid nodes"')
