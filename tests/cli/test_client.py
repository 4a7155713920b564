"""The Python client against the real API on a real socket."""

from __future__ import annotations

import hashlib
import socket
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from cronman import client as client_module
from cronman.client import (
    ApiUnreachable,
    BadRequestError,
    Client,
    ConflictError,
    Execution,
    ForbiddenError,
    Job,
    JobEvent,
    NotFoundError,
    UnauthorizedError,
    UnavailableError,
)
from cronman.errors import Conflict, InvalidInput, NotFound, TransientError
from cronman.model.labels import parse_selector
from cronman.model.spec import CronSchedule, JobSpec
from cronman.store.apikeys import ApiKeyStore
from tests.cli.conftest import Faults, job
from tests.conftest import ADMIN_KEY
from tests.helpers import start_api_process


def test_a_job_s_life(cron: Client) -> None:
    created = cron.create_job(job("a", labels={"team": "payments"}, payload={"n": 1}))
    assert isinstance(created, Job) and created.id == "a" and created.labels == {"team": "payments"}
    assert created.state == "active" and created.next_fire_at is not None and created.next_fire_at.tzinfo is not None
    assert isinstance(created.spec().schedule, CronSchedule) and created.spec().schedule.timezone == "Europe/Paris"
    assert cron.get_job("a") == created

    spec = JobSpec.model_validate({**job("a"), "payload": {"n": 2}, "labels": {"team": "billing"}})
    replaced = cron.put_job("a", spec)
    assert replaced.payload == {"n": 2} and replaced.version > created.version

    patched = cron.patch_job("a", {"labels": {"env": "prod"}})
    assert patched.labels == {"team": "billing", "env": "prod"}
    assert cron.pause_job("a").state == "paused"
    assert cron.resume_job("a").paused is False

    triggered = cron.trigger_job("a")
    assert triggered.job_id == "a" and len(triggered.execution_id) == 36

    after = datetime(2030, 3, 1, tzinfo=UTC)
    times = cron.next_fire_times("a", count=3, after=after)
    assert times == [datetime(2030, 3, d, 6, 0, tzinfo=UTC) for d in (1, 2, 3)]

    actions = [e.action for e in cron.events("a", page_size=2)]
    assert actions == ["trigger", "resume", "pause", "update", "replace", "create"]
    assert all(isinstance(e, JobEvent) and e.actor == "admin" for e in cron.events("a"))

    cron.delete_job("a")
    with pytest.raises(NotFoundError) as err:
        cron.get_job("a")
    assert isinstance(err.value, NotFound)
    assert (err.value.status, err.value.code, err.value.field) == (404, "not_found", "id")
    assert "no job with id 'a'" in str(err.value)


def test_lists_are_iterated_across_pages(cron: Client) -> None:
    for i in range(7):
        cron.create_job(job(f"j{i}", name=f"Report {i}", labels={"team": "a" if i % 2 else "b"}))
    assert [j.id for j in cron.list_jobs(page_size=2)] == [f"j{i}" for i in range(7)]
    assert [j.id for j in cron.list_jobs(selector="team=a", page_size=2)] == ["j1", "j3", "j5"]
    assert [j.id for j in cron.list_jobs(selector=parse_selector("team!=a"), q="REPORT")] == ["j0", "j2", "j4", "j6"]
    page = cron.list_jobs_page(limit=3)
    assert [j.id for j in page.items] == ["j0", "j1", "j2"] and page.next_cursor
    assert [j.id for j in cron.list_jobs_page(limit=3, cursor=page.next_cursor).items] == ["j3", "j4", "j5"]


def test_history_is_iterated_newest_first(cron: Client, engine: Engine) -> None:
    cron.create_job(job("h"))
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    with engine.begin() as conn:
        for i in range(5):
            conn.execute(
                text(
                    "INSERT INTO scheduled_jobs (job_id, scheduled_for, attempt, execution_id, status, node, lag_ms,"
                    " incarnation, namespace) SELECT 'h', :at, 1, gen_random_uuid(), :status, 'node-a', 12,"
                    " incarnation, namespace FROM jobs WHERE id = 'h'"
                ),
                {"at": base + timedelta(minutes=i), "status": "failed" if i == 2 else "succeeded"},
            )
    rows = list(cron.executions("h", page_size=2))
    assert [r.scheduled_for for r in rows] == [base + timedelta(minutes=i) for i in (4, 3, 2, 1, 0)]
    assert all(isinstance(r, Execution) for r in rows) and rows[2].status == "failed" and rows[0].lag_ms == 12
    redelivered = cron.redeliver("h", rows[2].execution_id)
    assert redelivered.attempt == 2 and redelivered.execution_id == rows[2].execution_id


