"""Work that finishes later reports through the API: ``POST /v1/executions/{id}:complete`` and
``:heartbeat``, authorised by the namespace's key or by the completion token alone; what is
refused (another namespace, a forged or earlier token, a passed deadline, an unknown id, a second
report, bad bodies) changes nothing. The async_runs rows are written here as a scheduler node
writes them before sending an attempt."""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from cronman.store.partitions import run_maintenance
from tests.clients import keyed
from tests.features.conftest import job, rows, send

COMPLETE = "/v1/executions/{}:complete"
HEARTBEAT = "/v1/executions/{}:heartbeat"


@dataclass
class Run:
    execution_id: str
    token: str
    job_id: str
    namespace: str


def start_attempt(
    engine: Engine,
    namespace: str,
    job_id: str,
    *,
    execution_id: str | None = None,
    attempt: int = 1,
    deadline_s: float = 3600,
    timeout_s: float = 3600,
    heartbeat_ms: int | None = None,
    started_ago_s: float = 0,
) -> Run:
    """What a node writes before sending an attempt: the row, and the token it sends with it."""
    exec_id = execution_id or str(uuid.uuid4())
    token = secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO async_runs (execution_id, namespace, job_id, scheduled_for, event_index, trigger, "
                "attempt, status, token_hash, started_at, deadline_at, timeout_at, heartbeat_ms) VALUES "
                "(:e, :ns, :job, now() - make_interval(secs => :ago), 0, 'schedule', :attempt, 'running', :hash, "
                "now() - make_interval(secs => :ago), now() + make_interval(secs => :deadline), "
                "now() + make_interval(secs => :timeout), :hb) "
                "ON CONFLICT (execution_id) DO UPDATE SET attempt = EXCLUDED.attempt, status = 'running', "
                "token_hash = EXCLUDED.token_hash, started_at = EXCLUDED.started_at, "
                "deadline_at = EXCLUDED.deadline_at, timeout_at = EXCLUDED.timeout_at, reported_at = NULL, "
                "output = NULL, reported_by = NULL"
            ),
            {
                "e": exec_id,
                "ns": namespace,
                "job": job_id,
                "attempt": attempt,
                "hash": hashlib.sha256(token.encode()).digest(),
                "ago": started_ago_s,
                "deadline": deadline_s,
                "timeout": timeout_s,
                "hb": heartbeat_ms,
            },
        )
    return Run(exec_id, token, job_id, namespace)


def stored(engine: Engine, execution_id: str) -> dict[str, Any]:
    found = rows(engine, "SELECT * FROM async_runs WHERE execution_id = :e", e=execution_id)
    return dict(found[0]._mapping)


def with_token(app: Flask, token: str) -> FlaskClient:
    """A client with no key, sending the completion token."""
    client = keyed(app, None)
    client.environ_base["HTTP_CRONMAN_COMPLETION_TOKEN"] = token
    return client


ASYNC = {"completion": {"mode": "callback", "timeout_seconds": 3600, "heartbeat_seconds": 60}}


@pytest.fixture
def team_a(client_for: Callable[[str], FlaskClient]) -> FlaskClient:
    client = client_for("team-a")
    assert send(client, "post", "/v1/jobs", job("work", **ASYNC)).status_code == 201
    return client


def test_the_work_completes_with_its_token_alone(app: Flask, engine: Engine, team_a: FlaskClient) -> None:
    run = start_attempt(engine, "team-a", "work")
    worker = with_token(app, run.token)
    r = send(worker, "post", COMPLETE.format(run.execution_id), {"status": "succeeded", "output": "42 rows"})
    assert r.status_code == 200, r.json
    body = r.json
    assert body.pop("reported_at") is not None
    assert body == {
        "execution_id": run.execution_id,
        "job_id": "work",
        "namespace": "team-a",
        "attempt": 1,
        "status": "succeeded",
        "output": "42 rows",
        "duplicate": False,
    }
    row = stored(engine, run.execution_id)
    assert (row["status"], row["output"], row["reported_by"]) == ("succeeded", "42 rows", "token")

    # the same report again: answered as before, nothing changes
    again = send(worker, "post", COMPLETE.format(run.execution_id), {"status": "succeeded", "output": "other"})
    assert again.status_code == 200 and again.json["duplicate"] is True
    assert again.json["output"] == "42 rows"
    assert stored(engine, run.execution_id) == row

    # another end: refused, naming the one recorded
    other = send(worker, "post", COMPLETE.format(run.execution_id), {"status": "failed"})
    assert other.status_code == 409 and other.json["error"]["code"] == "already_completed"
    assert "already completed as succeeded" in other.json["error"]["message"]
    assert stored(engine, run.execution_id) == row
    # a heartbeat after the end too
    hb = send(worker, "post", HEARTBEAT.format(run.execution_id))
    assert hb.status_code == 409 and hb.json["error"]["code"] == "already_completed"


