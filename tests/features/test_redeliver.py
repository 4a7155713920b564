"""POST /v1/jobs/{id}/executions/{execution_id}/redeliver: a failed execution sent again, under its
own execution id, as its next attempt; through the API and a real node."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from cronman.dev.receiver import Receiver
from cronman.settings import Settings
from tests.features.conftest import job, send
from tests.helpers import NodeThread, wait_for


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def history(client: FlaskClient, job_id: str) -> list[dict[str, Any]]:
    return client.get(f"/v1/jobs/{job_id}/executions").json["executions"]  # type: ignore[no-any-return]


def test_a_failed_execution_is_redelivered_through_the_api(
    client_for: Callable[[str], FlaskClient], node: NodeThread
) -> None:
    team_a = client_for("team-a")
    with Receiver(fail_first=1) as receiver:
        doc = job("again", url=receiver.url, schedule={"type": "once", "at": _at(0.3)}, retry={"max_attempts": 1})
        assert send(team_a, "post", "/v1/jobs", doc).status_code == 201
        rows = wait_for(lambda: history(team_a, "again"), 10, "the failed execution")
        assert rows[0]["status"] == "permanently_failed"
        exec_id = rows[0]["execution_id"]

        r = team_a.post(f"/v1/jobs/again/executions/{exec_id}/redeliver")
        assert r.status_code == 202, r.json
        assert r.json == {"job_id": "again", "execution_id": exec_id, "attempt": 2}
        got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 2 else None, 10, "the redelivery")
    assert got[1].execution_id == exec_id and got[1].headers["Cronman-Attempt"] == "2"
    rows = wait_for(lambda: (lambda h: h if len(h) == 2 else None)(history(team_a, "again")), 5, "history")
    assert [(e["attempt"], e["status"]) for e in rows] == [(2, "succeeded"), (1, "permanently_failed")]
    # a succeeded execution is not redelivered
    r = team_a.post(f"/v1/jobs/again/executions/{exec_id}/redeliver")
    assert r.status_code == 409 and r.json["error"]["code"] == "not_failed"
    event = team_a.get("/v1/jobs/again/events").json["events"][0]
    assert event["action"] == "redeliver" and event["actor"] == f"key:{team_a.key_prefix}"  # type: ignore[attr-defined]
    assert event["detail"] == {"execution_id": exec_id, "attempt": 2}


def _history_row(engine: Engine, job_id: str, status: str) -> str:
    exec_id = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (job_id, scheduled_for, attempt, execution_id, status) "
                "VALUES (:j, now(), 1, :e, :s)"
            ),
            {"j": job_id, "e": exec_id, "s": status},
        )
    return exec_id


def test_what_cannot_be_redelivered(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    send(team_a, "post", "/v1/jobs", job("a-job"))
    failed = _history_row(engine, "a-job", "failed")
    skipped = _history_row(engine, "a-job", "skipped")

    def redeliver(client: FlaskClient, job_id: str, exec_id: str) -> tuple[int, str | None]:
        r = client.post(f"/v1/jobs/{job_id}/executions/{exec_id}/redeliver")
        return r.status_code, r.json["error"]["code"] if r.status_code >= 400 else None

    assert redeliver(team_a, "a-job", str(uuid.uuid4())) == (404, "not_found")
    assert redeliver(team_a, "a-job", "not-a-uuid") == (404, "not_found")
    assert redeliver(team_a, "nope", failed) == (404, "not_found")
    assert redeliver(team_a, "a-job", skipped) == (409, "not_failed")
    assert redeliver(team_b, "a-job", failed) == (404, "not_found")  # another namespace's job
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_triggers")).scalar_one() == 0
    assert redeliver(admin, "a-job", failed.upper()) == (202, None)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT kind, attempt, execution_id::text FROM job_triggers")).one()
    assert tuple(row) == ("redeliver", 2, failed)
