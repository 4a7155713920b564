"""Health, auto-pause, notifications and the late watchdog with real processes: the API (which
takes part in the watch), scheduler nodes, PostgreSQL, Redis and real HTTP receivers.

Figures are printed (run with -s)."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cronman.dev.embedded import Child
from cronman.dev.receiver import Received, Receiver
from cronman.model import signing
from tests.helpers import api_session, start_api_process, start_node_process, wait_for
from tests.timings import FAST

# timings: fleet features across real processes: mechanics
pytestmark = [pytest.mark.cluster, pytest.mark.timings(FAST)]

WATCH = {"CRONMAN_WATCH_SECONDS": "0.5"}


class Stack:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = {**env, **WATCH}
        self.logs = logs
        self.api, self.url = start_api_process(self.env, logs / "api.log")
        self.s = api_session(self.env)
        self.nodes: dict[str, Child] = {}

    def start_node(self, node_id: str, wait: bool = True) -> Child:
        child, _ = start_node_process(
            self.env, node_id, self.logs / f"{node_id}-{len(self.nodes)}.log", wait_ready=wait
        )
        self.nodes[node_id] = child
        return child

    def stop_nodes(self) -> None:
        for child in self.nodes.values():
            child.signal(signal.SIGTERM)
        for child in self.nodes.values():
            child.stop(30)

    def close(self) -> None:
        self.stop_nodes()
        self.api.stop(15)
        self.s.close()

    def call(self, method: str, path: str, expect: int = 200, **kw: Any) -> Any:
        r = self.s.request(method, f"{self.url}{path}", timeout=10, **kw)
        assert r.status_code == expect, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def job(self, job_id: str) -> dict[str, Any]:
        return self.call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    def executions(self, job_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/v1/jobs/{job_id}/executions?limit=1000")["executions"]  # type: ignore[no-any-return]


@pytest.fixture
def stack(settings_env: dict[str, str], workdir: Path) -> Iterator[Stack]:
    logs = workdir / f"fleet-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    s = Stack(settings_env, logs)
    try:
        yield s
    finally:
        s.close()


def _notes(receiver: Receiver, kind: str | None = None) -> list[dict[str, Any]]:
    out = []
    for r in receiver.snapshot():
        doc = json.loads(r.body)
        if kind is None or doc["event"] == kind:
            out.append(doc)
    return out


def _signed(r: Received, secret: str, context: signing.Context) -> bool:
    """Whether ``r`` carries a valid signature for ``context``, under either header."""
    now = int(time.time())
    headers = (r.headers.get(signing.HEADER, ""), r.headers.get(signing.NOTIFICATION_HEADER, ""))
    return any(signing.verify(secret, h, r.body, now, context=context) for h in headers)


def test_a_failing_job_pauses_itself_notifies_and_recovers(stack: Stack) -> None:
    secret = stack.call("POST", "/v1/signing-secrets", 201)["secret"]
    with Receiver(fail_first=10**9) as hook, Receiver() as alerts:
        stack.call(
            "PUT",
            "/v1/notifications/oncall",
            201,
            json={
                "events": ["execution.permanently_failed", "job.auto_paused", "job.recovered"],
                "selector": "team=payments",
                "target": {"type": "http", "url": f"{alerts.url}/alerts"},
                "min_interval_seconds": 6,
            },
        )
        stack.start_node("node-1")
        t0 = time.monotonic()
        stack.call(
            "POST",
            "/v1/jobs",
            201,
            json={
                "id": "flaky",
                "labels": {"team": "payments"},
                "schedule": {"type": "interval", "every_seconds": 2},
                "target": {"type": "http", "url": f"{hook.url}/hook", "timeout_seconds": 5},
                "retry": {"max_attempts": 2, "backoff_seconds": 0.2, "jitter": False},
                "failure_policy": {"pause_after_consecutive_failures": 3},
            },
        )
        job = wait_for(lambda: (j := stack.job("flaky"))["paused"] and j, 40, "the job to pause itself")
        paused_after = time.monotonic() - t0
        reason = job["paused_reason"]
        assert reason["reason"] == "consecutive_failures" and reason["by"] == "scheduler", reason
        assert reason["consecutive_failures"] == 3 and reason["since"]
        assert job["health"]["state"] == "paused"
        assert job["health"]["consecutive_failures"] >= 3
        events = stack.call("GET", "/v1/jobs/flaky/events")["events"]
        pauses = [e for e in events if e["action"] == "pause"]
        assert len(pauses) == 1 and pauses[0]["actor"] == "scheduler", pauses
        time.sleep(1.0)  # an execution in flight when the pause landed finishes
        history = stack.executions("flaky")
        failed = [e for e in history if e["status"] == "permanently_failed"]
        attempts = [e for e in history if e["status"] in ("failed", "permanently_failed")]

        # Every permanently failed execution is told, summarised; then the pause, once.
        wait_for(lambda: _notes(alerts, "job.auto_paused"), 20, "the auto_paused notification")
        wait_for(
            lambda: sum(n["count"] for n in _notes(alerts, "execution.permanently_failed")) >= len(failed),
            20,
            "a notification of each permanently failed execution",
        )
        pf = _notes(alerts, "execution.permanently_failed")
        assert sum(n["count"] for n in pf) == len(failed)
        assert len(pf) < len(failed), "a burst of failures is summarised"
        assert len(_notes(alerts, "job.auto_paused")) == 1

        # Fixed and resumed: the next success is a recovery, told once.
        hook.fail_first = 0
        resumed = stack.call("POST", "/v1/jobs/flaky/resume")
        assert resumed["paused_reason"] is None
        wait_for(lambda: _notes(alerts, "job.recovered"), 30, "the recovered notification")
        time.sleep(3)
        job = stack.job("flaky")
        got = alerts.snapshot()
        deliveries = hook.snapshot()

    assert len(_notes(alerts, "job.recovered")) == 1
    assert job["health"]["state"] == "ok" and job["health"]["consecutive_failures"] == 0, job["health"]
    assert job["health"]["last_success_at"] and job["health"]["last_failure_at"]
    for r in got:  # signed as notifications: not a signature any job endpoint would take
        assert signing.HEADER not in r.headers and _signed(r, secret, signing.Context.NOTIFICATION), r.headers
        assert not _signed(r, secret, signing.Context.DELIVERY)
    assert deliveries and all(_signed(d, secret, signing.Context.DELIVERY) for d in deliveries)
    assert not any(_signed(d, secret, signing.Context.NOTIFICATION) for d in deliveries)
    for r in got:
        doc = json.loads(r.body)
        assert {"event_id", "event", "namespace", "job_id", "at", "count"} <= doc.keys()
        assert r.headers["Cronman-Event-Id"] == doc["event_id"] and doc["job_id"] == "flaky"
    assert len({json.loads(r.body)["event_id"] for r in got}) == len(got)
    print(
        "\nauto-pause:",
        json.dumps(
            {
                "seconds_to_pause": round(paused_after, 1),
                "attempts": len(attempts),
                "permanently_failed": len(failed),
                "notifications": [(n["event"], n["count"]) for n in _notes(alerts)],
            }
        ),
    )


def test_all_nodes_down_occurrences_are_late_until_delivered(stack: Stack) -> None:
    """All nodes stopped (a test-sized outage, 20 s unless FLEET_OUTAGE_SECONDS says otherwise, with
    late_after_seconds 5 instead of the default 60): the API's watchdog records every occurrence due
    then late, in one row for the stall that says how many, health says late until the misfire
    policy delivers, and one execution.late notification arrives during the outage."""
    outage = float(os.environ.get("FLEET_OUTAGE_SECONDS", "20"))
    with Receiver() as hook, Receiver() as alerts:
        stack.call(
            "PUT",
            "/v1/notifications/late",
            201,
            json={
                "events": ["execution.late"],
                "target": {"type": "http", "url": alerts.url},
                "min_interval_seconds": 4,
            },
        )
        for n in ("node-1", "node-2"):
            stack.start_node(n)
        stack.call(
            "POST",
            "/v1/jobs",
            201,
            json={
                "id": "beat",
                "schedule": {"type": "interval", "every_seconds": 2, "start_at": "2026-01-01T00:00:00Z"},
                "target": {"type": "http", "url": hook.url},
                "late_after_seconds": 5,
            },
        )
        wait_for(lambda: len(hook.snapshot()) >= 3, 20, "deliveries before the outage")
        stack.stop_nodes()
        down_at = time.time()
        last_before = max(_ts(r.headers["Cronman-Scheduled-For"]) for r in hook.snapshot())
        health = wait_for(lambda: (h := stack.job("beat")["health"])["state"] == "late" and h, 15, "health late")
        late_notes = wait_for(lambda: _notes(alerts, "execution.late"), 15, "an execution.late notification")
        time.sleep(max(0.0, down_at + outage - time.time()))
        during = stack.job("beat")["health"]
        late_rows = [e for e in stack.executions("beat") if e["status"] == "late"]
        up_at = time.time()
        for n in ("node-1", "node-2"):
            stack.start_node(n, wait=False)
        recovered = wait_for(
            lambda: (h := stack.job("beat")["health"])["state"] == "ok" and h, 40, "health ok after the misfire"
        )
        back_after = time.time() - up_at
        time.sleep(5)  # the watchdog's passes since leave nothing new
        history = stack.executions("beat")
        notes = _notes(alerts, "execution.late")
        _dump(stack, history)

    delivered = {_ts(r.headers["Cronman-Scheduled-For"]) for r in hook.snapshot()}
    assert health["late_since"] and during["state"] == "late"
    [stall] = [e for e in history if e["status"] == "late"]  # one row for the stall
    first, n = _ts(stall["scheduled_for"]), stall["occurrences"]
    assert _ts(stall["last_scheduled_for"]) == first + 2 * (n - 1)
    late_for = {first + 2 * k for k in range(n)}
    # Every occurrence due while no node ran, and older than late_after_seconds before they came
    # back, is recorded late (the watchdog looks every 0.5 s: allow a pass).
    due = [last_before + 2 * k for k in range(1, 1000) if last_before + 2 * k <= up_at - 5 - 1.5]
    assert due and set(due) <= late_for, (sorted(due), sorted(late_for))
    first_after = min(t for t in delivered if t > last_before)
    assert all(last_before < t < first_after for t in late_for), (down_at, up_at, sorted(late_for), sorted(delivered))
    assert all(e["attempt"] == 0 and e["node"] == "watchdog" and e["error"].startswith("late:") for e in late_rows)
    assert max(delivered) > max(late_for), "the misfire policy delivered after the outage"
    assert sum(n["count"] for n in notes) == 1  # one event for the row, not one an occurrence
    assert late_notes[0]["count"] == 1 and late_notes[0]["job_id"] == "beat"
    print(
        "\nall nodes down:",
        json.dumps(
            {
                "outage_s": round(up_at - down_at, 1),
                "late_occurrences": len(late_for),
                "late_notifications": [n["count"] for n in notes],
                "health_ok_after_restart_s": round(back_after, 1),
                "recovered_health": recovered,
            }
        ),
    )


def _dump(stack: Stack, history: list[dict[str, Any]]) -> None:
    out = os.environ.get("FLEET_DEBUG")
    if out:
        Path(out).write_text(json.dumps(history, indent=1))
        for f in stack.logs.glob("*.log"):
            (Path(out).parent / f.name).write_text(f.read_text(errors="replace"))


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
