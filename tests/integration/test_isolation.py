"""One job's bad data never hurts another (issue 11, defect 1), through a real node with real
PostgreSQL, Redis and HTTP receivers.

A stored target the API would refuse today (an older job's header value HTTP cannot carry) fires in
the same timer pass as ordinary jobs: they are all delivered on time, and the bad job's attempts are
failed attempts naming the header. A URL with characters outside ASCII reaches the receiver
percent-encoded; an internationalised host is sent by its punycode name."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest
from flask.testing import FlaskClient

from cronman.model.timeutil import iso
from scheduler_node.senders.http import prepare
from tests.cluster.ledger import LedgerReceiver, analyse
from tests.helpers import NodeThread, RawHttpServer, history_rows, wait_for


def create(client: FlaskClient, doc: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    path = "/v1/jobs" + (f"?namespace={namespace}" if namespace else "")
    r = client.post(path, data=json.dumps(doc), content_type="application/json")
    assert r.status_code == 201, r.json
    return r.json  # type: ignore[no-any-return]


def next_whole_second(ahead: float) -> float:
    return float(int(time.time() + ahead) + 1)


def no_tracebacks(records: list[logging.LogRecord]) -> list[str]:
    """Log records of the node that carry a traceback, or say a timer pass failed."""
    return [
        f"{r.name}: {r.getMessage()}"
        for r in records
        if r.name.startswith("cronman") and (r.exc_info or "timer pass failed" in r.getMessage())
    ]


@pytest.fixture
def ledger() -> Iterator[LedgerReceiver]:
    with LedgerReceiver() as r:
        yield r


def test_a_stored_header_http_cannot_carry_fails_its_own_attempts_only(
    client: FlaskClient, settings: Any, ledger: LedgerReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # Every job's occurrences fall on the same whole seconds: the bad job is claimed in the same
    # timer pass as the twenty others (one exception there used to abort the whole pass).
    start = next_whole_second(4)
    schedule = {"type": "interval", "every_seconds": 1, "start_at": iso(int(start * 1000))}
    ordinary = [f"ok-{i:02d}" for i in range(20)]
    for job_id in ordinary:
        create(client, {"id": job_id, "schedule": schedule, "target": {"type": "http", "url": f"{ledger.url}/hook"}})
    create(
        client,
        {
            "id": "bad-header",
            "schedule": schedule,
            "target": {"type": "http", "url": f"{ledger.url}/hook", "headers": {"X-Ok": "fine", "X-Note": "euro"}},
            "retry": {"max_attempts": 2, "backoff_seconds": 0.3, "jitter": False},
        },
    )
    # As an older stored job would be: the API refuses "€" in a header value now.
    conn = psycopg2.connect(settings.database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "UPDATE jobs SET target = jsonb_set(target, '{headers,X-Note}', to_jsonb(%s::text)) WHERE id = %s",
                ("€ and ü", "bad-header"),
            )
            assert cur.rowcount == 1
    finally:
        conn.close()

    with NodeThread(settings):
        time.sleep(max(0.0, start + 8 - time.time()))
    t0, t1 = start, start + 6.5  # every occurrence in it had 1.5 s to arrive before the node stopped

    schedules = {job_id: schedule for job_id in ordinary}
    figures = analyse(schedules, ledger.snapshot(), t0, t1)
    print(f"\nordinary jobs beside the bad one: {figures.as_dict()}")
    assert figures.expected == 20 * 7
    assert figures.missed == 0, figures.missed_sample
    assert figures.doubled == 0, figures.doubled_sample
    assert figures.worst_lag_ms is not None and figures.worst_lag_ms < 1000, figures.as_dict()
    assert figures.p99_lag_ms is not None and figures.p99_lag_ms < 500, figures.as_dict()
    assert not [a for a in ledger.snapshot() if a.job_id == "bad-header"], "the bad job reached the receiver"

    rows = history_rows(settings.database_url, "bad-header")
    due = range(int(t0), int(t1) + 1)
    by_time = {int(r["scheduled_for"].timestamp()): r for r in rows}
    assert set(due) <= set(by_time), f"occurrences of the bad job with no history: {sorted(set(due) - set(by_time))}"
    assert rows and {r["status"] for r in rows} <= {"failed", "permanently_failed"}, rows[:4]
    assert all("X-Note" in (r["error"] or "") for r in rows), {r["error"] for r in rows}
    assert all(r["http_status"] is None and r["fired_at"] is not None for r in rows)
    finals = [r for r in rows if r["status"] == "permanently_failed"]
    assert finals and all(r["attempt"] == 2 for r in finals)
    assert not no_tracebacks(caplog.records), no_tracebacks(caplog.records)


def test_a_path_and_query_outside_ascii_arrive_percent_encoded(client: FlaskClient, settings: Any) -> None:
    with RawHttpServer() as server, NodeThread(settings):
        at = datetime.fromtimestamp(time.time() + 0.5, UTC)
        create(
            client,
            {
                "id": "intl-path",
                "schedule": {"type": "once", "at": at.isoformat()},
                "target": {"type": "http", "url": f"{server.url}/café/€?q=ü&x=é"},
            },
        )
        got = wait_for(lambda: server.requests, 10, "the delivery")
    req = got[0]
    assert req.request_line == "POST /caf%C3%A9/%E2%82%AC?q=%C3%BC&x=%C3%A9 HTTP/1.1", req.request_line
    assert req.header("Host") == f"127.0.0.1:{server.port}"
    assert req.header("Cronman-Job-Id") == "intl-path"
    rows = wait_for(lambda: history_rows(settings.database_url, "intl-path"), 5, "the history row")
    assert [(r["status"], r["http_status"]) for r in rows] == [("succeeded", 200)]


@pytest.mark.parametrize(
    ("url", "line", "host"),
    [
        ("https://例え.jp/x", "POST /x HTTP/1.1", "xn--r8jz45g.jp"),
        (
            "http://Bücher.example:8080/café?ü=€",
            "POST /caf%C3%A9?%C3%BC=%E2%82%AC HTTP/1.1",
            "xn--bcher-kva.example:8080",
        ),
        ("https://straße.de", "POST / HTTP/1.1", "xn--strae-oqa.de"),
    ],
)
def test_an_internationalised_host_is_sent_by_its_punycode_name(url: str, line: str, host: str) -> None:
    prepared = prepare("POST", url, (("X-Ok", "fine"),))
    head = prepared.head.decode("ascii").split("\r\n")
    assert head[0] == line
    assert f"Host: {host}" in head
    assert prepared.origin.host == host.partition(":")[0]  # what is resolved and connected to


def test_a_header_value_http_cannot_carry_is_named_when_preparing() -> None:
    with pytest.raises(ValueError, match="'X-Note'"):
        prepare("POST", "http://127.0.0.1:9/", (("X-Ok", "fine"), ("X-Note", "€")))
