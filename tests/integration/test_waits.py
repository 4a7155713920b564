"""What executions wait for, through a real node on real PostgreSQL and Redis, with HTTP receivers
(jobs written through the API, which keeps their dependency rows):
asynchronous work that reports its end (here as the completion endpoint would: the row updated
with the token's hash checked), or never does (a failed attempt at its timeout, retried under the
same execution id); after jobs fired by their upstreams' successes (fan-in) and skipped by a
failure; require. The API's own endpoints have their tests in tests/features."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from cronman.dev.receiver import Receiver
from cronman.settings import Settings
from tests.clients import at, create
from tests.helpers import NodeThread, wait_for


def rows(db: Engine, job_id: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        found = conn.execute(
            text(
                "SELECT execution_id::text, attempt, status, error, response, trigger FROM scheduled_jobs "
                "WHERE job_id = :j ORDER BY scheduled_for, attempt"
            ),
            {"j": job_id},
        )
        return [dict(r._mapping) for r in found]


def complete(db: Engine, execution_id: str, token: str, status: str, output: str | None = None) -> bool:
    """What POST /v1/executions/{id}:complete does to the run, the token checked as it checks it."""
    with db.begin() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE async_runs SET status = :s, output = :o, reported_at = now(), reported_by = 'token' "
                    "WHERE execution_id = CAST(:id AS uuid) AND status = 'running' AND token_hash = :h "
                    "AND deadline_at > now()"
                ),
                {"s": status, "o": output, "id": execution_id, "h": hashlib.sha256(token.encode()).digest()},
            ).rowcount
            == 1
        )


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def test_asynchronous_work_is_running_until_it_reports_its_end(
    client: FlaskClient, node: NodeThread, db: Engine
) -> None:
    with Receiver() as receiver:
        create(
            client,
            "async-ok",
            {"type": "once", "at": at(0.5)},
            {"type": "http", "url": receiver.url},
            completion={"mode": "callback", "timeout_seconds": 60},
        )
        got = wait_for(lambda: receiver.snapshot(), 10, "the delivery")[0]
        token = got.headers["Cronman-Completion-Token"]
        exec_id = got.headers["Cronman-Execution-Id"]
        time.sleep(1.5)
        assert rows(db, "async-ok") == [], "accepted is not done: no history row until the work reports"
        assert not complete(db, exec_id, token + "x", "succeeded"), "a forged token changes nothing"
        assert complete(db, exec_id, token, "succeeded", "42 rows")
        done = wait_for(lambda: rows(db, "async-ok"), 10, "the execution's end in history")
        assert [(r["execution_id"], r["attempt"], r["status"], r["response"]) for r in done] == [
            (exec_id, 1, "succeeded", "42 rows")
        ]
        assert len(receiver.snapshot()) == 1


def test_work_that_never_reports_fails_at_its_timeout_and_is_retried_under_the_same_id(
    client: FlaskClient, node: NodeThread, db: Engine
) -> None:
    with Receiver() as receiver:
        create(
            client,
            "async-silent",
            {"type": "once", "at": at(0.5)},
            {"type": "http", "url": receiver.url, "timeout_seconds": 1},
            completion={"mode": "callback", "timeout_seconds": 2},
            retry={"max_attempts": 2, "backoff_seconds": 0.2, "jitter": False},
        )
        got = wait_for(lambda: rows(db, "async-silent") if len(rows(db, "async-silent")) >= 2 else None, 30, "2 rows")
        sent = receiver.snapshot()
        assert [r.headers["Cronman-Attempt"] for r in sent] == ["1", "2"]
        assert len({r.headers["Cronman-Execution-Id"] for r in sent}) == 1
        assert len({r.headers["Cronman-Completion-Token"] for r in sent}) == 2, "a token per attempt"
        assert [(r["attempt"], r["status"]) for r in got] == [(1, "failed"), (2, "permanently_failed")]
        assert all("reported no end" in (r["error"] or "") for r in got)
        # the first attempt's token no longer completes anything
        assert not complete(db, got[0]["execution_id"], sent[0].headers["Cronman-Completion-Token"], "succeeded")


def test_after_job_fires_once_every_upstream_succeeded_carrying_their_ids(
    client: FlaskClient, node: NodeThread, db: Engine
) -> None:
    with Receiver() as receiver:
        target = {"type": "http", "url": receiver.url}
        create(client, "load", {"type": "after", "jobs": ["transform", "audit"]}, target)
        create(client, "transform", {"type": "once", "at": at(0.5)}, target)
        time.sleep(2)
        assert not [r for r in receiver.snapshot() if r.headers["Cronman-Job-Id"] == "load"], "audit has not run"
        create(client, "audit", {"type": "once", "at": at(0.5)}, target)
        load = wait_for(
            lambda: [r for r in receiver.snapshot() if r.headers["Cronman-Job-Id"] == "load"], 15, "load fired"
        )
        ids = {
            r.headers["Cronman-Job-Id"]: r.headers["Cronman-Execution-Id"]
            for r in receiver.snapshot()
            if r.headers["Cronman-Job-Id"] != "load"
        }
        assert load[0].headers["Cronman-Upstream-Execution-Ids"].split(",") == [ids["audit"], ids["transform"]]
        time.sleep(1.5)
        assert len([r for r in receiver.snapshot() if r.headers["Cronman-Job-Id"] == "load"]) == 1
        assert [r["trigger"] for r in rows(db, "load")] == ["after"]


def test_a_failed_upstream_skips_the_chain_with_the_reason(client: FlaskClient, node: NodeThread, db: Engine) -> None:
    with Receiver(fail_first=10) as failing, Receiver() as ok:
        create(client, "t2", {"type": "after", "jobs": ["e2"]}, {"type": "http", "url": ok.url})
        create(client, "l2", {"type": "after", "jobs": ["t2"]}, {"type": "http", "url": ok.url})
        create(
            client,
            "e2",
            {"type": "once", "at": at(0.5)},
            {"type": "http", "url": failing.url},
            retry={"max_attempts": 1},
        )
        skipped = wait_for(lambda: rows(db, "l2"), 15, "the chain's end skipped")
        assert [r["status"] for r in rows(db, "t2")] == ["skipped"]
        assert "upstream e2 failed" in rows(db, "t2")[0]["error"]
        assert skipped[0]["status"] == "skipped"
        assert skipped[0]["error"].startswith("upstream t2 was skipped: upstream e2 failed")
        assert ok.snapshot() == []


def test_a_requirement_not_met_skips_and_one_met_carries_the_upstream(
    client: FlaskClient, node: NodeThread, db: Engine
) -> None:
    with Receiver() as receiver:
        target = {"type": "http", "url": receiver.url}
        create(client, "needs", {"type": "once", "at": at(0.5)}, target, require={"jobs": ["base"]})
        skipped = wait_for(lambda: rows(db, "needs"), 10, "the unmet requirement's skip")
        assert skipped[0]["status"] == "skipped" and "base has not succeeded" in skipped[0]["error"]
        create(client, "base", {"type": "once", "at": at(0.3)}, target)
        base = wait_for(lambda: [r for r in rows(db, "base") if r["status"] == "succeeded"], 10, "base")
        create(client, "needs2", {"type": "once", "at": at(0.5)}, target, require={"jobs": ["base"]})
        sent = wait_for(
            lambda: [r for r in receiver.snapshot() if r.headers["Cronman-Job-Id"] == "needs2"], 10, "needs2 sent"
        )
        assert sent[0].headers["Cronman-Upstream-Execution-Ids"] == base[0]["execution_id"]


def test_overlap_skip_skips_while_the_work_runs_not_only_while_the_call_does(
    client: FlaskClient, node: NodeThread, db: Engine
) -> None:
    with Receiver() as receiver:
        create(
            client,
            "async-overlap",
            {"type": "interval", "every_seconds": 1},
            {"type": "http", "url": receiver.url},
            completion={"mode": "callback", "timeout_seconds": 60},
            overlap_policy="skip",
        )
        first = wait_for(lambda: receiver.snapshot(), 10, "the first delivery")[0]
        skipped = wait_for(
            lambda: [r for r in rows(db, "async-overlap") if r["status"] == "skipped"][:2] or None, 10, "skips"
        )
        assert len(receiver.snapshot()) == 1, "nothing else is sent while the work runs"
        assert all(r["execution_id"] != first.headers["Cronman-Execution-Id"] for r in skipped)
        exec_id, token = first.headers["Cronman-Execution-Id"], first.headers["Cronman-Completion-Token"]
        assert complete(db, exec_id, token, "succeeded")
        wait_for(lambda: len(receiver.snapshot()) >= 2, 10, "a delivery once the work ended")


def test_an_attempt_its_receiver_did_not_accept_takes_no_report_after(
    client: FlaskClient, node: NodeThread, db: Engine
) -> None:
    with Receiver(fail_first=10) as receiver:
        create(
            client,
            "async-refused",
            {"type": "once", "at": at(0.5)},
            {"type": "http", "url": receiver.url},
            completion={"mode": "callback", "timeout_seconds": 60},
            retry={"max_attempts": 1},
        )
        done = wait_for(lambda: rows(db, "async-refused"), 10, "the execution's end")
        assert [(r["attempt"], r["status"]) for r in done] == [(1, "permanently_failed")]
        sent = receiver.snapshot()[0]
        assert not complete(db, done[0]["execution_id"], sent.headers["Cronman-Completion-Token"], "succeeded")
        with db.connect() as conn:
            status = conn.execute(
                text("SELECT status FROM async_runs WHERE execution_id = CAST(:e AS uuid)"),
                {"e": done[0]["execution_id"]},
            ).scalar_one()
        assert status == "unaccepted"


@dataclass
class ReportsThenFails(Receiver):
    """Its work reports success before the answer to the request goes out, and the answer is a 500."""

    db: Engine | None = None

    def _record(self, rec: Any) -> None:
        assert self.db is not None
        complete(self.db, rec.headers["Cronman-Execution-Id"], rec.headers["Cronman-Completion-Token"], "succeeded")
        super()._record(rec)


def test_a_report_that_came_before_a_failed_answer_is_the_attempts_end(
    client: FlaskClient, node: NodeThread, db: Engine
) -> None:
    with ReportsThenFails(fail_first=10, db=db) as receiver:
        create(
            client,
            "async-early",
            {"type": "once", "at": at(0.5)},
            {"type": "http", "url": receiver.url},
            completion={"mode": "callback", "timeout_seconds": 60},
            retry={"max_attempts": 3, "backoff_seconds": 0.2},
        )
        done = wait_for(lambda: rows(db, "async-early"), 10, "the execution's end")
        time.sleep(1)
        assert [(r["attempt"], r["status"]) for r in rows(db, "async-early")] == [(1, "succeeded")]
        assert len(receiver.snapshot()) == 1 and done
