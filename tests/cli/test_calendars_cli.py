"""``cronman calendars ...``, ``cronman jobs backfill`` and ``cronman backfills ...`` against the real API."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.cli.conftest import job

CALENDAR = """\
timezone: Europe/Berlin
exclude:
  dates: [2026-12-25]
  weekdays: [sat, sun]
"""


def test_calendars_put_get_list_delete(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "holidays.yaml"
    path.write_text(CALENDAR)
    r = cli("calendars", "put", "holidays", "-f", str(path))
    assert (r.rc, r.out) == (0, "calendar/holidays saved: 1 dates, sat,sun (Europe/Berlin)\n"), r.err
    r = cli("calendars", "get", "holidays", "-o", "json")
    doc = json.loads(r.out)
    assert doc["exclude"]["dates"] == ["2026-12-25"] and doc["timezone"] == "Europe/Berlin"
    r = cli("calendars", "put", "empty", "-f", "-", stdin='{"exclude": {}}')
    assert r.rc == 0, r.err
    r = cli("calendars", "list")
    lines = r.out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "NAMESPACE", "TIMEZONE", "EXCLUDES"]
    assert [ln.split()[0] for ln in lines[1:]] == ["empty", "holidays"]
    # a job that names it keeps it from being deleted
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(job("daily", calendars=["holidays"])))
    assert cli("jobs", "create", "-f", str(job_file)).rc == 0
    r = cli("jobs", "next", "daily", "--after", "2026-12-24T12:00:00Z", "--count", "2", "-o", "json")
    assert json.loads(r.out) == ["2026-12-28T06:00:00Z", "2026-12-29T06:00:00Z"]
    r = cli("calendars", "delete", "holidays")
    assert r.rc == 1 and "named by jobs daily" in r.err
    r = cli("calendars", "put", "bad", "-f", "-", stdin='{"exclude": {"weekdays": ["someday"]}}')
    assert r.rc == 1 and "exclude.weekdays[0]" in r.err
    assert cli("calendars", "delete", "empty").out == "calendar/empty deleted\n"


def test_jobs_backfill_and_backfills(cli: Any, tmp_path: Path) -> None:
    job_file = tmp_path / "job.json"
    schedule = {"type": "interval", "every_seconds": 60, "start_at": "2026-01-01T00:00:00Z"}
    job_file.write_text(json.dumps(job("minutely", schedule=schedule)))
    assert cli("jobs", "create", "-f", str(job_file)).rc == 0
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    start, end = (minute - timedelta(minutes=30)).isoformat(), (minute - timedelta(minutes=1)).isoformat()
    r = cli("jobs", "backfill", "minutely", "--from", start, "--to", end, "--rate", "5")
    assert r.rc == 0, r.err
    assert r.out.startswith("backfill/bf-") and r.out.endswith("started: 30 executions of job/minutely at 5/s\n")
    backfill_id = r.out.split()[0].split("/")[1]
    r = cli("backfills", "get", backfill_id)
    assert r.out.splitlines()[1].split()[:3] == [backfill_id, "minutely", "running"]
    r = cli("backfills", "list", "minutely", "-o", "json")
    assert [b["id"] for b in json.loads(r.out)] == [backfill_id]
    r = cli("backfills", "cancel", backfill_id)
    assert r.out == f"backfill/{backfill_id} cancelled: 0 of 30 delivered\n"
    r = cli("jobs", "backfill", "minutely", "--from", "yesterday", "--to", end)
    assert r.rc == 1 and "--from 'yesterday'" in r.err
