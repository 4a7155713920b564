"""The API side of health, auto-pause, notifications and capture: fields, validation, what is
stored (real PostgreSQL and Redis; health rows written through the node's own history writer)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import text

from api import create_app
from cronman.model.execution import execution_id
from cronman.settings import Settings
from cronman.store.health import Health, HealthState, fold, state_of
from cronman.store.notifications import Summary, on_event, on_tick
from scheduler_node.history import HistoryRow
from scheduler_node.store import PgNodeStore
from tests.conftest import ADMIN_KEY


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings)
    yield app
    app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {ADMIN_KEY}"
    return c


def _job(job_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "schedule": {"type": "interval", "every_seconds": 60},
        "target": {"type": "http", "url": "https://example.com/hook"},
        **extra,
    }


def _row(job: dict[str, Any], at: int, attempt: int, status: str, inc: int, finished: int | None = None) -> HistoryRow:
    fired = None if status in ("late", "skipped") else at + 10
    return HistoryRow(
        job["id"], at, 0, attempt, execution_id(job["id"], at), "schedule", status, "node-a", fired,
        finished if finished is not None else fired, None if fired is None else 10, None, None, None, None, inc,
        job["namespace"],
    )  # fmt: skip


def test_new_fields_health_and_paused_reason(client: FlaskClient, app: Flask) -> None:
    r = client.post(
        "/v1/jobs",
        json=_job("a", failure_policy={"pause_after_consecutive_failures": 2}, late_after_seconds=30,
                  capture_response_bytes=4096),
    )  # fmt: skip
    assert r.status_code == 201, r.json
    job = r.json
    assert job["failure_policy"] == {"pause_after_consecutive_failures": 2}
    assert (job["late_after_seconds"], job["capture_response_bytes"]) == (30, 4096)
    assert job["health"] == {
        "state": "ok",
        "last_success_at": None,
        "last_failure_at": None,
        "consecutive_failures": 0,
        "last_lag_ms": None,
        "late_since": None,
    }
    assert job["paused_reason"] is None
    defaults = client.post("/v1/jobs", json=_job("b")).json
    assert (defaults["failure_policy"], defaults["late_after_seconds"], defaults["capture_response_bytes"]) == (
        None,
        60,
        0,
    )
    for bad, field in (
        ({"capture_response_bytes": 4097}, "capture_response_bytes"),
        ({"late_after_seconds": 1}, "late_after_seconds"),
        (
            {"failure_policy": {"pause_after_consecutive_failures": 0}},
            "failure_policy.pause_after_consecutive_failures",
        ),
        ({"failure_policy": {"after": 3}}, "failure_policy.after"),
    ):
        r = client.post("/v1/jobs", json=_job("c", **bad))
        assert r.status_code == 400 and r.json["error"]["field"] == field, r.json
    paused = client.post("/v1/jobs/a/pause").json
    assert paused["health"]["state"] == "paused"
    assert paused["paused_reason"]["reason"] == "paused" and paused["paused_reason"]["by"] == "admin"
    assert paused["paused_reason"]["since"]
    renamed = client.patch("/v1/jobs/a", json={"name": "still paused"}).json
    assert renamed["paused_reason"] == paused["paused_reason"]
    assert client.post("/v1/jobs/a/resume").json["paused_reason"] is None
    via_doc = client.patch("/v1/jobs/b", json={"paused": True}).json
    assert via_doc["paused_reason"]["message"] == "paused in the job's definition"


def test_health_follows_the_history_writer_and_a_policy_pauses(client: FlaskClient, app: Flask) -> None:
    job = client.post("/v1/jobs", json=_job("h", failure_policy={"pause_after_consecutive_failures": 3})).json
    job2 = client.post("/v1/jobs", json=_job("other")).json
    engine = app.extensions["cronman"].store.engine
    store = PgNodeStore(engine, None)  # type: ignore[arg-type]
    inc = job["version"] and _incarnation(engine, "h")
    t = 1_790_000_000_000
    store.write_history([_row(job, t, 1, "succeeded", inc), _row(job, t + 60_000, 1, "failed", inc)])
    store.write_history([_row(job, t + 60_000, 2, "permanently_failed", inc)])
    store.write_history([_row(job, t + 60_000, 2, "permanently_failed", inc)])  # written again: no change
    h = client.get("/v1/jobs/h").json["health"]
    assert h["state"] == "failing" and h["consecutive_failures"] == 1 and h["last_lag_ms"] == 10
    assert h["last_success_at"] == "2026-09-21T14:13:20.010Z"
    listed = client.get("/v1/jobs").json["jobs"]
    assert [j["health"]["state"] for j in listed] == ["failing", "ok"] and listed[1]["id"] == job2["id"]
    store.write_history(
        [_row(job, t + 120_000, 1, "permanently_failed", inc), _row(job, t + 180_000, 1, "permanently_failed", inc)]
    )
    paused = client.get("/v1/jobs/h").json
    assert paused["paused"] and paused["paused_reason"]["reason"] == "consecutive_failures"
    assert paused["paused_reason"]["consecutive_failures"] == 3 and paused["paused_reason"]["by"] == "scheduler"
    events = client.get("/v1/jobs/h/events").json["events"]
    assert events[0]["action"] == "pause" and events[0]["actor"] == "scheduler"
    # Late until an occurrence at or after the late one is attempted.
    store.write_late([_row(job, t + 240_000, 0, "late", inc)])
    assert client.get("/v1/jobs/h").json["health"]["state"] == "paused"
    client.post("/v1/jobs/h/resume")
    late = client.get("/v1/jobs/h").json["health"]
    assert late["state"] == "late" and late["late_since"] == "2026-09-21T14:17:20Z"
    executions = client.get("/v1/jobs/h/executions").json["executions"]
    assert executions[0]["status"] == "late" and executions[0]["attempt"] == 0
    store.write_history([_row(job, t + 300_000, 1, "succeeded", inc)])
    back = client.get("/v1/jobs/h").json["health"]
    assert back["state"] == "ok" and back["consecutive_failures"] == 0


def _incarnation(engine: Any, job_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT incarnation FROM jobs WHERE id = :i"), {"i": job_id}).scalar_one())


def test_notification_rules(client: FlaskClient) -> None:
    rule = {
        "events": ["execution.permanently_failed", "job.auto_paused"],
        "selector": "team=payments",
        "target": {"type": "http", "url": "https://example.com/alerts", "headers": {"Authorization": "Bearer x"}},
        "min_interval_seconds": 120,
    }
    r = client.put("/v1/notifications/oncall", json=rule)
    assert r.status_code == 201 and r.headers["Location"] == "/v1/notifications/oncall", r.json
    assert r.json["target"]["headers"] == {"Authorization": "<redacted>"}
    assert client.put("/v1/notifications/oncall", json={**rule, "min_interval_seconds": 5}).status_code == 200
    assert client.get("/v1/notifications/oncall").json["min_interval_seconds"] == 5
    assert [n["name"] for n in client.get("/v1/notifications").json["notifications"]] == ["oncall"]
    for bad, code, field in (
        ({**rule, "events": ["execution.exploded"]}, "invalid_value", "events.0"),
        ({**rule, "events": []}, "invalid_value", "events"),
        ({**rule, "selector": "team in (a"}, "invalid_selector", "selector"),
        (
            {**rule, "target": {"type": "http", "url": "http://169.254.169.254/latest"}},
            "forbidden_address",
            "target.url",
        ),
        ({**rule, "min_interval_seconds": -1}, "invalid_value", "min_interval_seconds"),
        ({**rule, "extra": 1}, "unknown_field", "extra"),
    ):
        r = client.put("/v1/notifications/bad", json=bad)
        assert r.status_code == 400 and (r.json["error"]["code"], r.json["error"]["field"]) == (code, field), r.json
    assert client.get("/v1/notifications/bad").status_code == 404
    assert client.put("/v1/notifications/-bad", json=rule).status_code == 400
    assert client.delete("/v1/notifications/oncall").status_code == 204
    assert client.delete("/v1/notifications/oncall").status_code == 404


def test_notifications_to_cronman_own_queue_are_refused(settings: Settings, sqs_endpoint: str) -> None:
    own = "https://sqs.us-east-1.amazonaws.com/000000000000/cronman-commands"
    app = create_app(Settings(**{**settings.model_dump(), "command_queue_url": own}))
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {ADMIN_KEY}"
    r = c.put("/v1/notifications/q", json={"events": ["job.recovered"], "target": {"type": "sqs", "queue_url": own}})
    assert r.status_code == 400 and r.json["error"]["code"] == "forbidden_queue", r.json
    app.extensions["cronman"].store.engine.dispose()


# --------------------------------------------------------------------------- pure parts
def test_fold_counts_failures_in_the_order_executions_ended() -> None:
    job = {"id": "j", "namespace": "default"}
    rows = [
        _row(job, 1000, 1, "permanently_failed", 1, finished=5000),
        _row(job, 2000, 1, "succeeded", 1, finished=3000),
        _row(job, 3000, 2, "permanently_failed", 1, finished=6000),
        _row(job, 4000, 0, "late", 1),
    ]
    (d,) = fold(rows)
    assert (d.failures, d.last_success_ms, d.last_failure_ms) == (2, 3000, 6000)
    assert (d.late_first_ms, d.delivered_ms, d.last_lag_ms) == (4000, 3000, 10)
    assert (
        state_of(Health(late_since_ms=4000, last_delivered_ms=3000), paused=False, completed=False) is HealthState.LATE
    )
    assert state_of(Health(late_since_ms=4000, last_delivered_ms=4000), paused=False, completed=True) is (
        HealthState.COMPLETED
    )
    assert state_of(Health(consecutive_failures=1), paused=True, completed=False) is HealthState.PAUSED


def test_a_burst_is_summarised_once_per_interval() -> None:
    s, sent = Summary(), []
    for at in (0, 1000, 2000, 3000):
        s, emit = on_event(s, at, {"n": at}, now_ms=at, interval_ms=10_000)
        sent.append(emit)
    assert sent[0] is not None and sent[0].count == 1 and sent[1:] == [None, None, None]
    assert on_tick(s, 9_999, 10_000)[1] is None
    s, emit = on_tick(s, 10_000, 10_000)
    assert emit is not None and (emit.count, emit.first_ms, emit.at_ms, emit.detail["n"]) == (3, 1000, 3000, 3000)
    assert s.pending == 0 and s.last_sent_ms == 10_000
    s, emit = on_event(s, 25_000, {}, 25_000, 10_000)
    assert emit is not None and emit.count == 1


def test_dashboard_shows_health_paused_reason_and_responses(client: FlaskClient, app: Flask) -> None:
    from tests.ui.conftest import Browser

    job = client.post("/v1/jobs", json=_job("shown", capture_response_bytes=100)).json
    inc = _incarnation(app.extensions["cronman"].store.engine, "shown")
    row = _row(job, 1_790_000_000_000, 1, "permanently_failed", inc)._replace(response="<b>sorry</b>")
    PgNodeStore(app.extensions["cronman"].store.engine, None).write_history([row])  # type: ignore[arg-type]
    client.post("/v1/jobs/shown/pause")
    b = Browser(app)
    b.login(ADMIN_KEY)
    listing = b.get("/ui/jobs").text
    assert 'data-health="paused"' in listing
    page = b.get("/ui/jobs/shown").text
    assert 'id="paused-reason"' in page and "Paused by admin since" in page
    assert "health: paused" in page and "1 failed in a row" in page
    assert "&lt;b&gt;sorry&lt;/b&gt;" in page  # the captured answer, escaped
    client.post("/v1/jobs/shown/resume")
    assert 'data-health="failing"' in b.get("/ui/jobs").text