def test_the_batch_api_reports_each_item(cron: Client, faults: Faults) -> None:
    jobs: list[Any] = [
        job("b0", labels={"team": "x"}),
        job("b1", schedule={"type": "cron", "expression": "99 * * * *"}),  # refused here: never sent
        JobSpec.model_validate(job("b2")),
        job("b3", throttle="no-such-policy"),  # refused by the API
    ]
    sent_before = len(faults.seen)
    result = cron.put_jobs(jobs)
    assert len(faults.seen) == sent_before + 1
    assert [(r.index, r.id, r.status, r.ok) for r in result.results] == [
        (0, "b0", 201, True),
        (1, "b1", 400, False),
        (2, "b2", 201, True),
        (3, "b3", 400, False),
    ]
    assert result.results[1].error and result.results[1].error.field == "schedule.expression"
    assert result.results[3].error and result.results[3].error.code == "unknown_throttle"
    assert (result.created, result.replaced, result.failed) == (2, 0, 2)
    assert cron.put_jobs([job("b0")]).replaced == 1


def test_more_than_a_batch_goes_in_several_requests(cron: Client, faults: Faults) -> None:
    sent_before = len(faults.seen)
    result = cron.put_jobs([job(f"many-{i:04d}") for i in range(1001)])
    assert result.created == 1001 and [r.index for r in result.results] == list(range(1001))
    assert [p for _, p, _ in faults.seen[sent_before:]] == ["/v1/jobs:batch", "/v1/jobs:batch"]


def test_errors_carry_the_api_s_code_message_and_field(cron: Client, api_url: str, engine: Engine) -> None:
    cron.create_job(job("dup"))
    with pytest.raises(ConflictError) as conflict:
        cron.create_job(job("dup"))
    assert isinstance(conflict.value, Conflict) and conflict.value.field == "id"

    with pytest.raises(BadRequestError) as bad:
        list(cron.list_jobs(selector="team=pay ments"))
    assert (bad.value.code, bad.value.field) == ("invalid_selector", "selector")
    assert bad.value.message == "selector: expected ',' at position 10, found 'ments'"

    with pytest.raises(UnauthorizedError):
        Client(api_url, "not-a-key").get_job("dup")

    _, key = ApiKeyStore(engine).create("billing", "tests")
    with Client(api_url, key) as billing:
        assert list(billing.list_jobs()) == []
        with pytest.raises(ForbiddenError):
            list(billing.list_jobs(namespace="default"))
        with pytest.raises(NotFoundError):
            billing.get_job("dup")


def test_a_job_the_api_s_model_refuses_is_never_sent(cron: Client, faults: Faults) -> None:
    sent_before = len(faults.seen)
    with pytest.raises(InvalidInput) as err:
        cron.create_job(job("x", labels={"bad key": "v"}))
    assert (err.value.code, err.value.field) == ("invalid_label", "labels.bad key")
    with pytest.raises(InvalidInput):
        cron.put_job("x", {**job("x"), "unknown": 1})
    assert len(faults.seen) == sent_before


def test_429_and_503_are_retried_after_what_retry_after_asks(cron: Client, faults: Faults) -> None:
    cron.create_job(job("r"))
    faults.answer(429, retry_after="1")
    faults.answer(503, retry_after="1")
    seen = len(faults.seen)
    started = time.monotonic()
    assert cron.get_job("r").id == "r"
    assert time.monotonic() - started >= 2.0
    assert len(faults.seen) == seen + 3


def test_a_write_answered_503_is_retried_and_done_once(cron: Client, faults: Faults) -> None:
    faults.answer(503)
    assert cron.create_job(job("w")).id == "w"
    assert [e.action for e in cron.events("w")] == ["create"]


