"""The dashboard shows a job's place among others and its work in flight: its upstreams and
downstreams (with how it waits), its executions whose work is still running (with their age), and
its missed deadlines (newest first); the jobs list marks a job that missed one lately. The rows are
written as the API and the nodes write them; another namespace's never show."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Flask
from sqlalchemy import Engine, text

from cronman.model.execution import execution_id
from cronman.store.flow import MISSES_SHOWN
from tests.ui.conftest import Browser, job, keyed, send

HOURLY = {"type": "cron", "expression": "0 * * * *", "timezone": "UTC"}


def _insert(engine: Engine, sql: str, **args: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), args)


def _edge(engine: Engine, ns: str, upstream: str, downstream: str, kind: str) -> None:
    _insert(
        engine,
        "INSERT INTO job_dependencies (namespace, upstream, downstream, kind, within_ms) "
        "VALUES (:ns, :u, :d, :k, 86400000)",
        ns=ns,
        u=upstream,
        d=downstream,
        k=kind,
    )


def _running(engine: Engine, ns: str, job_id: str, started: datetime, attempt: int = 1) -> str:
    eid = execution_id(job_id, int(started.timestamp() * 1000))
    _insert(
        engine,
        "INSERT INTO async_runs (execution_id, namespace, job_id, scheduled_for, event_index, trigger, attempt, "
        "status, token_hash, started_at, deadline_at, timeout_at) VALUES (:e, :ns, :j, :s, 0, 'schedule', :a, "
        "'running', '\\x00', :s, :d, :d)",
        e=eid,
        ns=ns,
        j=job_id,
        s=started,
        a=attempt,
        d=started + timedelta(hours=1),
    )
    return eid


def _miss(engine: Engine, ns: str, job_id: str, at: datetime, status: str | None) -> str:
    eid = execution_id(job_id, int(at.timestamp() * 1000))
    _insert(
        engine,
        "INSERT INTO deadline_misses (namespace, job_id, execution_id, scheduled_for, deadline_at, status) "
        "VALUES (:ns, :j, :e, :s, :d, :st)",
        ns=ns,
        j=job_id,
        e=eid,
        s=at,
        d=at + timedelta(minutes=15),
        st=status,
    )
    return eid


def test_a_job_page_shows_its_upstreams_downstreams_running_work_and_missed_deadlines(
    app: Flask, engine: Engine, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    api = keyed(app, key)
    for doc in (
        job("extract", schedule=HOURLY, deadline_seconds=900),
        job("transform", schedule=HOURLY),
        job("load", schedule=HOURLY),
        job("quiet", schedule=HOURLY),
        job("follower", schedule={"type": "after", "jobs": ["elsewhere"]}),
    ):
        assert send(api, "post", "/v1/jobs", doc).status_code == 201, doc
    assert send(keyed(app, new_key("team-b")), "post", "/v1/jobs", job("theirs", schedule=HOURLY)).status_code == 201
    _edge(engine, "team-a", "extract", "transform", "after")
    _edge(engine, "team-a", "audit", "transform", "require")  # an upstream since deleted
    _edge(engine, "team-a", "transform", "load", "after")
    _edge(engine, "team-b", "theirs", "transform", "after")  # another namespace's: never shown
    now = datetime.now(UTC)
    _insert(engine, "UPDATE jobs SET created_at = :t", t=now - timedelta(days=2))
    running = _running(engine, "team-a", "extract", now - timedelta(minutes=7), attempt=2)
    _running(engine, "team-b", "extract", now - timedelta(minutes=3))
    hours = [now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=h) for h in range(1, MISSES_SHOWN + 3)]
    misses = [_miss(engine, "team-a", "extract", t, "failed" if i == 0 else None) for i, t in enumerate(hours)]
    b = browser()
    b.login(key)

    html = b.get("/ui/jobs/transform").text
    assert re.findall(r'data-upstream="([^"]+)"', html) == ["audit", "extract"]
    assert re.findall(r'data-downstream="([^"]+)"', html) == ["load"]
    assert 'audit <span class="sub">(no such job)</span>' in html and 'href="/ui/jobs/extract"' in html
    assert "theirs" not in html

    html = b.get("/ui/jobs/extract").text
    assert re.findall(r'data-downstream="([^"]+)"', html) == ["transform"]
    assert re.findall(r'data-running="([^"]+)"', html) == [running]  # team-b's run of its own "extract" not shown
    row = re.search(rf'data-running="{running}">(.*?)</tr>', html, re.S)
    assert row is not None and "<td>2</td>" in row.group(1) and "7 min" in row.group(1)
    shown = re.findall(r'data-missed="([^"]+)"', html)
    assert shown == misses[:MISSES_SHOWN]  # newest first, a few
    assert "not taken up" in html and "st-failed" in html

    assert 'id="job-flow"' not in b.get("/ui/jobs/quiet").text  # nothing to show: no section

    listing = b.get("/ui/jobs").text
    assert re.findall(r'data-missed-deadline="([^"]+)"', listing) == ["extract"]
    # a job that runs after others has no times of its own, and is not over for that
    row = re.search(r'<tr data-job-id="follower">(.*?)</tr>', listing, re.S)
    assert row is not None and "state-active" in row.group(1) and "after upstreams" in row.group(1)
    assert "health-ok" in row.group(1)
    page = b.get("/ui/jobs/follower").text
    assert 'id="job-state">active' in page and "it fires when its upstreams have succeeded" in page
