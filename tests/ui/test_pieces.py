"""The dashboard's pure pieces: schedules in words, the cluster rows, attempts grouped by execution,
times shown relative to now, local redirects; and what it ships (vendored files, package data)."""

from __future__ import annotations

import configparser
import hashlib
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from flask import Flask

from api.ui.nodes import node_rows
from api.ui.queries import Attempt, group_attempts
from api.ui.web import local_path, relative
from cronman.model.describe import cron_words, describe_schedule, duration_words, instant_words
from cronman.redis.cluster import NodeInfo

REPO = Path(__file__).resolve().parents[2]
UI = REPO / "api" / "ui"


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        ({"type": "cron", "expression": "0 7 * * *", "timezone": "America/New_York"}, "At 07:00 (America/New_York)"),
        ({"type": "cron", "expression": "0 9 * * 1-5"}, "At 09:00, Monday through Friday (UTC)"),
        ({"type": "cron", "expression": "*/15 * * * * *"}, "Every 15 seconds (UTC)"),
        ({"type": "cron", "expression": "30 2 1 * *"}, "At 02:30, on day 1 of the month (UTC)"),
        ({"type": "cron", "expression": "@daily"}, "At 00:00 (UTC)"),
        ({"type": "interval", "every_seconds": 1}, "Every second (at a phase set by the job id)"),
        ({"type": "interval", "every_seconds": 5400}, "Every 1 hour 30 minutes (at a phase set by the job id)"),
        (
            {"type": "interval", "every_seconds": 86400, "start_at": "2026-01-01T06:00:00Z"},
            "Every 1 day, counted from 2026-01-01 06:00:00 UTC",
        ),
        ({"type": "once", "at": "2026-11-13T04:13:22Z"}, "Once, at 2026-11-13 04:13:22 UTC"),
        (
            {
                "type": "cron",
                "expression": "0 * * * *",
                "start_at": "2026-01-01T00:00:00Z",
                "end_at": "2026-06-30T00:00:00+02:00",
                "jitter_seconds": 30,
            },
            "Every hour (UTC); not before 2026-01-01 00:00:00 UTC; not after 2026-06-30 00:00:00 +0200; "
            "each occurrence moved up to 30 seconds later (jitter)",
        ),
    ],
)
def test_schedules_in_words(schedule: dict[str, object], words: str) -> None:
    assert describe_schedule(schedule) == words


def test_what_the_describer_cannot_read_is_shown_as_written() -> None:
    assert cron_words("H 5 * * *") == "cron H 5 * * *"
    assert instant_words("not a time") == "not a time"
    assert describe_schedule({"type": "weekly"}) == "Unknown schedule type 'weekly'"
    assert [duration_words(s) for s in (59, 60, 61, 3600, 90061)] == [
        "59 seconds",
        "1 minute",
        "1 minute 1 second",
        "1 hour",
        "1 day 1 hour 1 minute 1 second",
    ]


def test_cluster_rows_take_what_each_node_reports_and_tolerate_the_rest() -> None:
    full = NodeInfo(
        "n1",
        0.4,
        {"ready": True, "jobs": 10, "slots": 4096, "in_flight": 3, "fires_per_s": 12.5, "lag_p99_ms": 40},
    )
    odd = NodeInfo("n2", 2.0, {"ready": "yes", "jobs": "many", "fires_per_s": True})
    rows = {r.id: r for r in node_rows([full, odd], 2)}
    assert (rows["n1"].slots, rows["n1"].jobs, rows["n1"].in_flight, rows["n1"].fires_per_s) == (4096, 10, 3, 12.5)
    assert rows["n1"].lag_p99_ms == 40 and rows["n1"].ready is True
    assert rows["n2"].slots == 4096  # not reported: as rendezvous hashing assigns them (two nodes, two copies)
    assert (rows["n2"].ready, rows["n2"].jobs, rows["n2"].fires_per_s, rows["n2"].lag_p99_ms) == (None,) * 4


def _attempt(execution_id: str, attempt: int, status: str) -> Attempt:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return Attempt(execution_id, at, 0, attempt, "schedule", status, "n", at, at, 1, 200, None, 0, None)


def test_attempts_of_one_execution_stay_together() -> None:
    x, y = str(uuid.uuid4()), str(uuid.uuid4())
    groups = group_attempts([_attempt(x, 3, "succeeded"), _attempt(x, 2, "failed"), _attempt(y, 1, "failed")])
    assert [[a.attempt for a in g.attempts] for g in groups] == [[3, 2], [1]]
    assert groups[0].status == "succeeded" and not groups[0].redeliverable
    assert groups[1].redeliverable and groups[0].first.attempt == 2


def test_times_relative_to_now() -> None:
    now = 1_000_000_000
    assert relative(now + 500, now) == "now"
    assert relative(now + 3_000, now) == "in 3 s"
    assert relative(now - 90_000, now) == "1.5 min ago"
    assert relative(now + 17 * 3600_000, now) == "in 17 h"
    assert relative(None, now) == ""


def test_only_paths_of_the_dashboard_are_followed_after_login(app: Flask) -> None:
    with app.test_request_context():
        assert local_path("/ui/jobs?q=a") == "/ui/jobs?q=a"
        for bad in ("https://evil.example/ui/", "//evil.example/ui/", "/v1/jobs", "/ui\\..\\x", "", None):
            assert local_path(bad) == "/ui/jobs"


def test_vendored_libraries_are_pinned_with_their_licences_and_checksums() -> None:
    vendor = UI / "static" / "vendor"
    readme = (vendor / "README.md").read_text()
    listed = dict((path, digest) for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M))
    files = [p for p in vendor.rglob("*") if p.is_file() and p.suffix in (".js", ".css")]
    shipped = {p.relative_to(vendor).as_posix() for p in files}
    assert set(listed) == shipped
    for path, digest in listed.items():
        assert hashlib.sha256((vendor / path).read_bytes()).hexdigest() == digest, path
        assert (vendor / path).parent.joinpath("LICENSE").is_file()
    templates = "".join(p.read_text() for p in (UI / "templates").rglob("*.html"))
    for path in shipped:
        assert path in templates  # each is used, at the version pinned here
    assert "//" not in re.sub(r"https?://[^\s'\"]+", "", "".join(re.findall(r'(?:src|href)="([^"]*)"', templates)))


def test_the_package_ships_every_template_and_static_file() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["api"].split(",")]
    packaged = {f for pattern in patterns for f in (REPO / "api").glob(pattern)}  # as setuptools globs them
    data = {p for p in UI.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".py"}
    assert data - packaged == set()