def test_the_namespace_key_and_the_admin_key_complete_too(
    admin: FlaskClient, engine: Engine, team_a: FlaskClient
) -> None:
    run = start_attempt(engine, "team-a", "work")
    r = send(team_a, "post", COMPLETE.format(run.execution_id), {"status": "failed", "output": "disk full"})
    assert r.status_code == 200, r.json
    assert stored(engine, run.execution_id)["reported_by"] == f"key:{team_a.key_prefix}"  # type: ignore[attr-defined]
    run2 = start_attempt(engine, "team-a", "work")
    r = send(admin, "post", COMPLETE.format(run2.execution_id), {"status": "succeeded"})
    assert r.status_code == 200 and r.json["output"] is None
    assert stored(engine, run2.execution_id)["reported_by"] == "admin"
    # a key holder that sends the token too is held to its attempt
    run3 = start_attempt(engine, "team-a", "work")
    r = send(
        team_a,
        "post",
        COMPLETE.format(run3.execution_id),
        {"status": "succeeded"},
        headers={"Cronman-Completion-Token": run.token},
    )
    assert r.status_code == 403 and r.json["error"]["code"] == "invalid_token"
    assert stored(engine, run3.execution_id)["status"] == "running"


def test_refused_and_nothing_changes(
    app: Flask, engine: Engine, team_a: FlaskClient, client_for: Callable[[str], FlaskClient]
) -> None:
    run = start_attempt(engine, "team-a", "work")
    before = stored(engine, run.execution_id)
    path = COMPLETE.format(run.execution_id)
    done = {"status": "succeeded"}

    # another namespace's key: not found, as if there were no such execution
    team_b = client_for("team-b")
    r = send(team_b, "post", path, done)
    assert r.status_code == 404 and r.json["error"]["code"] == "not_found"
    assert "team-a" not in r.json["error"]["message"]
    assert send(team_b, "post", HEARTBEAT.format(run.execution_id)).status_code == 404
    assert send(team_b, "get", f"/v1/executions/{run.execution_id}").status_code == 404

    # a forged token
    r = send(with_token(app, "forged-" + run.token), "post", path, done)
    assert r.status_code == 403 and r.json["error"]["code"] == "invalid_token"
    assert run.execution_id in r.json["error"]["message"]
    # no key and no token: the usual 401
    r = send(keyed(app, None), "post", path, done)
    assert r.status_code == 401 and r.json["error"]["code"] == "unauthorized"
    # a token opens nothing else
    r = send(with_token(app, run.token), "get", "/v1/jobs/work")
    assert r.status_code == 401
    r = send(with_token(app, run.token), "get", f"/v1/executions/{run.execution_id}")
    assert r.status_code == 401
    # unknown ids, and ids that are no UUID
    for unknown in (str(uuid.uuid4()), "not-a-uuid"):
        r = send(team_a, "post", COMPLETE.format(unknown), done)
        assert r.status_code == 404 and r.json["error"]["code"] == "not_found", r.json
        r = send(with_token(app, run.token), "post", COMPLETE.format(unknown), done)
        assert r.status_code == 404
    assert stored(engine, run.execution_id) == before


