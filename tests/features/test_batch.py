"""POST /v1/jobs:batch: many jobs created or replaced in one request, each judged on its own."""

from __future__ import annotations

from collections.abc import Callable

from flask.testing import FlaskClient
from sqlalchemy import Engine

from tests.features.conftest import Notifications, job, rows, send


def batch(client: FlaskClient, jobs: list, path: str = "/v1/jobs:batch"):  # type: ignore[no-untyped-def,type-arg]
    return send(client, "post", path, {"jobs": jobs})


def test_creates_and_replaces_with_a_result_per_item(admin: FlaskClient) -> None:
    assert send(admin, "post", "/v1/jobs", job("old", payload={"v": 1})).status_code == 201
    r = batch(admin, [job("new-1"), job("old", payload={"v": 2}), job("new-2")])
    assert r.status_code == 200, r.json
    assert r.json == {
        "results": [
            {"index": 0, "id": "new-1", "status": 201, "error": None},
            {"index": 1, "id": "old", "status": 200, "error": None},
            {"index": 2, "id": "new-2", "status": 201, "error": None},
        ],
        "created": 2,
        "replaced": 1,
        "failed": 0,
    }
    assert admin.get("/v1/jobs/old").json["payload"] == {"v": 2}
    listed = admin.get("/v1/jobs").json["jobs"]
    assert [(j["id"], j["namespace"]) for j in listed] == [
        ("new-1", "default"),
        ("new-2", "default"),
        ("old", "default"),
    ]
    assert listed[0]["next_fire_at"]


def test_invalid_items_do_not_stop_valid_ones(admin: FlaskClient, engine: Engine) -> None:
    items = [
        job("good-1"),
        job("bad-cron", schedule={"type": "cron", "expression": "99 * * * *"}),
        "not an object",
        job("good-2"),
        job("bad-field", colour="red"),
        job("bad-url", url="http://169.254.169.254/latest/meta-data"),
    ]
    r = batch(admin, items)
    assert r.status_code == 200
    body = r.json
    assert (body["created"], body["replaced"], body["failed"]) == (2, 0, 4)
    by_index = {x["index"]: x for x in body["results"]}
    assert [by_index[i]["status"] for i in range(6)] == [201, 400, 400, 201, 400, 400]
    assert by_index[1]["id"] == "bad-cron" and by_index[1]["error"]["code"] == "invalid_cron"
    assert by_index[1]["error"]["field"] == "schedule.expression"
    assert by_index[2]["id"] is None and by_index[2]["error"]["code"] == "invalid_json"
    assert by_index[4]["error"] == {"code": "unknown_field", "message": "unknown field 'colour'", "field": "colour"}
    assert by_index[5]["error"]["code"] == "forbidden_address"
    assert [r[0] for r in rows(engine, "SELECT id FROM jobs ORDER BY id")] == ["good-1", "good-2"]


def test_missing_ids_are_generated_and_duplicates_refused(admin: FlaskClient) -> None:
    r = batch(admin, [job(None), job(None), job("twice"), job("twice", payload={"second": True})])
    results = r.json["results"]
    generated = [x["id"] for x in results[:2]]
    assert all(i.startswith("job-") for i in generated) and generated[0] != generated[1]
    assert [x["status"] for x in results] == [201, 201, 201, 400]
    assert results[3]["error"]["code"] == "duplicate_id" and results[3]["error"]["field"] == "id"
    for job_id in generated:
        assert admin.get(f"/v1/jobs/{job_id}").status_code == 200
    assert admin.get("/v1/jobs/twice").json["payload"] == {"n": 1}


def test_the_request_itself_is_checked(admin: FlaskClient) -> None:
    too_many = [job(f"j-{i}") for i in range(1001)]
    r = batch(admin, too_many)
    assert r.status_code == 400 and r.json["error"]["code"] == "too_large" and r.json["error"]["field"] == "jobs"
    assert admin.get("/v1/jobs").json["jobs"] == []
    for body, code in (
        ({}, "missing_field"),
        ({"jobs": {"a": 1}}, "invalid_type"),
        ({"jobs": [], "extra": 1}, "unknown_field"),
    ):
        r = send(admin, "post", "/v1/jobs:batch", body)
        assert r.status_code == 400 and r.json["error"]["code"] == code, (body, r.json)
    r = admin.post("/v1/jobs:batch", data="{}", content_type="text/plain")
    assert r.status_code == 415
    assert batch(admin, []).json == {"results": [], "created": 0, "replaced": 0, "failed": 0}