def test_retries_end_with_the_last_error(cron: Client, faults: Faults) -> None:
    faults.answer(503, times=10)
    seen = len(faults.seen)
    with pytest.raises(UnavailableError) as err:
        cron.get_job("any")
    assert isinstance(err.value, TransientError)
    assert (err.value.status, err.value.code) == (503, "injected_503")
    assert len(faults.seen) == seen + 4  # the call and 3 retries


def test_a_long_retry_after_is_capped(cron: Client, faults: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MAX_RETRY_AFTER", 0.2)
    faults.answer(429, retry_after="3600")
    started = time.monotonic()
    with pytest.raises(NotFoundError):
        cron.get_job("nothing")
    assert time.monotonic() - started < 2


def test_one_connection_is_kept_alive(settings_env: dict[str, str], tmp_path: Path) -> None:
    """Against gunicorn, as deployed (werkzeug's server closes every connection)."""
    child, url = start_api_process(settings_env, tmp_path / "api.log")
    try:
        with Client(url, ADMIN_KEY) as cron:
            cron.create_job(job("k"))
            for _ in range(5):
                cron.get_job("k")
            pools = cron.session.get_adapter(url).poolmanager.pools  # type: ignore[attr-defined]
            assert [pools[k].num_connections for k in pools.keys()] == [1]  # noqa: SIM118 - no __iter__
    finally:
        child.stop()


def test_an_api_that_does_not_answer_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts connections (the backlog) and never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ApiUnreachable) as err:
            Client(url, "k", timeout=(1, 0.5)).get_job("x")
        assert time.monotonic() - started < 2  # a lost answer is not retried: the request may have acted
    assert "did not answer in time" in err.value.message


def test_an_api_that_is_not_there_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ApiUnreachable) as err:
        Client(f"http://127.0.0.1:{port}", "k", retries=1, backoff_factor=0.01).get_job("x")
    assert "cannot reach the cronman API" in err.value.message and "refused" in err.value.message.lower()


def test_the_answer_models_cover_the_api_description(cron: Client) -> None:
    from api.openapi import openapi_document

    schemas = openapi_document()["components"]["schemas"]
    for name, model in (("Job", Job), ("Execution", Execution), ("JobEvent", JobEvent)):
        assert set(schemas[name]["properties"]) <= set(model.model_fields), name


def test_work_reports_its_end_with_its_token_or_the_key(cron: Client, api_url: str, engine: Engine) -> None:
    cron.create_job(job("async", completion={"mode": "callback", "timeout_seconds": 600, "heartbeat_seconds": 60}))
    ids = [str(uuid.uuid4()) for _ in range(2)]
    with engine.begin() as conn:
        for exec_id in ids:
            conn.execute(
                text(
                    "INSERT INTO async_runs (execution_id, namespace, job_id, scheduled_for, event_index, trigger, "
                    "attempt, status, token_hash, started_at, deadline_at, timeout_at, heartbeat_ms) VALUES "
                    "(:e, 'default', 'async', now(), 0, 'schedule', 1, 'running', :h, now(), "
                    "now() + interval '60 seconds', now() + interval '600 seconds', 60000)"
                ),
                {"e": exec_id, "h": hashlib.sha256(b"tok-" + exec_id.encode()).digest()},
            )
    with Client(api_url) as worker:  # no key: the token alone
        beat = worker.heartbeat_execution(ids[0], token="tok-" + ids[0])
        assert beat.attempt == 1 and beat.deadline_at is not None
        end = worker.complete_execution(ids[0], "succeeded", "done", token="tok-" + ids[0])
        assert (end.status, end.output, end.duplicate) == ("succeeded", "done", False)
        with pytest.raises(ForbiddenError):
            worker.complete_execution(ids[1], "succeeded", token="tok-" + ids[0])
        with pytest.raises(UnauthorizedError):
            worker.complete_execution(ids[1], "succeeded")
    end = cron.complete_execution(ids[1], "failed")
    assert end.status == "failed" and end.output is None
    with pytest.raises(ConflictError) as refused:
        cron.complete_execution(ids[1], "succeeded")
    assert refused.value.code == "already_completed"
    assert cron.complete_execution(ids[1], "failed").duplicate is True