def test_a_token_of_an_earlier_attempt_and_a_passed_deadline(app: Flask, engine: Engine, team_a: FlaskClient) -> None:
    first = start_attempt(engine, "team-a", "work", attempt=1)
    second = start_attempt(engine, "team-a", "work", execution_id=first.execution_id, attempt=2)
    path = COMPLETE.format(first.execution_id)
    r = send(with_token(app, first.token), "post", path, {"status": "succeeded"})
    assert r.status_code == 403 and r.json["error"]["code"] == "invalid_token"
    assert "earlier attempt" in r.json["error"]["message"]

    # the deadline passed (the node has not timed the attempt out yet): refused, the row unchanged
    late = start_attempt(engine, "team-a", "work", started_ago_s=120, deadline_s=-5, timeout_s=600)
    before = stored(engine, late.execution_id)
    for url in (COMPLETE.format(late.execution_id), HEARTBEAT.format(late.execution_id)):
        r = send(with_token(app, late.token), "post", url, {"status": "succeeded"} if "complete" in url else None)
        assert r.status_code == 409 and r.json["error"]["code"] == "deadline_passed", r.json
        assert "attempt 1 of execution" in r.json["error"]["message"]
        assert "retry follows" in r.json["error"]["message"]
    assert stored(engine, late.execution_id) == before

    # timed out by the node
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE async_runs SET status = 'timed_out' WHERE execution_id = :e"), {"e": second.execution_id}
        )
    r = send(with_token(app, second.token), "post", path, {"status": "succeeded"})
    assert r.status_code == 409 and r.json["error"]["code"] == "timed_out"
    assert stored(engine, second.execution_id)["status"] == "timed_out"


def test_heartbeats_move_the_deadline_never_past_the_timeout(app: Flask, engine: Engine, team_a: FlaskClient) -> None:
    run = start_attempt(engine, "team-a", "work", deadline_s=10, timeout_s=1000, heartbeat_ms=60_000)
    worker = with_token(app, run.token)
    before = stored(engine, run.execution_id)
    r = worker.post(HEARTBEAT.format(run.execution_id))
    assert r.status_code == 200, r.json
    assert set(r.json) == {"execution_id", "attempt", "deadline_at", "timeout_at"}
    after = stored(engine, run.execution_id)
    assert after["last_heartbeat_at"] is not None
    moved = (after["deadline_at"] - before["deadline_at"]).total_seconds()
    assert 45 <= moved <= 51, moved  # now + 60 s, from now + 10 s
    assert after["timeout_at"] == before["timeout_at"]
    # {} is a heartbeat too; near the timeout the deadline stops at it
    near = start_attempt(engine, "team-a", "work", deadline_s=10, timeout_s=20, heartbeat_ms=60_000)
    r = send(with_token(app, near.token), "post", HEARTBEAT.format(near.execution_id), {})
    assert r.status_code == 200, r.json
    assert r.json["deadline_at"] == r.json["timeout_at"]
    # without heartbeat_seconds the deadline stays
    plain = start_attempt(engine, "team-a", "work", deadline_s=100, timeout_s=100)
    r = send(team_a, "post", HEARTBEAT.format(plain.execution_id))
    assert r.status_code == 200
    assert stored(engine, plain.execution_id)["deadline_at"] == stored(engine, plain.execution_id)["timeout_at"]
    # a body with fields is refused
    r = send(worker, "post", HEARTBEAT.format(run.execution_id), {"progress": 50})
    assert r.status_code == 400 and r.json["error"]["code"] == "unknown_field"


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"not json", "application/json", 400, "invalid_json"),
        (b"[]", "application/json", 400, "invalid_json"),
        (json.dumps({"status": "succeeded"}).encode(), "text/plain", 415, "unsupported_media_type"),
        (json.dumps({}).encode(), "application/json", 400, "missing_field"),
        (json.dumps({"status": "done"}).encode(), "application/json", 400, "invalid_value"),
        (json.dumps({"status": "running"}).encode(), "application/json", 400, "invalid_value"),
        (json.dumps({"status": "succeeded", "extra": 1}).encode(), "application/json", 400, "unknown_field"),
        (json.dumps({"status": "succeeded", "output": 5}).encode(), "application/json", 400, "invalid_type"),
        (json.dumps({"status": "succeeded", "output": "a\x00b"}).encode(), "application/json", 400, "invalid_value"),
        (json.dumps({"status": "failed", "output": "é" * 2049}).encode(), "application/json", 400, "too_large"),
        (b'{"status": "failed", "output": "\\ud800"}', "application/json", 400, "invalid_value"),
    ],
)
def test_bad_reports_are_refused(
    app: Flask, engine: Engine, team_a: FlaskClient, body: bytes, content_type: str, status: int, code: str
) -> None:
    run = start_attempt(engine, "team-a", "work")
    before = stored(engine, run.execution_id)
    r = with_token(app, run.token).post(COMPLETE.format(run.execution_id), data=body, content_type=content_type)
    assert r.status_code == status, r.json
    assert r.json["error"]["code"] == code
    assert stored(engine, run.execution_id) == before


