"""Backfills through the API (asking, progress, cancelling) and one node delivering one.
The cluster behaviour (rate, node loss) is in tests/cluster/test_backfill.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from cronman.dev.receiver import Receiver
from cronman.model.execution import execution_id
from cronman.model.timeutil import iso, parse_iso
from cronman.settings import Settings
from tests.features.conftest import job, rows, send
from tests.helpers import NodeThread, wait_for


def _minute(offset_minutes: int) -> str:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return (now + timedelta(minutes=offset_minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def every_minute(job_id: str, url: str = "https://example.com/hook", **extra: Any) -> dict[str, Any]:
    schedule = {"type": "interval", "every_seconds": 60, "start_at": "2026-01-01T00:00:00Z"}
    return job(job_id, url=url, schedule=schedule, **extra)


def test_ask_read_list_cancel(admin: FlaskClient, engine: Engine) -> None:
    send(admin, "post", "/v1/jobs", every_minute("m"))
    body = {"from": _minute(-60), "to": _minute(-1), "max_per_second": 0.5}
    r = send(admin, "post", "/v1/jobs/m/backfill", body)
    assert r.status_code == 202, r.json
    b = r.json
    assert r.headers["Location"] == f"/v1/backfills/{b['id']}"
    assert {k: b[k] for k in ("job_id", "namespace", "state", "total", "dispatched", "delivered", "failed")} == {
        "job_id": "m",
        "namespace": "default",
        "state": "running",
        "total": 60,
        "dispatched": 0,
        "delivered": 0,
        "failed": 0,
    }
    assert (b["from"], b["to"], b["max_per_second"]) == (body["from"], body["to"], 0.5)
    assert admin.get(f"/v1/backfills/{b['id']}").json == b
    assert [x["id"] for x in admin.get("/v1/jobs/m/backfills").json["backfills"]] == [b["id"]]
    events = admin.get("/v1/jobs/m/events").json["events"]
    assert events[0]["action"] == "backfill" and events[0]["detail"]["backfill_id"] == b["id"]
    r = admin.delete(f"/v1/backfills/{b['id']}")
    assert r.status_code == 200 and r.json["state"] == "cancelled", r.json
    assert admin.delete(f"/v1/backfills/{b['id']}").json["state"] == "cancelled"  # again: the same
    assert admin.get("/v1/jobs/m/events").json["events"][0]["action"] == "backfill_cancel"
    assert rows(engine, "SELECT state FROM backfills")[0][0] == "cancelled"
    assert admin.get("/v1/backfills/bf-00000000000000000000").status_code == 404
    assert admin.get("/v1/backfills/nonsense").status_code == 404


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"from": _minute(-10)}, "to", "missing_field"),
        ({"from": _minute(-10), "to": _minute(-20)}, "to", "invalid_value"),
        ({"from": _minute(-10), "to": _minute(24 * 60)}, "to", "invalid_input"),  # (computed at collection)
        ({"from": "2020-01-01T00:00:00Z", "to": _minute(-1)}, "from", "invalid_input"),
        ({"from": "yesterday", "to": _minute(-1)}, "from", "invalid_value"),
        ({"from": "2026-01-01T00:00:00", "to": _minute(-1)}, "from", "invalid_value"),
        ({"from": _minute(-10), "to": _minute(-1), "max_per_second": 0}, "max_per_second", "invalid_value"),
        ({"from": _minute(-10), "to": _minute(-1), "max_per_second": 5000}, "max_per_second", "invalid_value"),
        ({"from": _minute(-10), "to": _minute(-1), "rate": 5}, "rate", "unknown_field"),
        ({"from": "between", "to": "occurrences"}, "from", "no_occurrences"),
    ],
)
def test_bad_requests_are_refused(
    admin: FlaskClient, engine: Engine, body: dict[str, Any], field: str, code: str
) -> None:
    send(admin, "post", "/v1/jobs", every_minute("m"))
    if body["from"] == "between":
        body = {"from": _minute(-10)[:-3] + "10Z", "to": _minute(-10)[:-3] + "20Z"}
    r = send(admin, "post", "/v1/jobs/m/backfill", body)
    assert r.status_code == 400, r.json
    assert (r.json["error"]["field"], r.json["error"]["code"]) == (field, code), r.json
    assert rows(engine, "SELECT count(*) FROM backfills")[0][0] == 0


def test_limits(admin: FlaskClient) -> None:
    schedule = {"type": "interval", "every_seconds": 1}
    send(admin, "post", "/v1/jobs", job("s", schedule=schedule))
    r = send(admin, "post", "/v1/jobs/s/backfill", {"from": _minute(-24 * 60 * 2), "to": _minute(-1)})
    assert r.status_code == 400 and r.json["error"]["code"] == "too_large", r.json
    assert send(admin, "post", "/v1/jobs/nope/backfill", {"from": _minute(-5), "to": _minute(-1)}).status_code == 404
    body = {"from": _minute(-5), "to": _minute(-1)}
    for _ in range(10):
        assert send(admin, "post", "/v1/jobs/s/backfill", body).status_code == 202
    r = send(admin, "post", "/v1/jobs/s/backfill", body)
    assert r.status_code == 409 and r.json["error"]["code"] == "too_many_backfills", r.json


def test_namespaces(client_for: Callable[[str], FlaskClient]) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    send(team_a, "post", "/v1/jobs", every_minute("a"))
    b = send(team_a, "post", "/v1/jobs/a/backfill", {"from": _minute(-5), "to": _minute(-1)}).json
    assert b["namespace"] == "team-a"
    assert team_b.get(f"/v1/backfills/{b['id']}").status_code == 404
    assert team_b.delete(f"/v1/backfills/{b['id']}").status_code == 404
    assert send(team_b, "post", "/v1/jobs/a/backfill", {"from": _minute(-5), "to": _minute(-1)}).status_code == 404


def test_the_occurrences_are_those_calendars_allow(admin: FlaskClient) -> None:
    today = datetime.now(UTC).date()
    send(admin, "put", "/v1/calendars/not-yesterday", {"exclude": {"dates": [(today - timedelta(days=1)).isoformat()]}})
    schedule = {"type": "cron", "expression": "0 * * * *"}
    send(admin, "post", "/v1/jobs", job("hourly", schedule=schedule, calendars=["not-yesterday"]))
    start = datetime.combine(today - timedelta(days=2), datetime.min.time(), UTC)
    body = {"from": start.isoformat(), "to": (start + timedelta(days=2) - timedelta(seconds=1)).isoformat()}
    assert send(admin, "post", "/v1/jobs/hourly/backfill", body).json["total"] == 24  # two days, one excluded


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def test_a_node_delivers_a_backfill_marked_as_such(admin: FlaskClient, node: NodeThread) -> None:
    with Receiver(fail_first=1) as receiver:
        send(
            admin,
            "post",
            "/v1/jobs",
            every_minute("m", url=receiver.url, retry={"max_attempts": 2, "backoff_seconds": 0.1}),
        )
        body = {"from": _minute(-10), "to": _minute(-1), "max_per_second": 50}
        b = send(admin, "post", "/v1/jobs/m/backfill", body).json
        done = wait_for(
            lambda: (lambda x: x if x["state"] == "completed" else None)(admin.get(f"/v1/backfills/{b['id']}").json),
            20,
            "the backfill to complete",
        )
        assert (done["total"], done["dispatched"], done["delivered"], done["failed"], done["pending"]) == (
            10,
            10,
            10,
            0,
            0,
        )
        got = [r for r in receiver.snapshot() if r.headers.get("Cronman-Backfill-Id") == b["id"]]
        expected = {parse_iso(body["from"]) + 60_000 * k for k in range(10)}
        assert {parse_iso(r.headers["Cronman-Scheduled-For"]) for r in got} == expected
        # stable per backfill and occurrence: the retry of each carries the same id
        ids = {execution_id("m", t, 0, f"backfill:{b['id']}") for t in expected}
        assert {r.execution_id for r in got} == ids and len(got) == 20  # a failure and a retry each
        assert ids.isdisjoint({execution_id("m", t) for t in expected})  # not the originals' ids
        history = admin.get("/v1/jobs/m/executions", query_string={"limit": 100}).json["executions"]
        mine = [e for e in history if e["trigger"] == f"backfill:{b['id']}"]
        assert sorted((e["scheduled_for"], e["attempt"], e["status"]) for e in mine) == sorted(
            (iso(t), a, s) for t in expected for a, s in ((1, "failed"), (2, "succeeded"))
        )


def test_a_retry_of_a_backfill_cancelled_long_ago_is_cancelled(
    admin: FlaskClient, engine: Engine, node: NodeThread
) -> None:
    """The nodes knew of cancellations made in the last day only: an execution of a backfill
    cancelled earlier, retrying later, was delivered. Here the cancellation is dated two days back
    while the retry waits."""
    with Receiver(fail_first=1) as receiver:
        retry = {"max_attempts": 2, "backoff_seconds": 8, "jitter": False}
        send(admin, "post", "/v1/jobs", every_minute("m", url=receiver.url, retry=retry))
        at = _minute(-3)
        b = send(admin, "post", "/v1/jobs/m/backfill", {"from": at, "to": at, "max_per_second": 50}).json
        wait_for(
            lambda: [r for r in receiver.snapshot() if r.headers.get("Cronman-Backfill-Id")], 15, "its first attempt"
        )
        assert admin.delete(f"/v1/backfills/{b['id']}").json["state"] == "cancelled"
        # its driver lets go (a last renewal dates the row), then the row is two days old
        wait_for(lambda: rows(engine, "SELECT driver IS NULL FROM backfills")[0][0], 10, "the driver to let go")
        with engine.begin() as conn:
            conn.execute(text("UPDATE backfills SET updated_at = now() - interval '2 days'"))
        trigger = f"backfill:{b['id']}"

        def second_attempt() -> Any:
            history = admin.get("/v1/jobs/m/executions").json["executions"]
            return next((e for e in history if e["trigger"] == trigger and e["attempt"] == 2), None)

        row = wait_for(second_attempt, 20, "the retry to come due")
        assert row["status"] == "cancelled", row
        assert len([r for r in receiver.snapshot() if r.headers.get("Cronman-Backfill-Id") == b["id"]]) == 1


def _backfill_reads(engine: Engine) -> tuple[int, int]:
    """Rows of ``backfills`` read so far (by scans and index look-ups), and blocks of its TOAST
    table (where timing documents live) read: PostgreSQL's own counters."""
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        found = conn.execute(
            text(
                "SELECT coalesce(t.seq_tup_read, 0) + coalesce(t.idx_tup_fetch, 0), "
                "coalesce(s.toast_blks_hit, 0) + coalesce(s.toast_blks_read, 0) FROM pg_stat_user_tables t "
                "JOIN pg_statio_user_tables s USING (relid) WHERE t.relname = 'backfills'"
            )
        ).one()
    return int(found[0]), int(found[1])


