"""A namespace at its quotas beside an ordinary one, with real processes (the API, which leads the
watch, and two scheduler nodes), PostgreSQL, Redis and HTTP receivers.

Namespace noisy: as many notification rules as its quota allows, every one to a target that never
answers; 50 jobs failing every second; backfills of a per-second job at its whole backfill rate;
as many calendars as its quota allows, each of the most entries allowed, one of them written again
every second; a per-second job on days its calendar excludes. Namespace calm: 200 jobs every second
and one notification rule. Calm's deliveries stay on time, and the notification of its failing job
arrives within seconds, while noisy's storm goes on; the excluded job costs one history row a span;
no process grows past a bound. Figures are printed (run with -s)."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from cronman.dev.embedded import Child
from cronman.dev.receiver import Receiver
from cronman.model.timeutil import iso, parse_iso
from tests.helpers import NeverAnswers, api_session, start_api_process, start_node_process, wait_for
from tests.timings import DEFAULTS

# timings: the shipped ones (nothing here fails a node; the neighbour is judged at what users run)
pytestmark = [pytest.mark.cluster, pytest.mark.timings(DEFAULTS)]

RULES = 20  # the rules quota set here (the product's default is 100)
BACKFILL_RATE = 100  # executions a second, the namespace's backfill rate quota (the default)
CALM_JOBS = 200
MEASURE_S = 30
ALONE_S = 20
RSS_BOUND = 600 * 2**20  # no process past this
CALENDARS = 10  # the calendars quota set here (the product's default is 100)
ENTRIES = 10_000  # dates in each: the entries quota's default


class Stack:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.api, self.url = start_api_process(env, logs / "api.log")
        self.s = api_session(env)
        self.nodes: list[Child] = []

    def start_node(self, node_id: str) -> None:
        child, _ = start_node_process(self.env, node_id, self.logs / f"{node_id}.log")
        self.nodes.append(child)

    def call(self, method: str, path: str, expect: tuple[int, ...] = (200, 201, 202), **kw: Any) -> Any:
        r = self.s.request(method, f"{self.url}{path}", timeout=30, **kw)
        assert r.status_code in expect, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def close(self) -> None:
        for child in self.nodes:
            child.signal(signal.SIGTERM)
        for child in self.nodes:
            child.stop(30)
        self.api.stop(15)
        self.s.close()


@pytest.fixture
def stack(settings_env: dict[str, str], workdir: Path) -> Iterator[Stack]:
    logs = workdir / f"noisy-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    env = {
        **settings_env,
        "CRONMAN_WATCH_SECONDS": "2",  # the product's defaults for the watch and notifications
        "CRONMAN_NOTIFICATION_TIMEOUT_SECONDS": "10",
        "CRONMAN_QUOTA_NOTIFICATION_RULES_PER_NAMESPACE": str(RULES),
        "CRONMAN_QUOTA_BACKFILL_RATE_PER_NAMESPACE": str(BACKFILL_RATE),
        "CRONMAN_CALENDARS_PER_NAMESPACE": str(CALENDARS),
    }
    s = Stack(env, logs)
    try:
        yield s
    finally:
        s.close()


def _jobs(stack: Stack, namespace: str, docs: list[dict[str, Any]]) -> None:
    for i in range(0, len(docs), 500):
        stack.call("POST", f"/v1/jobs:batch?namespace={namespace}", json={"jobs": docs[i : i + 500]})


def _every_second(job_id: str, url: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "schedule": {"type": "interval", "every_seconds": 1},
        "target": {"type": "http", "url": url, "timeout_seconds": 5},
        "retry": {"max_attempts": 1},
        **extra,
    }


def _lags(hook: Receiver, since: float, until: float) -> list[float]:
    """Calm's deliveries of occurrences due in [since, until): arrival minus due time, sorted."""
    return sorted(
        r.at - parse_iso(r.headers["Cronman-Scheduled-For"]) / 1000
        for r in hook.snapshot()
        if since <= parse_iso(r.headers["Cronman-Scheduled-For"]) / 1000 < until
    )


def _p(lags: list[float], q: float) -> float:
    return lags[min(len(lags) - 1, int(len(lags) * q))]


