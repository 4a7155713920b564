"""The REST API against a real PostgreSQL and Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.integration.conftest import count

JOB: dict[str, Any] = {
    "id": "invoice-reminder-42",
    "name": "reminder",
    "schedule": {"type": "cron", "expression": "0 7 * * *", "timezone": "America/New_York"},
    "target": {
        "type": "http",
        "url": "https://example.com/hook",
        "method": "POST",
        "headers": {"X-Team": "billing"},
        "timeout_seconds": 10,
    },
    "payload": {"any": "json", "n": [1, 2, 3]},
    "retry": {"max_attempts": 3, "backoff_seconds": 1, "max_backoff_seconds": 60},
    "paused": False,
}


def post(client: FlaskClient, doc: Any, path: str = "/v1/jobs", method: str = "post", **kw: Any):  # type: ignore[no-untyped-def]
    return getattr(client, method)(path, data=json.dumps(doc), content_type="application/json", **kw)


def test_create_get_list_delete(client: FlaskClient) -> None:
    r = post(client, JOB)
    assert r.status_code == 201, r.json
    body = r.json
    assert r.headers["Location"] == "/v1/jobs/invoice-reminder-42"
    assert body["id"] == "invoice-reminder-42" and body["version"] >= 1
    assert body["payload"] == JOB["payload"]
    assert body["schedule"]["timezone"] == "America/New_York"
    assert body["next_fire_at"].endswith("Z")
    assert client.get("/v1/jobs/invoice-reminder-42").json == {**body}
    assert post(client, JOB).status_code == 409
    listed = client.get("/v1/jobs").json
    assert [j["id"] for j in listed["jobs"]] == ["invoice-reminder-42"] and listed["next_cursor"] is None
    assert client.delete("/v1/jobs/invoice-reminder-42").status_code == 204
    assert client.get("/v1/jobs/invoice-reminder-42").status_code == 404
    assert client.delete("/v1/jobs/invoice-reminder-42").status_code == 404
    # a deleted id can be used again
    assert post(client, JOB).status_code == 201


def test_a_delete_with_if_match_deletes_only_the_version_it_names(client: FlaskClient) -> None:
    created = post(client, JOB)
    version = created.json["version"]
    assert created.headers["ETag"] == f'"{version}"'
    assert client.get(f"/v1/jobs/{JOB['id']}").headers["ETag"] == f'"{version}"'
    patched = post(client, {"name": "renamed"}, f"/v1/jobs/{JOB['id']}", method="patch")
    assert patched.json["version"] > version and patched.headers["ETag"] == f'"{patched.json["version"]}"'

    stale = client.delete(f"/v1/jobs/{JOB['id']}", headers={"If-Match": f'"{version}"'})
    assert stale.status_code == 412 and stale.json["error"]["code"] == "version_mismatch"
    assert f"at version {patched.json['version']}, not {version}" in stale.json["error"]["message"]
    assert client.get(f"/v1/jobs/{JOB['id']}").json["name"] == "renamed"  # still there
    for bad in ('W/"1"', '"v1"', '""', ",", '"99999999999999999999"'):
        r = client.delete(f"/v1/jobs/{JOB['id']}", headers={"If-Match": bad})
        assert (r.status_code, r.json["error"]["code"]) == (400, "invalid_if_match"), bad
    assert client.delete("/v1/jobs/no-such-job", headers={"If-Match": '"1"'}).status_code == 404

    current = f'"{version}", "{patched.json["version"]}"'
    assert client.delete(f"/v1/jobs/{JOB['id']}", headers={"If-Match": current}).status_code == 204
    assert client.get(f"/v1/jobs/{JOB['id']}").status_code == 404
    assert post(client, JOB).status_code == 201
    assert client.delete(f"/v1/jobs/{JOB['id']}", headers={"If-Match": "*"}).status_code == 204


def test_generated_id(client: FlaskClient) -> None:
    doc = {k: v for k, v in JOB.items() if k != "id"}
    r = post(client, doc)
    assert r.status_code == 201 and r.json["id"].startswith("job-")


def test_pagination(client: FlaskClient) -> None:
    for i in range(7):
        assert post(client, {**JOB, "id": f"job-{i:02d}"}).status_code == 201
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = client.get("/v1/jobs", query_string={"limit": 3, **({"cursor": cursor} if cursor else {})}).json
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [f"job-{i:02d}" for i in range(7)]
    # a parameter named like a Flask or url_for argument is a query parameter like any other
    odd = {"limit": 3, "endpoint": "x", "_external": "1", "_anchor": "y"}
    page = client.get("/v1/jobs", query_string=odd)
    assert page.status_code == 200 and [j["id"] for j in page.json["jobs"]] == seen[:3]
    following = client.get("/v1/jobs", query_string={**odd, "cursor": page.json["next_cursor"]})
    assert following.status_code == 200 and [j["id"] for j in following.json["jobs"]] == seen[3:6]
    assert client.get("/v1/jobs/job-00/executions", query_string=odd).status_code == 200
    assert client.get("/v1/jobs/job-00/events", query_string=odd).status_code == 200
    assert client.get("/v1/jobs", query_string={"cursor": "garbage!"}).status_code == 400
    assert client.get("/v1/jobs", query_string={"limit": 0}).status_code == 400
    assert client.get("/v1/jobs", query_string={"limit": "x"}).status_code == 400


def test_put_creates_then_replaces(client: FlaskClient) -> None:
    doc = {k: v for k, v in JOB.items() if k != "id"}
    r1 = post(client, doc, "/v1/jobs/put-me", method="put")
    assert r1.status_code == 201
    r2 = post(client, {**doc, "payload": {"v": 2}}, "/v1/jobs/put-me", method="put")
    assert r2.status_code == 200 and r2.json["payload"] == {"v": 2}
    assert r2.json["version"] > r1.json["version"] and r2.json["created_at"] == r1.json["created_at"]
    assert post(client, {**doc, "id": "other"}, "/v1/jobs/put-me", method="put").status_code == 400


def test_patch_merges(client: FlaskClient) -> None:
    post(client, JOB)
    r = post(
        client,
        {"schedule": {"expression": "30 8 * * *"}, "payload": {"replaced": True}},
        "/v1/jobs/invoice-reminder-42",
        method="patch",
    )
    assert r.status_code == 200, r.json
    assert r.json["schedule"] == {
        **JOB["schedule"],
        "expression": "30 8 * * *",
        "dst_gap": "shift",
        "dst_fold": "first",
    }
    assert r.json["payload"] == {"replaced": True}
    assert r.json["target"]["headers"] == {"X-Team": "<redacted>"}  # kept; values are write-only
    # switching the schedule type replaces the schedule object whole
    r = post(
        client, {"schedule": {"type": "interval", "every_seconds": 30}}, "/v1/jobs/invoice-reminder-42", method="patch"
    )
    assert r.status_code == 200 and r.json["schedule"] == {"type": "interval", "every_seconds": 30}
    bad = post(client, {"schedule": {"every_seconds": 0}}, "/v1/jobs/invoice-reminder-42", method="patch")
    assert bad.status_code == 400 and bad.json["error"]["field"] == "schedule.every_seconds"
    assert client.get("/v1/jobs/invoice-reminder-42").json["schedule"]["every_seconds"] == 30
    assert post(client, {"name": "x"}, "/v1/jobs/absent", method="patch").status_code == 404


def test_pause_resume_trigger(client: FlaskClient) -> None:
    post(client, JOB)
    paused = client.post("/v1/jobs/invoice-reminder-42/pause").json
    assert paused["paused"] is True and paused["next_fire_at"] is None
    resumed = client.post("/v1/jobs/invoice-reminder-42/resume").json
    assert resumed["paused"] is False and resumed["next_fire_at"]
    t = client.post("/v1/jobs/invoice-reminder-42/trigger")
    assert t.status_code == 202 and t.json["execution_id"]
    assert client.post("/v1/jobs/nope/trigger").status_code == 404


def test_next_fire_times_across_dst(client: FlaskClient) -> None:
    post(
        client,
        {**JOB, "id": "dst", "schedule": {"type": "cron", "expression": "30 2 * * *", "timezone": "America/New_York"}},
    )
    r = client.get("/v1/jobs/dst/next", query_string={"after": "2026-03-07T00:00:00Z", "count": 4})
    assert r.json == {
        "next": ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
    }
    r = client.get("/v1/jobs/dst/next", query_string={"after": "2026-10-31T00:00:00Z", "count": 3})
    assert r.json == {"next": ["2026-10-31T06:30:00Z", "2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"]}
    assert client.get("/v1/jobs/dst/next", query_string={"after": "yesterday"}).status_code == 400
    assert client.get("/v1/jobs/dst/next", query_string={"count": 1000}).status_code == 400


BAD_BODIES = [
    ("malformed JSON", b'{"id": "x",', "application/json", 400, "invalid_json", None),
    ("not an object", b"[1, 2]", "application/json", 400, "invalid_json", None),
    (
        "unknown field",
        json.dumps({**JOB, "colour": "red"}).encode(),
        "application/json",
        400,
        "unknown_field",
        "colour",
    ),
    (
        "invalid cron",
        json.dumps({**JOB, "schedule": {"type": "cron", "expression": "99 * * * *"}}).encode(),
        "application/json",
        400,
        "invalid_cron",
        "schedule.expression",
    ),
    (
        "unknown time zone",
        json.dumps({**JOB, "schedule": {**JOB["schedule"], "timezone": "Mars/Olympus"}}).encode(),
        "application/json",
        400,
        "invalid_timezone",
        "schedule.timezone",
    ),
    (
        "missing URL",
        json.dumps({**JOB, "target": {"type": "http"}}).encode(),
        "application/json",
        400,
        "missing_field",
        "target.url",
    ),
    (
        "non-positive interval",
        json.dumps({**JOB, "schedule": {"type": "interval", "every_seconds": 0}}).encode(),
        "application/json",
        400,
        "invalid_value",
        "schedule.every_seconds",
    ),
    ("over-long id", json.dumps({**JOB, "id": "a" * 200}).encode(), "application/json", 400, "invalid_value", "id"),
    ("non-JSON content type", json.dumps(JOB).encode(), "text/plain", 415, "unsupported_media_type", "Content-Type"),
    ("no content type", json.dumps(JOB).encode(), None, 415, "unsupported_media_type", "Content-Type"),
    ("body too large", b'{"x": "' + b"a" * (2 * 1024 * 1024) + b'"}', "application/json", 413, None, None),
]


@pytest.mark.parametrize(
    ("case", "body", "ctype", "status", "code", "field"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES]
)
def test_bad_input_is_a_4xx_and_stores_nothing(
    client: FlaskClient,
    db,
    case: str,
    body: bytes,  # type: ignore[no-untyped-def]
    ctype: str | None,
    status: int,
    code: str | None,
    field: str | None,
) -> None:
    headers = {"Content-Type": ctype} if ctype else {}
    for method, path in (("post", "/v1/jobs"), ("put", "/v1/jobs/invoice-reminder-42")):
        r = getattr(client, method)(path, data=body, headers=headers)
        assert r.status_code == status, (case, r.json)
        err = r.json["error"]
        assert err["message"] and (code is None or err["code"] == code), err
        if field is not None and not (method == "put" and field == "id"):
            assert err["field"] == field, err
    assert count(db, "SELECT count(*) FROM jobs") == 0


def test_errors_are_json_never_html(client: FlaskClient) -> None:
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json["error"]["code"] == "not_found"
    r = client.patch("/v1/jobs")
    assert r.status_code == 405 and r.json["error"]["code"]


def test_executions_of_unknown_job_is_404(client: FlaskClient) -> None:
    assert client.get("/v1/jobs/ghost/executions").status_code == 404
    post(client, JOB)
    r = client.get("/v1/jobs/invoice-reminder-42/executions")
    assert r.json == {"executions": [], "next_cursor": None}
    assert client.get("/v1/jobs/invoice-reminder-42/executions", query_string={"cursor": "bad"}).status_code == 400


def test_openapi_describes_every_endpoint(client: FlaskClient) -> None:
    from openapi_spec_validator import validate

    doc = client.get("/openapi.json").json
    validate(doc)
    assert {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/next",
        "/v1/jobs/{job_id}/executions",
        "/v1/jobs/{job_id}/pause",
        "/v1/jobs/{job_id}/resume",
        "/v1/jobs/{job_id}/trigger",
        "/v1/cluster",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert {"CronSchedule", "IntervalSchedule", "OnceSchedule", "HttpTarget", "SqsTarget"} <= set(schemas)


def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").json == {"status": "ok"}
    assert client.get("/readyz").json["status"] == "ready"
    assert client.get("/v1/cluster").json == {"replication_factor": 2, "slots": 4096, "nodes": []}


# -- instants at the edges of what can be computed --------------------------------------------------

EDGE_INSTANTS = [
    (
        "cron start_at in year 1",
        {"type": "cron", "expression": "0 7 * * *", "start_at": "0001-01-01T00:00:00Z"},
        "schedule.start_at",
    ),
    (
        "end_at in year 9999",
        {"type": "interval", "every_seconds": 60, "end_at": "9999-12-31T23:59:59Z"},
        "schedule.end_at",
    ),
    (
        "start_at before 1970",
        {"type": "interval", "every_seconds": 60, "start_at": "1969-12-31T23:59:59Z"},
        "schedule.start_at",
    ),
    (
        "once at 9999-12-31 with jitter",
        {"type": "once", "at": "9999-12-31T00:00:00Z", "jitter_seconds": 3600},
        "schedule.at",
    ),
    (
        "once whose jitter crosses the limit",
        {"type": "once", "at": "8999-12-31T23:59:00Z", "jitter_seconds": 3600},
        "schedule.at",
    ),
    ("once in year 1 with an offset", {"type": "once", "at": "0001-01-01T00:00:00+01:00"}, "schedule.at"),
]


@pytest.mark.parametrize(("case", "schedule", "field"), EDGE_INSTANTS, ids=[c[0] for c in EDGE_INSTANTS])
def test_an_instant_outside_what_can_be_computed_is_a_400(
    client: FlaskClient,
    db,
    case: str,
    schedule: dict[str, Any],
    field: str,  # type: ignore[no-untyped-def]
) -> None:
    doc = {**JOB, "id": "edge", "schedule": schedule}
    for method, path in (("post", "/v1/jobs"), ("put", "/v1/jobs/edge")):
        r = post(client, doc, path, method)
        assert r.status_code == 400, (case, r.json)
        assert r.json["error"]["field"] == field and "9000-01-01T00:00:00Z" in r.json["error"]["message"], r.json
    assert count(db, "SELECT count(*) FROM jobs") == 0
    assert post(client, JOB).status_code == 201
    r = post(client, {"schedule": schedule}, "/v1/jobs/invoice-reminder-42", "patch")
    assert (r.status_code, r.json["error"]["field"]) == (400, field)
    assert client.get("/v1/jobs").status_code == 200


def test_the_latest_instant_accepted_still_computes(client: FlaskClient) -> None:
    doc = {**JOB, "id": "late", "schedule": {"type": "once", "at": "8999-12-31T22:00:00Z", "jitter_seconds": 3600}}
    r = post(client, doc)
    assert r.status_code == 201, r.json
    assert r.json["next_fire_at"].startswith("8999-12-31T2")
    assert client.get("/v1/jobs").status_code == 200
    cron = {
        **JOB,
        "id": "late-cron",
        "schedule": {"type": "cron", "expression": "0 0 29 2 *", "start_at": "8999-06-01T00:00:00Z"},
    }
    r = post(client, cron)
    assert r.status_code == 201 and r.json["next_fire_at"] == "9004-02-29T00:00:00Z", r.json


@pytest.mark.parametrize(
    "after",
    [
        "9999-12-31T23:59:30Z",
        "0001-01-01T00:00:00+01:00",
        "1969-12-31T23:59:59Z",
        "9000-01-01T00:00:00Z",
        "+999999-01-01T00:00:00Z",
    ],
)
def test_next_after_an_instant_outside_the_range_is_a_400(client: FlaskClient, after: str) -> None:
    post(client, JOB)
    r = client.get("/v1/jobs/invoice-reminder-42/next", query_string={"after": after, "count": 100})
    assert r.status_code == 400 and r.json["error"]["field"] == "after", r.json
    r = client.get("/v1/jobs/invoice-reminder-42/next", query_string={"after": "8999-12-31T23:59:59Z", "count": 100})
    assert r.status_code == 200 and len(r.json["next"]) == 100 and r.json["next"][-1].startswith("9000-04-")


@pytest.mark.parametrize(
    "parts", [[-1, 0, 1], [2**62, 0, 1], [0, -1, 1], [0, 0, 2**40], [253402300800000, 0, 1]], ids=str
)
def test_a_history_cursor_outside_the_range_is_a_400(client: FlaskClient, parts: list[int]) -> None:
    from cronman.store.store import encode_cursor

    post(client, JOB)
    r = client.get("/v1/jobs/invoice-reminder-42/executions", query_string={"cursor": encode_cursor(parts)})
    assert r.status_code == 400 and r.json["error"]["field"] == "cursor", r.json


# Rows no API of today would accept; True: the next time cannot be computed at all.
HOSTILE_SCHEDULES = [
    ({"type": "once", "at": "9999-12-31T23:59:59Z", "jitter_seconds": 3600}, False),  # what an older API stored
    ({"type": "cron", "expression": "0 7 * * *", "start_at": "0001-01-01T00:00:00Z"}, False),
    ({"type": "interval", "every_seconds": 60, "start_at": "9999-12-31T23:59:00Z"}, False),
    ({"type": "cron", "expression": "not cron at all"}, True),
    ({"type": "weekly"}, True),
    ({"type": "once"}, True),
]


@pytest.mark.parametrize(("schedule", "broken"), HOSTILE_SCHEDULES, ids=lambda s: json.dumps(s))
def test_no_stored_job_breaks_a_read(
    client: FlaskClient,
    db,  # type: ignore[no-untyped-def]
    schedule: dict[str, Any],
    broken: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A row written straight into the database: every read still answers, and the job whose next
    time cannot be computed shows none and is logged once, however often it is read."""
    from sqlalchemy import text

    for job_id in ("a-before", "z-after"):
        assert post(client, {**JOB, "id": job_id}).status_code == 201
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, namespace, schedule, target, payload, retry, slot, version, change_xid) "
                "VALUES ('m-hostile', 'default', CAST(:s AS jsonb), CAST(:t AS jsonb), '{}', '{}', 1, "
                "nextval('jobs_version_seq'), pg_current_xact_id()::text::bigint)"
            ),
            {"s": json.dumps(schedule), "t": json.dumps(JOB["target"])},
        )
    caplog.set_level("WARNING", logger="cronman.api.jobs")
    for _ in range(2):
        listed = client.get("/v1/jobs")
        assert listed.status_code == 200, listed.json
        assert [j["id"] for j in listed.json["jobs"]] == ["a-before", "m-hostile", "z-after"]
        assert all(j["next_fire_at"] for j in listed.json["jobs"] if j["id"] != "m-hostile")
    hostile = client.get("/v1/jobs/m-hostile")
    assert hostile.status_code == 200, hostile.json
    assert client.get("/v1/jobs", query_string={"limit": 1}).status_code == 200
    for after in (None, "2026-01-01T00:00:00Z", "8999-12-31T23:59:59Z"):
        r = client.get("/v1/jobs/m-hostile/next", query_string={"count": 100, **({"after": after} if after else {})})
        assert r.status_code == 200, r.json
    r = post(client, {"name": "renamed"}, "/v1/jobs/m-hostile", "patch")
    assert r.status_code == 400 and r.json["error"]["field"].startswith("schedule"), r.json
    logged = [rec for rec in caplog.records if getattr(rec, "job_id", None) == "m-hostile"]
    assert len(logged) <= 1, [r.getMessage() for r in logged]
    if broken:
        assert hostile.json["next_fire_at"] is None and len(logged) == 1


