"""GET /v1/jobs/{id}/events: every change made through the API is recorded, with who made it."""

from __future__ import annotations

from collections.abc import Callable

from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from tests.features.conftest import job, rows, send


def events(client: FlaskClient, job_id: str, **query: object) -> list[dict]:  # type: ignore[type-arg]
    r = client.get(f"/v1/jobs/{job_id}/events", query_string=query)
    assert r.status_code == 200, r.json
    return r.json["events"]  # type: ignore[no-any-return]


def test_every_change_is_an_event_newest_first(admin: FlaskClient) -> None:
    assert send(admin, "post", "/v1/jobs", job("audited")).status_code == 201
    send(admin, "put", "/v1/jobs/audited", job(None, payload={"v": 2}))
    send(admin, "patch", "/v1/jobs/audited", {"name": "nightly", "retry": {"max_attempts": 5}, "payload": {"v": 2}})
    admin.post("/v1/jobs/audited/pause")
    admin.post("/v1/jobs/audited/resume")
    triggered = admin.post("/v1/jobs/audited/trigger").json
    assert admin.delete("/v1/jobs/audited").status_code == 204

    got = events(admin, "audited")
    assert [e["action"] for e in got] == ["delete", "trigger", "resume", "pause", "update", "replace", "create"]
    assert {e["actor"] for e in got} == {"admin"} and {e["namespace"] for e in got} == {"default"}
    by_action = {e["action"]: e for e in got}
    assert by_action["update"]["detail"] == {"fields": ["name", "retry"]}  # payload did not change
    assert by_action["trigger"]["detail"] == {
        "execution_id": triggered["execution_id"],
        "scheduled_for": triggered["scheduled_for"],
    }
    assert by_action["create"]["detail"] is None
    assert all(e["at"].endswith("Z") and e["job_id"] == "audited" for e in got)
    assert [e["id"] for e in got] == sorted((e["id"] for e in got), reverse=True)
    # a deleted job's events stay readable; an id that never existed is a 404
    assert admin.get("/v1/jobs/never-was/events").status_code == 404
    assert admin.get("/v1/jobs/-bad-/events").status_code == 404


def test_a_namespace_key_is_named_by_its_prefix(client_for: Callable[[str], FlaskClient]) -> None:
    team_a = client_for("team-a")
    send(team_a, "post", "/v1/jobs", job("mine"))
    team_a.post("/v1/jobs/mine/pause")
    actor = f"key:{team_a.key_prefix}"  # type: ignore[attr-defined]
    assert [(e["action"], e["actor"]) for e in events(team_a, "mine")] == [("pause", actor), ("create", actor)]


def test_events_are_paged(admin: FlaskClient) -> None:
    send(admin, "post", "/v1/jobs", job("busy"))
    for _ in range(4):
        admin.post("/v1/jobs/busy/pause")
        admin.post("/v1/jobs/busy/resume")
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        query = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = admin.get("/v1/jobs/busy/events", query_string=query).json
        seen += [e["action"] for e in body["events"]]
        if not (cursor := body["next_cursor"]):
            break
    assert seen == ["resume", "pause"] * 4 + ["create"]
    for bad in ("garbage", "WzFd", "Wy0xXQ", "WzkyMjMzNzIwMzY4NTQ3NzU4MDhd"):  # [1] is fine; [-1], [2**63] not
        r = admin.get("/v1/jobs/busy/events", query_string={"cursor": bad})
        assert r.status_code == (200 if bad == "WzFd" else 400), (bad, r.json)
    assert admin.get("/v1/jobs/busy/events", query_string={"limit": 0}).status_code == 400


def test_events_of_another_namespace_are_not_found(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    send(team_b, "post", "/v1/jobs", job("b-job"))
    r = team_a.get("/v1/jobs/b-job/events")
    assert r.status_code == 404 and "team-b" not in r.get_data(as_text=True)
    # once team-b deletes it and team-a reuses the id, each sees only its own namespace's events
    team_b.delete("/v1/jobs/b-job")
    send(team_a, "post", "/v1/jobs", job("b-job"))
    assert [e["action"] for e in events(team_a, "b-job")] == ["create"]
    assert [e["action"] for e in events(team_b, "b-job")] == ["delete", "create"]
    assert [e["namespace"] for e in events(admin, "b-job")] == ["team-a", "team-b", "team-b"]


def test_refused_changes_leave_no_event(admin: FlaskClient, engine: Engine) -> None:
    send(admin, "post", "/v1/jobs", job("j"))
    assert send(admin, "post", "/v1/jobs", job("j")).status_code == 409
    assert send(admin, "patch", "/v1/jobs/j", {"schedule": {"every_seconds": 0}}).status_code == 400
    assert send(admin, "put", "/v1/jobs/j", job(None, throttle="nope")).status_code == 400
    assert admin.post("/v1/jobs/nope/pause").status_code == 404
    assert rows(engine, "SELECT action FROM job_events") == [("create",)]


def test_a_failed_event_write_undoes_the_change(admin: FlaskClient, engine: Engine) -> None:
    """The event is part of the change: if it cannot be written, the change is not made either."""
    send(admin, "post", "/v1/jobs", job("atomic"))
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE job_events ADD CONSTRAINT no_pause CHECK (action <> 'pause')"))
    assert admin.post("/v1/jobs/atomic/pause").status_code == 500
    assert admin.get("/v1/jobs/atomic").json["paused"] is False