def test_a_node_reads_the_backfills_that_changed(admin: FlaskClient, engine: Engine, node: NodeThread) -> None:
    """A node read every running backfill, and those cancelled in the last day, with their timing
    documents, every second. Here 40 backfills cancelled a moment ago, each keeping a calendar of
    2,000 dates, and 10 running ones another node drives: over 10 quiet seconds the node reads no
    timing document, and of the rows only the ten it asks to drive every few seconds."""
    today = datetime.now(UTC).date()
    dates = [(today - timedelta(days=400 + i)).isoformat() for i in range(2000)]
    send(admin, "put", "/v1/calendars/big", {"exclude": {"dates": dates}})
    send(admin, "post", "/v1/jobs", every_minute("m", calendars=["big"], paused=True))
    made = []
    for i in range(50):
        at = _minute(-60 + i)
        made.append(send(admin, "post", "/v1/jobs/m/backfill", {"from": at, "to": at, "max_per_second": 1}).json)
        if i < 40:
            admin.delete(f"/v1/backfills/{made[-1]['id']}")
    with engine.begin() as conn:  # the other ten are driven by another node, for an hour
        conn.execute(
            text(
                "UPDATE backfills SET driver = 'elsewhere/1', lease_until = now() + interval '1 hour' "
                "WHERE id = ANY(:ids)"
            ),
            {"ids": [b["id"] for b in made[40:]]},
        )
        # and 20,000 finished long ago: a table the size of a real one, read by its indexes
        conn.execute(
            text(
                "INSERT INTO backfills (id, namespace, job_id, incarnation, from_at, to_at, max_per_second, "
                "timing, total, state, created_at, updated_at) SELECT 'bf-' || lpad(to_hex(n), 20, '0'), "
                "'default', 'm', 1, now(), now(), 1, '{}', 1, 'dispatched', now() - interval '9 days', "
                "now() - interval '9 days' FROM generate_series(1, 20000) n"
            )
        )
        conn.execute(text("ANALYZE backfills"))
    time.sleep(12)  # (PostgreSQL's counters of a busy connection reach the others within about 10 s)
    rows_before, toast_before = _backfill_reads(engine)
    time.sleep(10)
    rows_after, toast_after = _backfill_reads(engine)
    read, toast = rows_after - rows_before, toast_after - toast_before
    print(f"\nover 10 s: {read} backfill rows and {toast} TOAST blocks read")
    # (the ten leases are asked for every 2 s: 50 rows; before, 570 rows and 475 blocks)
    assert read <= 100 and toast == 0, (read, toast)
