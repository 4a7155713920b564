"""``cronman jobs ...`` against the real API on a real socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronman.client import Client
from cronman.dev.receiver import Receiver
from cronman.settings import Settings
from tests.cli.conftest import job
from tests.helpers import NodeThread, wait_for

FILE = """\
- id: invoice-reminder
  name: Invoice reminders
  labels: {team: payments, env: prod}
  schedule: {type: cron, expression: "0 7 * * 1-5", timezone: America/New_York}
  target: {type: http, url: "https://example.com/invoices"}
- id: settle
  labels: {team: payments, env: dev}
  schedule: {type: interval, every_seconds: 900}
  target: {type: http, url: "https://example.com/settle"}
"""


@pytest.fixture
def two_jobs(cli: Any, tmp_path: Path) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(FILE)
    r = cli("jobs", "create", "-f", str(path))
    assert (r.rc, r.out, r.err) == (0, "job/invoice-reminder created\njob/settle created\n", "")
    return path


def test_create_and_list(cli: Any, two_jobs: Path) -> None:
    r = cli("jobs", "list")
    assert r.rc == 0
    lines = r.out.splitlines()
    assert lines[0].split() == ["ID", "NAMESPACE", "SCHEDULE", "STATE", "HEALTH", "NEXT", "FIRE", "LABELS"]
    assert lines[1].split()[:2] == ["invoice-reminder", "default"]
    assert "cron 0 7 * * 1-5 America/New_York" in lines[1] and lines[1].endswith("env=prod,team=payments")
    assert lines[2].split()[:6] == ["settle", "default", "every", "15m", "active", "ok"]
    assert len(lines) == 3
    assert [ln.split()[0] for ln in cli("jobs", "list", "-l", "env!=dev").out.splitlines()[1:]] == ["invoice-reminder"]
    assert [ln.split()[0] for ln in cli("jobs", "list", "-q", "REMIND").out.splitlines()[1:]] == ["invoice-reminder"]
    empty = cli("jobs", "list", "--selector", "team=nobody")
    assert (empty.rc, empty.out, empty.err) == (0, "", "no jobs found\n")


def test_output_formats(cli: Any, two_jobs: Path, cron: Client) -> None:
    listed = json.loads(cli("jobs", "list", "-o", "json").out)
    assert [j["id"] for j in listed] == ["invoice-reminder", "settle"]
    assert listed[0] == cron.get_job("invoice-reminder").model_dump(mode="json")
    one = yaml.safe_load(cli("jobs", "get", "settle", "-o", "yaml").out)
    assert one["id"] == "settle" and one["labels"] == {"team": "payments", "env": "dev"}
    table = cli("jobs", "get", "settle", "invoice-reminder").out.splitlines()
    assert [ln.split()[0] for ln in table] == ["ID", "settle", "invoice-reminder"]


def test_create_from_json_and_standard_input(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(job("from-json")))
    assert cli("jobs", "create", "-f", str(path)).out == "job/from-json created\n"
    r = cli("jobs", "create", "-f", "-", "-o", "json", stdin=json.dumps({"jobs": [job("from-stdin")]}))
    assert r.rc == 0 and [j["id"] for j in json.loads(r.out)] == ["from-stdin"]
    again = cli("jobs", "create", "-f", str(path))
    assert again.rc == 1
    assert again.err == f"cronman: job/from-json ({path}): a job with id 'from-json' already exists (409 conflict)\n"


def test_pause_resume_delete_by_id_or_selector(cli: Any, two_jobs: Path, cron: Client) -> None:
    assert cli("jobs", "pause", "-l", "team=payments").out == "job/invoice-reminder paused\njob/settle paused\n"
    assert {j.state for j in cron.list_jobs()} == {"paused"}
    assert cli("jobs", "resume", "settle").out == "job/settle resumed\n"
    assert cron.get_job("settle").state == "active"
    r = cli("jobs", "delete", "settle", "nope", "invoice-reminder")
    assert r.rc == 1
    assert r.out == "job/settle deleted\njob/invoice-reminder deleted\n"
    assert r.err == "cronman: job/nope: no job with id 'nope' (404 not_found)\n"
    assert list(cron.list_jobs()) == []
    both = cli("jobs", "pause", "settle", "-l", "team=payments")
    assert both.rc == 1 and both.err == "cronman: name the jobs, or select them with --selector (not both)\n"


def test_next_in_utc_and_in_the_job_s_zone(cli: Any, two_jobs: Path) -> None:
    r = cli("jobs", "next", "invoice-reminder", "--count", "3", "--after", "2030-03-08T00:00:00Z")
    assert r.out.splitlines() == [
        "UTC                   America/New_York",
        "2030-03-08T12:00:00Z  2030-03-08 07:00:00 EST",
        "2030-03-11T11:00:00Z  2030-03-11 07:00:00 EDT",
        "2030-03-12T11:00:00Z  2030-03-12 07:00:00 EDT",
    ]
    r = cli("jobs", "next", "settle", "--count", "1", "-o", "json")
    assert len(json.loads(r.out)) == 1
    bad = cli("jobs", "next", "settle", "--after", "tomorrow")
    assert (bad.rc, bad.err) == (1, "cronman: --after 'tomorrow': not an ISO-8601 instant (2030-01-01T00:00:00Z)\n")


def test_trigger_then_history_and_events(cli: Any, cron: Client, settings: Settings) -> None:
    with Receiver() as receiver, NodeThread(settings):
        cron.create_job(job("hook", target={"type": "http", "url": f"{receiver.url}/hook"}))
        assert cli("jobs", "history", "hook").err == "job/hook has no history yet\n"
        r = cli("jobs", "trigger", "hook")
        assert r.rc == 0 and r.out.startswith("job/hook triggered: execution ")
        execution_id = r.out.split()[3].rstrip(",")
        wait_for(lambda: receiver.received, 15, "the delivery")
        wait_for(lambda: list(cron.executions("hook")), 10, "the history row")
    lines = cli("jobs", "history", "hook").out.splitlines()
    assert lines[0].split() == ["SCHEDULED", "FOR", "ATTEMPT", "STATUS", "NODE", "LAG", "RESULT", "EXECUTION"]
    assert lines[1].split()[1:4] == ["1", "succeeded", "(manual)"] and lines[1].endswith(execution_id)
    assert "HTTP 200" in lines[1]
    rows = json.loads(cli("jobs", "history", "hook", "-o", "json").out)
    assert rows[0]["execution_id"] == execution_id and rows[0]["status"] == "succeeded"
    events = cli("jobs", "events", "hook").out.splitlines()
    assert [ln.split()[1] for ln in events[1:]] == ["trigger", "create"]


def test_lists_stop_at_the_limit_and_say_so(cli: Any, cron: Client) -> None:
    cron.put_jobs([job(f"j{i}") for i in range(5)])
    r = cli("jobs", "list", "--limit", "3")
    assert len(r.out.splitlines()) == 4 and r.err == "(the first 3 jobs; --limit 0 shows all)\n"
    assert len(cli("jobs", "list", "--limit", "0").out.splitlines()) == 6


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", "get", "nope"], "cronman: no job with id 'nope' (404 not_found)"),
        (
            ["jobs", "list", "-l", "team=pay ments"],
            "cronman: selector: expected ',' at position 10, found 'ments' (400 invalid_selector)",
        ),
        (["jobs", "list", "-n", "Bad Namespace!"], None),
        (["jobs", "create", "-f", "/no/such/file.yaml"], "cronman: /no/such/file.yaml: No such file or directory"),
    ],
)
def test_errors_are_one_line_and_a_non_zero_exit(cli: Any, argv: list[str], message: str | None) -> None:
    r = cli(*argv)
    assert r.rc == 1 and r.out == "" and len(r.err.splitlines()) == 1 and r.err.startswith("cronman: ")
    if message:
        assert r.err == message + "\n"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONMAN_")}
    return {**env, **extra}


def test_no_traceback_from_the_real_command(api_url: str, tmp_path: Path) -> None:
    """The console script itself: a refused request, an API that is not there, no API at all."""
    cases = [
        (_env(CRONMAN_API_URL=api_url, CRONMAN_API_KEY="wrong-key-0123456789"), "(401 unauthorized)"),
        (_env(CRONMAN_API_URL="http://127.0.0.1:9"), "cannot reach the cronman API at http://127.0.0.1:9"),
        (_env(XDG_CONFIG_HOME=str(tmp_path)), "no API to talk to: set CRONMAN_API_URL and CRONMAN_API_KEY"),
    ]
    for env, says in cases:
        p = subprocess.run(
            [sys.executable, "-m", "cronman", "jobs", "list"], env=env, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 1 and p.stdout == "", p.stderr
        assert len(p.stderr.splitlines()) == 1 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_notification_rules(cli: Any, tmp_path: Path) -> None:
    rule = tmp_path / "rule.yaml"
    rule.write_text("events: [job.recovered]\nselector: team=a\ntarget: {type: http, url: 'https://example.com/n'}\n")
    assert cli("notifications", "put", "oncall", "-f", str(rule)).rc == 0
    lines = cli("notifications", "list").out.splitlines()
    assert lines[0].split() == ["NAME", "NAMESPACE", "EVENTS", "SELECTOR", "TARGET", "INTERVAL"]
    assert lines[1].split() == ["oncall", "default", "job.recovered", "team=a", "https://example.com/n", "60s"]
    assert json.loads(cli("notifications", "list", "-o", "json").out)[0]["min_interval_seconds"] == 60
    assert cli("notifications", "delete", "oncall").rc == 0
    assert cli("notifications", "list").out.splitlines()[1:] == []


def test_next_shows_the_jobs_hashed_times(cli: Any, cron: Client) -> None:
    from cronman.model.schedule import next_times, timing_from_dict
    from cronman.model.timeutil import iso, parse_iso

    schedule = {"type": "cron", "expression": "H H(2-4) * * *"}
    cron.create_job(job("nightly-h", schedule=schedule))
    after = "2030-03-08T00:00:00Z"
    r = cli("jobs", "next", "nightly-h", "--count", "3", "--after", after, "-o", "json")
    expected = next_times(timing_from_dict(schedule, "nightly-h", "default"), parse_iso(after), 3)
    assert json.loads(r.out) == [iso(t) for t in expected]
    assert all(2 <= int(t[11:13]) <= 4 for t in json.loads(r.out))
