"""Deadlines: an occurrence not succeeded within its job's deadline_seconds is recorded once.

With real PostgreSQL and the API, no node running: history written as the nodes write it (their
history writer, which keeps health), an ``after`` job's executions as the nodes record them
(``execution_upstreams``), and watchdog passes at chosen instants. Each occurrence that had no
success by its deadline gets one ``deadline_misses`` row and one ``execution.deadline_missed``
event, however many passes and leaders look; one that succeeded in time gets none; the job's
health reads late until a later occurrence is attempted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest
from flask.testing import FlaskClient

from cronman.model.execution import execution_id
from cronman.model.timeutil import iso, parse_iso
from cronman.settings import Settings
from cronman.store.partitions import run_maintenance
from cronman.store.store import make_engine
from scheduler_node.history import HistoryRow
from scheduler_node.store import PgNodeStore
from scheduler_node.watch import Watch, watch_senders
from tests.clients import job, send

HOURLY = {"type": "cron", "expression": "0 * * * *", "timezone": "UTC"}
H = 3_600_000
M = 60_000


@pytest.fixture
def parts(settings: Settings, api: FlaskClient) -> Iterator[tuple[Any, Any]]:
    """(a new watch on the database, the nodes' history writer)."""
    engine = api.application.extensions["cronman"].store.engine
    executor = ThreadPoolExecutor(max_workers=2)
    store = PgNodeStore(engine, executor)

    def watch(**kw: Any) -> Watch:
        return Watch(settings, engine, executor, watch_senders(settings, executor), holder="test", **kw)

    yield watch, store
    executor.shutdown()


def _sql(database_url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(query, args)
        return list(cur.fetchall()) if cur.description else []


def _ms(t: Any) -> int:
    return int(t.timestamp() * 1000)


def _attempt(job_id: str, inc: int, at: int, attempt: int, status: str, finished: int) -> HistoryRow:
    """An attempt of the job's scheduled occurrence ``at``, as a node records it."""
    return HistoryRow(
        job_id, at, 0, attempt, execution_id(job_id, at), "schedule", status, "node-a", finished - 500, finished,
        100, 200 if status == "succeeded" else 500, None if status == "succeeded" else "HTTP 500",
        incarnation=inc, namespace="default",
    )  # fmt: skip


def _create(api: FlaskClient, database_url: str, job_id: str, made_at: str, **extra: Any) -> int:
    r = send(api, "post", "/v1/jobs", job(job_id, **extra))
    assert r.status_code == 201, r.json
    _sql(database_url, "UPDATE jobs SET updated_at = %s, created_at = %s WHERE id = %s", made_at, made_at, job_id)
    [(inc,)] = _sql(database_url, "SELECT incarnation FROM jobs WHERE id = %s", job_id)
    return int(inc)


def _misses(database_url: str) -> list[tuple[str, str, str, str | None]]:
    rows = _sql(
        database_url,
        "SELECT job_id, scheduled_for, deadline_at, status FROM deadline_misses ORDER BY job_id, scheduled_for",
    )
    return [(j, iso(_ms(s)), iso(_ms(d)), status) for j, s, d, status in rows]


def _events(database_url: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (j, d)
        for j, d in _sql(
            database_url,
            "SELECT job_id, detail FROM notification_events WHERE event = 'execution.deadline_missed' ORDER BY id",
        )
    ]


def test_each_missed_occurrence_is_recorded_once(api: FlaskClient, parts: Any, database_url: str) -> None:
    new_watch, store = parts
    rule = {"events": ["execution.deadline_missed"], "target": {"type": "http", "url": "https://example.com/alerts"}}
    assert send(api, "put", "/v1/notifications/deadlines", rule).status_code == 201
    made = "2026-12-19T07:30:00Z"
    slow = _create(api, database_url, "slow", made, schedule=HOURLY, deadline_seconds=900)
    prompt = _create(api, database_url, "prompt", made, schedule=HOURLY, deadline_seconds=900)
    plain = _create(api, database_url, "no-deadline", made, schedule=HOURLY)
    t8 = parse_iso("2026-12-19T08:00:00Z")
    t9, t10, t11 = t8 + H, t8 + 2 * H, t8 + 3 * H
    store.write_history(
        [
            # slow: 08:00 failed for good; 09:00 failed once, succeeded at 09:20 (past 09:15); 10:00 nothing
            _attempt("slow", slow, t8, 1, "failed", t8 + M),
            _attempt("slow", slow, t8, 2, "permanently_failed", t8 + 5 * M),
            _attempt("slow", slow, t9, 1, "failed", t9 + M),
            _attempt("slow", slow, t9, 2, "succeeded", t9 + 20 * M),
            # prompt: every occurrence succeeded within a minute, after a failure at 09:00
            _attempt("prompt", prompt, t8, 1, "succeeded", t8 + M),
            _attempt("prompt", prompt, t9, 1, "failed", t9 + M),
            _attempt("prompt", prompt, t9, 2, "succeeded", t9 + 2 * M),
            _attempt("prompt", prompt, t10, 1, "succeeded", t10 + M),
            _attempt("no-deadline", plain, t8, 1, "failed", t8 + M),
        ]
    )
    assert api.get("/v1/jobs/slow").json["health"]["state"] == "ok"

    counted: list[int] = []  # (what cronman_deadlines_missed_total adds)
    watch = new_watch(on_deadline_missed=counted.append)
    assert asyncio.run(watch.record_deadlines(t10 + 30 * M)) == 3
    expected = [
        ("slow", "2026-12-19T08:00:00Z", "2026-12-19T08:15:00Z", "permanently_failed"),
        ("slow", "2026-12-19T09:00:00Z", "2026-12-19T09:15:00Z", "failed"),
        ("slow", "2026-12-19T10:00:00Z", "2026-12-19T10:15:00Z", None),
    ]
    assert _misses(database_url) == expected
    events = _events(database_url)
    assert [(j, d["execution_id"], d["scheduled_for"], d["deadline_at"]) for j, d in events] == [
        ("slow", execution_id("slow", t), iso(t), iso(t + 15 * M)) for t in (t8, t9, t10)
    ]
    health = api.get("/v1/jobs/slow").json["health"]
    assert health["state"] == "late" and health["late_since"] == "2026-12-19T10:15:00Z"
    assert api.get("/v1/jobs/prompt").json["health"]["state"] == "ok"

    # the same watch again, later: only 11:00 is new (prompt succeeded in time again)
    store.write_history([_attempt("prompt", prompt, t11, 1, "succeeded", t11 + M)])
    assert asyncio.run(watch.record_deadlines(t10 + 31 * M)) == 0
    assert watch.deadlines.checked == 0  # it goes on from where it stopped: nothing read again
    assert asyncio.run(watch.record_deadlines(t11 + 30 * M)) == 1
    assert _misses(database_url) == [*expected, ("slow", "2026-12-19T11:00:00Z", "2026-12-19T11:15:00Z", None)]
    assert counted == [3, 1]
    # another leader looks back over the same hours: nothing recorded twice, no second event
    leader = new_watch()
    assert asyncio.run(leader.record_deadlines(t11 + 31 * M)) == 0
    assert leader.deadlines.checked == 2 * 4  # it looked back: 08:00 to 11:00, of both jobs
    assert len(_misses(database_url)) == 4 and len(_events(database_url)) == 4
    assert api.get("/v1/jobs/slow").json["health"]["state"] == "late"

    # a later occurrence attempted: no longer late
    t12 = t11 + H
    store.write_history([_attempt("slow", slow, t12, 1, "succeeded", t12 + M)])
    assert api.get("/v1/jobs/slow").json["health"]["state"] == "ok"


def test_an_after_jobs_executions_are_its_occurrences(api: FlaskClient, parts: Any, database_url: str) -> None:
    new_watch, store = parts
    made = "2026-12-19T07:30:00Z"
    _create(api, database_url, "extract", made, schedule=HOURLY)
    after = {"type": "after", "jobs": ["extract"]}
    inc = _create(api, database_url, "load", made, schedule=after, deadline_seconds=600)
    t8 = parse_iso("2026-12-19T08:00:00Z")
    runs = []
    for n, at in enumerate((t8 + 5 * M, t8 + H + 5 * M)):
        eid = execution_id("load", at, 0, "after")
        runs.append((eid, at))
        _sql(
            database_url,
            "INSERT INTO execution_upstreams (execution_id, namespace, job_id, upstream_jobs, upstream_ids, "
            "created_at) VALUES (%s, 'default', 'load', ARRAY['extract'], ARRAY[%s], %s)",
            eid,
            execution_id("extract", t8 + n * H),
            iso(at),
        )
    (first, at1), (second, at2) = runs
    ok = HistoryRow("load", at1, 0, 1, first, "after", "succeeded", "node-a", at1, at1 + M, 0, 200, None)
    store.write_history([ok._replace(incarnation=inc, namespace="default")])

    assert asyncio.run(new_watch().record_deadlines(at2 + 20 * M)) == 1
    assert _sql(database_url, "SELECT job_id, execution_id::text, status FROM deadline_misses") == [
        ("load", second, None)
    ]
    assert asyncio.run(new_watch().record_deadlines(at2 + 21 * M)) == 0
    assert api.get("/v1/jobs/load").json["health"]["state"] == "late"


def test_no_job_with_a_deadline_costs_one_query(api: FlaskClient, parts: Any, database_url: str) -> None:
    new_watch, _ = parts
    _create(api, database_url, "plain", "2026-12-19T07:30:00Z", schedule=HOURLY)
    watch = new_watch()
    assert asyncio.run(watch.record_deadlines(parse_iso("2026-12-20T00:00:00Z"))) == 0
    assert watch.deadlines.checked == 0 and _misses(database_url) == []


def test_a_deadline_longer_than_the_lookback_is_still_judged(api: FlaskClient, parts: Any, database_url: str) -> None:
    new_watch, store = parts
    three_days = 3 * 86400
    weekly = {"type": "cron", "expression": "0 8 * * 1", "timezone": "UTC"}  # Mondays 08:00
    _create(api, database_url, "weekly", "2026-12-01T00:00:00Z", schedule=weekly, deadline_seconds=three_days)
    monday = parse_iso("2026-12-07T08:00:00Z")
    watch = new_watch()
    assert asyncio.run(watch.record_deadlines(monday + three_days * 1000 - M)) == 0  # not yet
    # a new leader, half a day past that deadline: the occurrence is days old, its deadline within the lookback
    assert asyncio.run(new_watch().record_deadlines(monday + three_days * 1000 + 12 * H)) == 1
    assert _misses(database_url) == [("weekly", "2026-12-07T08:00:00Z", "2026-12-10T08:00:00Z", None)]


def test_missed_deadlines_go_with_the_history_they_belong_to(
    settings: Settings, api: FlaskClient, database_url: str
) -> None:
    for days, n in ((50, 1), (40, 2)):  # older than the 45 days of history kept, and not
        _sql(
            database_url,
            "INSERT INTO deadline_misses (namespace, job_id, execution_id, scheduled_for, deadline_at) "
            "VALUES ('default', 'j', %s, now() - make_interval(days => %s), now())",
            execution_id("j", n),
            days,
        )
    engine = make_engine(database_url, pool_size=1)
    try:
        report = run_maintenance(engine, datetime.now(UTC).date(), 45, 7, 7)
    finally:
        engine.dispose()
    assert report.deadline_misses_purged == 1
    assert _sql(database_url, "SELECT execution_id::text FROM deadline_misses") == [(execution_id("j", 2),)]


def test_a_pass_that_cannot_record_leaves_its_occurrences_to_the_next(
    api: FlaskClient, parts: Any, database_url: str
) -> None:
    new_watch, _ = parts
    _create(api, database_url, "hourly", "2026-12-19T07:30:00Z", schedule=HOURLY, deadline_seconds=900)
    now = parse_iso("2026-12-19T10:30:00Z")
    watch = new_watch()
    _sql(database_url, "ALTER TABLE deadline_misses RENAME TO deadline_misses_away")
    with pytest.raises(psycopg2.errors.UndefinedTable):
        asyncio.run(watch.record_deadlines(now))
    _sql(database_url, "ALTER TABLE deadline_misses_away RENAME TO deadline_misses")
    assert asyncio.run(watch.record_deadlines(now + M)) == 3  # 08:00, 09:00, 10:00
