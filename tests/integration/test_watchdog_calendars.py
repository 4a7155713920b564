"""The watchdog judges what was due as the nodes do, and records a stall as one row.

With real PostgreSQL and the API: every node stopped (their last progress saved), a watchdog pass
at a chosen instant. A 09:00 daily job whose calendar excludes weekends was never due on a
Saturday: no late row, no late health, no ``execution.late`` event (before, all three, for runs
that were never due). A job firing every second, stalled for minutes, has one late row whose
count grows pass after pass, and one event (before, a row and an event per occurrence, up to
1,000 a pass).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg2
import pytest
from flask.testing import FlaskClient

from cronman.model.hashing import SLOTS
from cronman.model.timeutil import iso, parse_iso
from cronman.settings import Settings
from scheduler_node.store import PgNodeStore, bitmap
from scheduler_node.watch import Watch, watch_senders
from tests.clients import job, send


@pytest.fixture
def stopped(settings: Settings, api: FlaskClient) -> Iterator[Any]:
    """``stopped(at_ms)``: every node stopped having fired every slot through ``at_ms``; returns a
    watchdog on the database."""
    engine = api.application.extensions["cronman"].store.engine
    executor = ThreadPoolExecutor(max_workers=2)

    def stop(at_ms: int) -> Watch:
        store = PgNodeStore(engine, executor)
        asyncio.run(store.save_progress("node-x", "node-x-1", at_ms, bitmap(range(SLOTS), SLOTS), None))
        return Watch(settings, engine, executor, watch_senders(settings, executor), holder="test")

    yield stop
    executor.shutdown()


def _sql(database_url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(query, args)
        return list(cur.fetchall()) if cur.description else []


def _made_at(database_url: str, at: str) -> None:
    _sql(database_url, "UPDATE jobs SET updated_at = %s, created_at = %s", at, at)


def test_an_occurrence_on_an_excluded_day_is_never_late(api: FlaskClient, stopped: Any, database_url: str) -> None:
    send(api, "put", "/v1/calendars/weekends", {"exclude": {"weekdays": ["sat", "sun"]}})
    rule = {"events": ["execution.late"], "target": {"type": "http", "url": "https://example.com/alerts"}}
    assert send(api, "put", "/v1/notifications/late", rule).status_code == 201
    daily = {"type": "cron", "expression": "0 9 * * *", "timezone": "UTC"}
    for job_id, calendars in (("weekdays-9am", ["weekends"]), ("every-day-9am", [])):
        r = send(api, "post", "/v1/jobs", job(job_id, schedule=daily, calendars=calendars))
        assert r.status_code == 201, r.json
    _made_at(database_url, "2026-12-18T12:00:00Z")  # a Friday
    # every node stopped early on Saturday 19 December; the watchdog looks at 10:00
    watch = stopped(parse_iso("2026-12-19T08:00:00Z"))
    fresh = asyncio.run(watch.record_late(parse_iso("2026-12-19T10:00:00Z")))

    late = _sql(database_url, "SELECT job_id, scheduled_for, occurrences FROM scheduled_jobs WHERE status = 'late'")
    assert [(j, iso(int(t.timestamp() * 1000)), n) for j, t, n in late] == [
        ("every-day-9am", "2026-12-19T09:00:00Z", 1)
    ]
    assert fresh == 1
    assert api.get("/v1/jobs/weekdays-9am").json["health"]["state"] != "late"
    assert api.get("/v1/jobs/every-day-9am").json["health"]["state"] == "late"
    events = _sql(database_url, "SELECT job_id, event FROM notification_events")
    assert events == [("every-day-9am", "execution.late")]

    # down until Monday 10:00: Monday's 09:00 was due for both
    fresh = asyncio.run(watch.record_late(parse_iso("2026-12-21T10:00:00Z")))
    late = _sql(database_url, "SELECT job_id, scheduled_for FROM scheduled_jobs WHERE status = 'late' ORDER BY 1, 2")
    weekdays = [iso(int(t.timestamp() * 1000)) for j, t in late if j == "weekdays-9am"]
    assert weekdays == ["2026-12-21T09:00:00Z"]


def test_a_stall_is_one_row_whose_count_grows(api: FlaskClient, stopped: Any, database_url: str) -> None:
    rule = {"events": ["execution.late"], "target": {"type": "http", "url": "https://example.com/alerts"}}
    assert send(api, "put", "/v1/notifications/late", rule).status_code == 201
    schedule = {"type": "interval", "every_seconds": 1, "start_at": "2026-01-01T00:00:00Z"}
    assert send(api, "post", "/v1/jobs", job("beat", schedule=schedule, late_after_seconds=5)).status_code == 201
    _made_at(database_url, "2026-12-01T00:00:00Z")
    down = parse_iso("2026-12-19T08:00:00Z")  # fired through 08:00:00, then nothing
    watch = stopped(down)
    counts = []
    for seconds in (30, 32, 600, 4000):  # passes; late_after_seconds 5
        asyncio.run(watch.record_late(down + seconds * 1000))
        rows = _sql(
            database_url,
            "SELECT scheduled_for, occurrences, last_scheduled_for, attempt, node FROM scheduled_jobs "
            "WHERE status = 'late'",
        )
        assert len(rows) == 1, rows
        first, n, last, attempt, node = rows[0]
        assert iso(int(first.timestamp() * 1000)) == "2026-12-19T08:00:01Z" and (attempt, node) == (0, "watchdog")
        assert n == seconds - 5 and int(last.timestamp() * 1000) == down + (seconds - 5) * 1000
        counts.append(n)
    assert counts == [25, 27, 595, 3995]
    assert _sql(database_url, "SELECT count(*) FROM notification_events WHERE event = 'execution.late'") == [(1,)]
    [(detail,)] = _sql(database_url, "SELECT detail FROM notification_events")
    assert detail["occurrences"] == 25 and detail["scheduled_for"] == "2026-12-19T08:00:01Z"
    executions = api.get("/v1/jobs/beat/executions").json["executions"]
    assert [(e["status"], e["occurrences"], e["last_scheduled_for"]) for e in executions] == [
        ("late", 3995, "2026-12-19T09:06:35Z")
    ]