# -- a once job in the past --------------------------------------------------------------------------


def _once(job_id: str, at: str) -> dict[str, Any]:
    return {**JOB, "id": job_id, "schedule": {"type": "once", "at": at}}


def test_a_once_job_in_the_past_is_refused(client: FlaskClient, db) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import text

    past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    for method, path in (("post", "/v1/jobs"), ("put", "/v1/jobs/late")):
        r = post(client, _once("late", past), path, method)
        assert r.status_code == 400, r.json
        assert r.json["error"]["field"] == "schedule.at" and "in the past" in r.json["error"]["message"], r.json
    assert count(db, "SELECT count(*) FROM jobs") == 0

    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert post(client, _once("done", soon)).status_code == 201
    # time passes: the job has fired and is completed
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE jobs SET schedule = jsonb_set(schedule, '{at}', to_jsonb(CAST(:at AS text))) WHERE id = 'done'"
            ),
            {"at": "2026-01-01T00:00:00Z"},
        )
    assert client.get("/v1/jobs/done").json["state"] == "completed"
    r = post(client, {"name": "renamed after it fired", "paused": True}, "/v1/jobs/done", "patch")
    assert r.status_code == 200 and r.json["name"] == "renamed after it fired", r.json
    got = client.get("/v1/jobs/done").json
    replaced = {k: got[k] for k in ("schedule", "target", "payload", "retry")}
    replaced["target"]["headers"] = JOB["target"]["headers"]
    assert post(client, {**replaced, "name": "put back"}, "/v1/jobs/done", "put").status_code == 200
    r = post(client, {"schedule": {"at": "2026-01-01T00:00:01Z"}}, "/v1/jobs/done", "patch")
    assert r.status_code == 400 and r.json["error"]["field"] == "schedule.at", r.json
    assert post(client, {"schedule": {"at": soon}}, "/v1/jobs/done", "patch").status_code == 200


def test_the_cluster_view_lists_an_overdue_node_as_such_owning_no_slot(client: FlaskClient) -> None:
    """A node whose heartbeat was not refreshed for two intervals and 1 s (2 s at the test's
    0.5 s interval) still has a live heartbeat until its TTL: listed, overdue, owning nothing."""
    svc = client.application.extensions["cronman"]
    r = svc.redis
    now_s, now_us = r.time()
    now = int(now_s) * 1000 + int(now_us) // 1000
    info = json.dumps({"ready": True, "jobs": 3})
    r.hset(svc.keys.members, "node-fresh", f"{now + 30_000}|{now - 100}|{info}")
    r.hset(svc.keys.members, "node-late", f"{now + 30_000}|{now - 2_500}|{info}")
    nodes = {n["id"]: n for n in client.get("/v1/cluster").json["nodes"]}
    assert set(nodes) == {"node-fresh", "node-late"}
    assert nodes["node-late"]["overdue"] and nodes["node-late"]["slots_owned"] == 0
    assert not nodes["node-fresh"]["overdue"] and nodes["node-fresh"]["slots_owned"] == 4096