def test_a_full_batch_of_1000_in_one_request(admin: FlaskClient, engine: Engine) -> None:
    r = batch(admin, [job(f"bulk-{i:04d}") for i in range(1000)])
    assert r.status_code == 200 and r.json["created"] == 1000 and r.json["failed"] == 0
    assert rows(engine, "SELECT count(*) FROM jobs")[0][0] == 1000
    assert rows(engine, "SELECT count(*) FROM job_events WHERE action = 'create'")[0][0] == 1000
    # versions are distinct: the nodes' change feed tells every job apart
    assert rows(engine, "SELECT count(DISTINCT version) FROM jobs")[0][0] == 1000


def test_one_change_notification_for_the_whole_batch(admin: FlaskClient, notifications: Notifications) -> None:
    assert batch(admin, [job(f"n-{i}") for i in range(50)]).json["created"] == 50
    assert notifications.settle() == 1
    assert batch(admin, [job(None, colour="red")]).json["failed"] == 1
    assert notifications.settle() == 1  # nothing changed, nothing to tell


def test_namespace_rules_are_those_of_put(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    assert send(team_b, "post", "/v1/jobs", job("b-job")).status_code == 201
    r = batch(team_a, [job("a-job"), job("b-job", payload={"hijacked": True})])
    assert [x["status"] for x in r.json["results"]] == [201, 409]
    assert r.json["results"][1]["error"]["code"] == "conflict" and "team-b" not in r.get_data(as_text=True)
    assert team_b.get("/v1/jobs/b-job").json["payload"] == {"n": 1}
    assert team_a.get("/v1/jobs/a-job").json["namespace"] == "team-a"
    assert batch(team_a, [job("x")], "/v1/jobs:batch?namespace=team-b").status_code == 403
    # the admin: into a named namespace, or the default; replacing keeps a job's namespace
    r = batch(admin, [job("for-c")], "/v1/jobs:batch?namespace=team-c")
    assert r.json["created"] == 1 and admin.get("/v1/jobs/for-c").json["namespace"] == "team-c"
    r = batch(admin, [job("b-job", payload={"v": 2}), job("fresh")])
    assert [x["status"] for x in r.json["results"]] == [200, 201]
    assert admin.get("/v1/jobs/b-job").json["namespace"] == "team-b"
    assert admin.get("/v1/jobs/fresh").json["namespace"] == "default"
    r = batch(admin, [job("b-job")], "/v1/jobs:batch?namespace=team-a")
    assert r.json["results"][0]["status"] == 409


def test_redacted_header_values_are_kept_as_with_put(admin: FlaskClient, engine: Engine) -> None:
    secret = {"type": "http", "url": "https://example.com/hook", "headers": {"Authorization": "Bearer s3cret"}}
    assert send(admin, "post", "/v1/jobs", job("h", target=secret)).status_code == 201
    shown = admin.get("/v1/jobs/h").json
    assert shown["target"]["headers"] == {"Authorization": "<redacted>"}
    doc = {k: shown[k] for k in ("id", "schedule", "target", "payload")}
    r = batch(admin, [{**doc, "payload": {"v": 2}}, job("other", target={**secret, "headers": {"X": "<redacted>"}})])
    assert [x["status"] for x in r.json["results"]] == [200, 400]
    assert r.json["results"][1]["error"]["code"] == "invalid_header"
    stored = rows(engine, "SELECT target->'headers'->>'Authorization' FROM jobs WHERE id = 'h'")[0][0]
    assert stored == "Bearer s3cret"


def test_replaced_and_created_jobs_are_recorded_as_events(admin: FlaskClient) -> None:
    assert send(admin, "post", "/v1/jobs", job("ev")).status_code == 201
    batch(admin, [job("ev", payload={"v": 2}), job("ev-new")])
    events = admin.get("/v1/jobs/ev/events").json["events"]
    assert [(e["action"], e["actor"], e["detail"]) for e in events] == [
        ("replace", "admin", {"batch": True}),
        ("create", "admin", None),
    ]
    assert admin.get("/v1/jobs/ev-new/events").json["events"][0]["action"] == "create"