def test_the_largest_output_is_taken(app: Flask, engine: Engine, team_a: FlaskClient) -> None:
    run = start_attempt(engine, "team-a", "work")
    output = "é" * 2048  # 4096 bytes
    r = send(
        with_token(app, run.token), "post", COMPLETE.format(run.execution_id), {"status": "failed", "output": output}
    )
    assert r.status_code == 200 and r.json["output"] == output


def test_the_execution_shows_where_it_stands(engine: Engine, team_a: FlaskClient) -> None:
    run = start_attempt(engine, "team-a", "work", heartbeat_ms=60_000)
    r = send(team_a, "get", f"/v1/executions/{run.execution_id}")
    assert r.status_code == 200, r.json
    assert r.json["status"] == "running" and r.json["job_id"] == "work" and r.json["attempt"] == 1
    assert r.json["deadline_at"] is not None and r.json["reported_at"] is None


def _history(engine: Engine, run: Run, status: str, attempt: int = 1) -> None:
    """The row a node writes when an attempt ends (as for any execution)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (job_id, scheduled_for, event_index, attempt, trigger, execution_id, "
                "status, namespace) SELECT job_id, scheduled_for, event_index, :a, trigger, execution_id, :s, "
                "namespace FROM async_runs WHERE execution_id = :e"
            ),
            {"e": run.execution_id, "s": status, "a": attempt},
        )


def _upstreams(engine: Engine, run: Run, ids: list[str], jobs: list[str]) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO execution_upstreams (execution_id, namespace, job_id, upstream_jobs, upstream_ids) "
                "VALUES (:e, :ns, :job, :jobs, :ids)"
            ),
            {"e": run.execution_id, "ns": run.namespace, "job": run.job_id, "jobs": jobs, "ids": ids},
        )


def test_the_executions_list_shows_running_work_and_upstreams(engine: Engine, team_a: FlaskClient) -> None:
    # (times after the job's creation: the history of its current incarnation)
    ended = start_attempt(engine, "team-a", "work", started_ago_s=-1)
    _history(engine, ended, "succeeded")
    retried = start_attempt(engine, "team-a", "work", started_ago_s=-2)
    _history(engine, retried, "failed")  # attempt 1 failed (timed out); attempt 2 is running
    start_attempt(engine, "team-a", "work", execution_id=retried.execution_id, attempt=2, started_ago_s=-2)
    running = start_attempt(engine, "team-a", "work", started_ago_s=-3, deadline_s=60)
    up_ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    _upstreams(engine, running, up_ids, ["extract", "audit"])
    _upstreams(engine, ended, up_ids[:1], ["extract"])

    r = send(team_a, "get", "/v1/jobs/work/executions")
    assert r.status_code == 200, r.json
    got = [(e["execution_id"], e["attempt"], e["status"]) for e in r.json["executions"]]
    assert got == [
        (running.execution_id, 1, "running"),
        (retried.execution_id, 2, "running"),
        (retried.execution_id, 1, "failed"),
        (ended.execution_id, 1, "succeeded"),
    ]
    first = r.json["executions"][0]
    assert first["upstream_execution_ids"] == up_ids
    assert first["started_at"] is not None and first["deadline_at"] is not None
    assert r.json["executions"][3]["upstream_execution_ids"] == up_ids[:1]
    assert r.json["executions"][2]["upstream_execution_ids"] == []
    assert r.json["executions"][2]["deadline_at"] is None

    # once the node records the end, the history row stands for it
    _history(engine, running, "succeeded")
    r = send(team_a, "get", "/v1/jobs/work/executions")
    assert [(e["attempt"], e["status"]) for e in r.json["executions"]][:2] == [(2, "running"), (1, "succeeded")]
    assert r.json["executions"][1]["upstream_execution_ids"] == up_ids


def test_maintenance_purges_them_with_history(engine: Engine, team_a: FlaskClient) -> None:
    old = start_attempt(engine, "team-a", "work", started_ago_s=50 * 86400, deadline_s=-49 * 86400, timeout_s=0)
    new = start_attempt(engine, "team-a", "work")
    _upstreams(engine, old, [], [])
    _upstreams(engine, new, [], [])
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE execution_upstreams SET created_at = now() - interval '50 days' WHERE execution_id = :e"),
            {"e": old.execution_id},
        )
        conn.execute(
            text(
                "INSERT INTO deadline_misses (namespace, job_id, execution_id, scheduled_for, deadline_at, "
                "recorded_at) VALUES ('team-a', 'work', :old, now(), now(), now() - interval '50 days'), "
                "('team-a', 'work', :new, now(), now(), now())"
            ),
            {"old": old.execution_id, "new": new.execution_id},
        )
        # dependency rows of a job the scheduler deleted once completed (not through the API)
        conn.execute(
            text(
                "INSERT INTO job_dependencies (namespace, upstream, downstream, kind, within_ms) VALUES "
                "('team-a', 'extract', 'gone', 'require', 1000), ('team-a', 'extract', 'work', 'require', 1000), "
                "('team-a', 'load', 'work', 'after', 1000), ('team-a', 'load', 'gone', 'after', 1000)"
            )
        )
        # what the nodes keep for them: the waits of after jobs, the latest successes of upstreams
        conn.execute(
            text(
                "INSERT INTO after_waits (namespace, downstream) VALUES ('team-a', 'work'), ('team-a', 'gone'), "
                "('team-b', 'work')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO job_last_success (namespace, job_id, execution_id, succeeded_at) VALUES "
                "('team-a', 'extract', gen_random_uuid(), now()), ('team-a', 'load', gen_random_uuid(), now()), "
                "('team-a', 'orphan', gen_random_uuid(), now()), ('team-b', 'extract', gen_random_uuid(), now())"
            )
        )
    report = run_maintenance(engine, datetime.now(UTC).date(), 45, 7, 7)
    assert (report.async_runs_purged, report.upstreams_purged, report.deadline_misses_purged) == (1, 1, 1)
    assert report.dependencies_purged == 2
    # the wait of a job gone, and one in another namespace; the successes no job depends on
    assert (report.waits_purged, report.last_successes_purged) == (2, 2)
    assert [tuple(r) for r in rows(engine, "SELECT namespace, downstream FROM after_waits")] == [("team-a", "work")]
    left = rows(engine, "SELECT namespace, job_id FROM job_last_success ORDER BY 1, 2")
    assert [tuple(r) for r in left] == [("team-a", "extract"), ("team-a", "load")]
    for table in ("async_runs", "execution_upstreams", "deadline_misses"):
        left = rows(engine, f"SELECT execution_id::text FROM {table}")  # noqa: S608 - a fixed table name
        assert [r[0] for r in left] == [new.execution_id], table
    assert [tuple(r) for r in rows(engine, "SELECT downstream FROM job_dependencies ORDER BY upstream")] == [
        ("work",),
        ("work",),
    ]


def test_two_ends_reported_at_once_have_one_winner(app: Flask, engine: Engine, team_a: FlaskClient) -> None:
    for _ in range(5):
        run = start_attempt(engine, "team-a", "work")
        gate = threading.Barrier(2)
        answers: dict[str, Any] = {}

        def report(
            status: str, run: Run = run, gate: threading.Barrier = gate, answers: dict[str, Any] = answers
        ) -> None:
            client = with_token(app, run.token)
            gate.wait(5)
            answers[status] = send(client, "post", COMPLETE.format(run.execution_id), {"status": status})

        threads = [threading.Thread(target=report, args=(s,)) for s in ("succeeded", "failed")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        codes = sorted(a.status_code for a in answers.values())
        assert codes == [200, 409], {s: a.json for s, a in answers.items()}
        winner = next(s for s, a in answers.items() if a.status_code == 200)
        loser = next(a for a in answers.values() if a.status_code == 409)
        assert loser.json["error"]["code"] == "already_completed"
        assert stored(engine, run.execution_id)["status"] == winner