def test_a_namespace_at_its_quotas_costs_another_nothing_visible(stack: Stack) -> None:
    hole = NeverAnswers()
    with Receiver(fail_first=10**9) as noisy_hook, Receiver() as calm_hook, Receiver() as alerts:
        with Receiver(fail_first=10**9) as broken:
            # calm: ordinary jobs, and a rule to its on-call receiver; alone first, for comparison
            _jobs(stack, "calm", [_every_second(f"calm-{i:03d}", f"{calm_hook.url}/c") for i in range(CALM_JOBS)])
            alert_rule = {
                "events": ["execution.failed", "execution.permanently_failed"],
                "target": {"type": "http", "url": f"{alerts.url}/a"},
            }
            stack.call("PUT", "/v1/notifications/oncall?namespace=calm", json=alert_rule)
            stack.start_node("node-1")
            stack.start_node("node-2")
            time.sleep(5)
            alone_from = time.time()
            time.sleep(ALONE_S + 2)
            alone = _lags(calm_hook, alone_from, alone_from + ALONE_S)

            # noisy: every rule the quota allows, to a target that never answers, for every failure
            rule = {
                "events": ["execution.failed", "execution.permanently_failed"],
                "target": {"type": "http", "url": hole.url},
                "min_interval_seconds": 0,
            }
            for i in range(RULES):
                stack.call("PUT", f"/v1/notifications/r{i}?namespace=noisy", json=rule)
            stack.call("PUT", "/v1/notifications/extra?namespace=noisy", expect=(409,), json=rule)
            _jobs(stack, "noisy", [_every_second(f"noisy-{i}", f"{noisy_hook.url}/n") for i in range(50)])
            _jobs(stack, "noisy", [_every_second("noisy-bf", f"{noisy_hook.url}/bf")])
            # noisy's backfills at its whole rate: 5 x 20 a second, of the last 25 minutes
            now = datetime.now(UTC).replace(microsecond=0)
            span = {
                "from": iso(int((now - timedelta(minutes=26)).timestamp() * 1000)),
                "to": iso(int((now - timedelta(minutes=1)).timestamp() * 1000)),
            }
            for _ in range(5):
                stack.call("POST", "/v1/jobs/noisy-bf/backfill", json={**span, "max_per_second": BACKFILL_RATE / 5})
            stack.call("POST", "/v1/jobs/noisy-bf/backfill", expect=(409,), json={**span, "max_per_second": 1})
            # noisy's calendars: as many as its quota, of the most entries, and a per-second job on
            # days one of them excludes (today and tomorrow, UTC)
            today = now.date()
            for c in range(CALENDARS - 1):
                dates = [(today + timedelta(days=400 + c * ENTRIES + d)).isoformat() for d in range(ENTRIES)]
                stack.call("PUT", f"/v1/calendars/big-{c}?namespace=noisy", json={"exclude": {"dates": dates}})
            days_off = {"exclude": {"dates": [today.isoformat(), (today + timedelta(days=1)).isoformat()]}}
            stack.call("PUT", "/v1/calendars/off?namespace=noisy", json=days_off)
            stack.call("PUT", "/v1/calendars/extra?namespace=noisy", expect=(409,), json=days_off)
            off_job = _every_second("noisy-off", f"{noisy_hook.url}/off", calendars=["off", "big-0"])
            _jobs(stack, "noisy", [off_job])
            rewrite = threading.Event()

            def rewriting() -> None:  # one big calendar written again every second: every node reloads it
                dates = [(today - timedelta(days=400 + d)).isoformat() for d in range(ENTRIES)]
                flip = 0
                while not rewrite.wait(1.0):
                    flip ^= 1
                    doc = {"exclude": {"dates": dates[flip:]}}
                    stack.s.put(f"{stack.url}/v1/calendars/big-0?namespace=noisy", json=doc, timeout=30)

            rewriter = threading.Thread(target=rewriting, daemon=True)
            rewriter.start()
            wait_for(lambda: hole.most_at_once >= 1, 30, "noisy's notifications to reach the black hole")
            time.sleep(10)  # the storm under way

            procs = [psutil.Process(c.pid) for c in [stack.api, *stack.nodes]]
            rss_most = 0
            started = time.time()
            # calm's job that fails: its notification
            stack.call("POST", "/v1/jobs?namespace=calm", json=_every_second("calm-broken", f"{broken.url}/b"))
            first = wait_for(lambda: broken.snapshot() and broken.snapshot()[0], 15, "calm's job to fail")
            note = wait_for(lambda: alerts.snapshot() and alerts.snapshot()[0], 30, "calm's notification")
            note_after = note.at - first.at
            while time.time() < started + MEASURE_S:
                rss_most = max(rss_most, *(p.memory_info().rss for p in procs))
                time.sleep(1)
            ended = time.time()
            rewrite.set()
            rewriter.join(30)
            time.sleep(2)
            off_rows = stack.call("GET", "/v1/jobs/noisy-off/executions?namespace=noisy&limit=100")["executions"]
            lags = _lags(calm_hook, started, ended)
            backfilled = [r for r in noisy_hook.snapshot() if r.path == "/bf" and started <= r.at < ended]
            failed = [r for r in noisy_hook.snapshot() if r.path == "/n" and started <= r.at < ended]
    hole.close()
    p99 = _p(lags, 0.99)
    print(
        "\nnoisy neighbour (processes):",
        json.dumps(
            {
                "calm_alone_lag_p50_p99_ms": [round(_p(alone, 0.5) * 1000), round(_p(alone, 0.99) * 1000)],
                "calm_deliveries": len(lags),
                "calm_lag_p50_p99_max_ms": [round(_p(lags, 0.5) * 1000), round(p99 * 1000), round(lags[-1] * 1000)],
                "calm_notification_after_failure_s": round(note_after, 2),
                "noisy_backfilled_per_s": round(len(backfilled) / (ended - started), 1),
                "noisy_failures_per_s": round(len(failed) / (ended - started), 1),
                "black_hole_connections_at_most": hole.most_at_once,
                "rss_most_mb": round(rss_most / 2**20),
                "excluded_job_history_rows": [(e["status"], e.get("occurrences")) for e in off_rows],
            }
        ),
    )
    assert len(lags) >= CALM_JOBS * (MEASURE_S - 1)  # every occurrence, none missed
    assert note_after <= 5.0, note_after
    assert len(backfilled) <= BACKFILL_RATE * (ended - started) * 1.1  # the namespace's backfill rate holds
    assert hole.most_at_once <= 4
    assert rss_most < RSS_BOUND, rss_most
    assert not [r for r in noisy_hook.snapshot() if r.path == "/off"]  # nothing on its excluded days
    # one row a span (each owner may record one when a calendar changes mid-span), not one a second
    assert 1 <= len(off_rows) <= 4 and all(e["status"] == "skipped" for e in off_rows), off_rows
    assert p99 <= 0.100, f"calm's lag p99 {p99 * 1000:.0f} ms (alone: {_p(alone, 0.99) * 1000:.0f} ms)"
