"""A job's history belongs to one incarnation of its id: an id deleted and created again (in the
same namespace or another) starts with an empty history, and nobody can read or redeliver the
executions of the job that had the id before. History rows are written the way the scheduler
nodes write them (with the job's incarnation and namespace, or, before they did, with neither)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from tests.features.conftest import job, rows, send


def incarnation(engine: Engine, job_id: str) -> int:
    return int(rows(engine, "SELECT incarnation FROM jobs WHERE id = :id", id=job_id)[0][0])


def write_history(
    engine: Engine, job_id: str, *, incarnation: int | None, namespace: str | None, ago_seconds: float = 0
) -> str:
    """One failed attempt, as a node records it; returns its execution id."""
    exec_id = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (job_id, scheduled_for, attempt, execution_id, status, node, error, "
                "incarnation, namespace) VALUES (:id, now() - make_interval(secs => :ago), 1, :exec, "
                "'permanently_failed', 'node-a', 'secret detail of the receiver', :inc, :ns)"
            ),
            {"id": job_id, "ago": ago_seconds, "exec": exec_id, "inc": incarnation, "ns": namespace},
        )
    return exec_id


def history(client: FlaskClient, job_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/jobs/{job_id}/executions")
    assert r.status_code == 200, r.json
    return r.json["executions"]  # type: ignore[no-any-return]


def redeliver(client: FlaskClient, job_id: str, exec_id: str) -> int:
    return client.post(f"/v1/jobs/{job_id}/executions/{exec_id}/redeliver").status_code


def test_an_id_created_again_in_another_namespace_sees_none_of_the_old_history(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    assert send(team_a, "post", "/v1/jobs", job("shared-id")).status_code == 201
    first = incarnation(engine, "shared-id")
    current = write_history(engine, "shared-id", incarnation=first, namespace="team-a")
    legacy = write_history(engine, "shared-id", incarnation=None, namespace=None)  # written before the column
    assert {e["execution_id"] for e in history(team_a, "shared-id")} == {current, legacy}

    assert team_a.delete("/v1/jobs/shared-id").status_code == 204
    assert send(team_b, "post", "/v1/jobs", job("shared-id")).status_code == 201
    assert incarnation(engine, "shared-id") != first
    assert history(team_b, "shared-id") == []
    assert history(admin, "shared-id") == []
    for exec_id in (current, legacy):
        assert redeliver(team_b, "shared-id", exec_id) == 404
        assert redeliver(admin, "shared-id", exec_id) == 404
    assert rows(engine, "SELECT count(*) FROM job_triggers")[0][0] == 0

    mine = write_history(engine, "shared-id", incarnation=incarnation(engine, "shared-id"), namespace="team-b")
    assert [e["execution_id"] for e in history(team_b, "shared-id")] == [mine]
    assert redeliver(team_b, "shared-id", mine) == 202


def test_an_id_created_again_in_the_same_namespace_starts_empty(
    client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team = client_for("team-a")
    for method, path in (("post", "/v1/jobs"), ("put", "/v1/jobs/again")):  # both ways of creating revive an id
        assert send(team, method, path, job("again" if method == "post" else None)).status_code == 201
        old = write_history(engine, "again", incarnation=incarnation(engine, "again"), namespace="team-a")
        old_legacy = write_history(engine, "again", incarnation=None, namespace=None)
        assert len(history(team, "again")) == 2
        assert team.delete("/v1/jobs/again").status_code == 204
        assert send(team, "post", "/v1/jobs", job("again")).status_code == 201
        assert history(team, "again") == []
        assert redeliver(team, "again", old) == 404 and redeliver(team, "again", old_legacy) == 404
        assert team.delete("/v1/jobs/again").status_code == 204


def test_a_replaced_or_updated_job_keeps_its_history(client_for: Callable[[str], FlaskClient], engine: Engine) -> None:
    team = client_for("team-a")
    assert send(team, "post", "/v1/jobs", job("kept")).status_code == 201
    before = incarnation(engine, "kept")
    exec_id = write_history(engine, "kept", incarnation=before, namespace="team-a")
    assert send(team, "put", "/v1/jobs/kept", job(None, payload={"v": 2})).status_code == 200
    assert send(team, "patch", "/v1/jobs/kept", {"name": "n"}).status_code == 200
    assert team.post("/v1/jobs/kept/pause").status_code == 200
    assert incarnation(engine, "kept") == before
    assert [e["execution_id"] for e in history(team, "kept")] == [exec_id]


def test_legacy_rows_count_only_from_the_incarnation_s_creation(
    client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team = client_for("team-a")
    assert send(team, "post", "/v1/jobs", job("legacy")).status_code == 201
    older = write_history(engine, "legacy", incarnation=None, namespace=None, ago_seconds=3600)
    newer = write_history(engine, "legacy", incarnation=None, namespace=None)
    assert [e["execution_id"] for e in history(team, "legacy")] == [newer]
    assert redeliver(team, "legacy", older) == 404 and redeliver(team, "legacy", newer) == 202


def test_triggers_and_redeliveries_carry_the_incarnation_and_namespace(
    client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team = client_for("team-t")
    assert send(team, "post", "/v1/jobs", job("marked")).status_code == 201
    inc = incarnation(engine, "marked")
    assert team.post("/v1/jobs/marked/trigger").status_code == 202
    exec_id = write_history(engine, "marked", incarnation=inc, namespace="team-t")
    assert redeliver(team, "marked", exec_id) == 202
    got = rows(engine, "SELECT kind, incarnation, namespace FROM job_triggers WHERE job_id = 'marked' ORDER BY id")
    assert [tuple(r) for r in got] == [("trigger", inc, "team-t"), ("redeliver", inc, "team-t")]
