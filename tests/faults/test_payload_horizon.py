"""Payloads out of memory (scheduler_node.payloads): a node keeps a job's payload only while the
job is due within the payload horizon, and reads the rest again ahead of time, or when an
execution needs one now. What must hold: every delivery carries its job's payload byte for byte,
and a PostgreSQL outage shorter than the horizon delays no occurrence; a longer one delays (and
never loses) those due past what was read ahead. Real processes, a real PostgreSQL crashed with
SIGKILL and started again, a real receiver."""

from __future__ import annotations

import hashlib
import json
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from cronman.dev.embedded import Child, EmbeddedPostgres
from cronman.dev.receiver import Received, Receiver
from cronman.model.timeutil import parse_iso
from tests.conftest import ADMIN_KEY
from tests.helpers import start_api_process, start_node_process, wait_for
from tests.timings import DEFAULTS, FAST

pytestmark = [pytest.mark.cluster]


def _payload(job_id: str) -> dict[str, Any]:
    """About 300 bytes, different for every job: well past what a node always keeps (64 bytes)."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()
    return {"job": job_id, "note": "tab\there, newline\nhere, \u00e9t\u00e9", "pad": digest * 4}


def _body(job_id: str) -> bytes:
    """What the receiver must get: the payload as the API stores it (compact JSON, UTF-8)."""
    return json.dumps(_payload(job_id), separators=(",", ":"), ensure_ascii=False).encode()


def _session() -> requests.Session:
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    return s


def _create(api_url: str, jobs: list[dict[str, Any]]) -> None:
    s = _session()
    for job in jobs:
        r = s.post(f"{api_url}/v1/jobs", json=job, timeout=10)
        assert r.status_code == 201, r.text


def _job(job_id: str, url: str, schedule: dict[str, Any]) -> dict[str, Any]:
    return {"id": job_id, "schedule": schedule, "target": {"type": "http", "url": url}, "payload": _payload(job_id)}


def _metric(port: int, name: str, **labels: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def _reads(port: int) -> list[float]:
    """Payloads the node read: ahead, and when needed (once each has happened)."""
    return [v for why in ("ahead", "needed") if (v := _metric(port, "cronman_payloads_read_total", why=why))]


def _scheduled(r: Received) -> float:
    return parse_iso(r.headers["Cronman-Scheduled-For"]) / 1000


def _wrong_bodies(received: list[Received]) -> list[str]:
    return [
        f"{r.job_id} {r.execution_id}: {r.body[:80]!r}"
        for r in received
        if r.job_id is not None and r.body != _body(r.job_id)
    ]


def _stop(node: Child) -> None:
    node.signal(signal.SIGTERM)
    assert node.proc.wait(60) == 0


@pytest.mark.timings(DEFAULTS)
def test_at_the_defaults_payloads_come_back_from_postgres_and_an_outage_delays_nothing(
    own_postgres: EmbeddedPostgres, settings_env: dict[str, str], workdir: Path
) -> None:
    """The product's settings (a horizon of 10 minutes). The node is started again after the jobs
    exist, so it loads them without their payloads; it reads those of the jobs due soon ahead of
    time, and then fires through a PostgreSQL crash of 8 s with every payload exact. Daily jobs,
    whose payloads stay out of memory, are triggered by hand after PostgreSQL is back: each
    execution reads its payload then."""
    env = {**settings_env, "CRONMAN_DATABASE_URL": own_postgres.url()}
    assert "CRONMAN_PAYLOAD_HORIZON_SECONDS" not in env or float(env["CRONMAN_PAYLOAD_HORIZON_SECONDS"]) == 600
    logs = workdir / f"payloads-defaults-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    api, api_url = start_api_process(env, logs / "api.log")
    node, port = start_node_process(env, "node-1", logs / "node-1a.log")
    nodes = [node]
    far_hour = (datetime.now(UTC) + timedelta(hours=12)).hour
    hot = [f"hot-{i}" for i in range(20)]
    daily = [f"daily-{i}" for i in range(10)]
    try:
        with Receiver() as receiver:
            jobs = [_job(j, receiver.url, {"type": "interval", "every_seconds": 1}) for j in hot]
            jobs += [
                _job(j, receiver.url, {"type": "cron", "expression": f"{i} {far_hour} * * *"})
                for i, j in enumerate(daily)
            ]
            _create(api_url, jobs)
            wait_for(lambda: {r.job_id for r in receiver.snapshot()} >= set(hot), 15, "every hot job delivered")
            _stop(node)
            # started again: it loads the jobs, payloads of more than 64 bytes left out
            node, port = start_node_process(env, "node-1", logs / "node-1b.log")
            nodes.append(node)
            # (read ahead, or, for those due at once, when their first execution needed them)
            wait_for(lambda: len(_reads(port)) == 2 and sum(_reads(port)) >= len(hot), 15, "the payloads read again")
            ahead = _metric(port, "cronman_payloads_read_total", why="ahead")
            time.sleep(2)
            own_postgres.kill()  # SIGKILL: a crash
            killed = time.time()
            time.sleep(8)
            own_postgres.start()
            back = time.time()
            wait_for(lambda: requests.get(f"{api_url}/readyz", timeout=2).ok, 30, "the API to reach PostgreSQL again")
            s = _session()
            triggered = {}
            for j in daily:
                r = s.post(f"{api_url}/v1/jobs/{j}/trigger", timeout=10)
                assert r.status_code == 202, r.text
                triggered[r.json()["execution_id"]] = j
            wait_for(
                lambda: set(triggered) <= {r.execution_id for r in receiver.snapshot()}, 20, "the triggers delivered"
            )
            needed = _metric(port, "cronman_payloads_read_total", why="needed")
            ahead = _metric(port, "cronman_payloads_read_total", why="ahead")
            received = receiver.snapshot()
        _stop(node)
    finally:
        for n in nodes:
            n.stop()
        api.stop()
    wrong = _wrong_bodies(received)
    assert not wrong, f"{len(wrong)} deliveries carried another payload than their job's: {wrong[:5]}"
    # every hot job's occurrences due while PostgreSQL was down: each delivered, and on time
    first: dict[str, float] = {}
    for r in received:
        if r.execution_id is not None:
            first[r.execution_id] = min(first.get(r.execution_id, r.at), r.at)
    due = [r for r in received if r.job_id in hot and killed + 1 <= _scheduled(r) <= back - 1]
    per_job = {j: {_scheduled(r) for r in due if r.job_id == j} for j in hot}
    late = sorted(first[r.execution_id] - _scheduled(r) for r in due if r.execution_id is not None)
    report = {
        "read_ahead": ahead,
        "read_when_needed": needed,
        "outage_s": round(back - killed, 1),
        "due_in_outage": sum(len(v) for v in per_job.values()),
        "worst_lag_s": round(late[-1], 2) if late else None,
    }
    print("\npayloads at the defaults:", json.dumps(report))
    short = {j: len(v) for j, v in per_job.items() if len(v) < int(back - killed) - 3}
    assert not short, f"hot jobs that stopped firing while PostgreSQL was down: {short}"
    assert late and late[-1] < 2.0, f"an occurrence due in the outage was {late[-1]:.1f}s late"
    assert needed >= len(daily), "the daily jobs' payloads were in memory: nothing was left out"
    assert ahead >= len(hot), "the read-ahead read nothing"


@pytest.mark.timings(FAST)
def test_an_outage_longer_than_the_horizon_delays_what_was_not_read_ahead_and_loses_nothing(
    own_postgres: EmbeddedPostgres, settings_env: dict[str, str], workdir: Path
) -> None:
    """Mechanics, with a horizon of 6 s (read-ahead passes 2 s apart): jobs every 15 s let their
    payload go after each occurrence and read it again before the next. PostgreSQL crashes for
    about 20 s: what was due within the horizon (less a pass) of the crash is delivered on time;
    what was due later waits for PostgreSQL and is delivered, late, once it is back; nothing is
    missed, nothing delivered twice, and every payload is exact."""
    env = {**settings_env, "CRONMAN_DATABASE_URL": own_postgres.url(), "CRONMAN_PAYLOAD_HORIZON_SECONDS": "6"}
    logs = workdir / f"payloads-horizon-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    api, api_url = start_api_process(env, logs / "api.log")
    node, port = start_node_process(env, "node-1", logs / "node-1.log")
    warm = [f"warm-{i}" for i in range(15)]
    start = datetime.now(UTC).replace(microsecond=0)
    try:
        with Receiver() as receiver:
            # phased a second apart: one job or another is due every second
            phased = [(start + timedelta(seconds=i)).isoformat() for i in range(len(warm))]
            schedules = [{"type": "interval", "every_seconds": 15, "start_at": at} for at in phased]
            _create(api_url, [_job(j, receiver.url, sch) for j, sch in zip(warm, schedules, strict=True)])
            # two rounds: the second's payloads were let go after the first, and read ahead
            wait_for(lambda: len(receiver.snapshot()) >= 2 * len(warm), 45, "two occurrences of every job")
            ahead = _metric(port, "cronman_payloads_read_total", why="ahead")
            own_postgres.kill()
            killed = time.time()
            time.sleep(20)
            own_postgres.start()
            back = time.time()
            wait_for(lambda: max(_scheduled(r) for r in receiver.snapshot()) >= back + 16, 40, "15 s more of firing")
            received = receiver.snapshot()
        _stop(node)
    finally:
        node.stop()
        api.stop()
    wrong = _wrong_bodies(received)
    assert not wrong, f"{len(wrong)} deliveries carried another payload than their job's: {wrong[:5]}"
    by_id: dict[str, list[Received]] = {}
    for r in received:
        assert r.execution_id is not None
        by_id.setdefault(r.execution_id, []).append(r)
    doubled = [eid for eid, rs in by_id.items() if len(rs) > 1]
    assert not doubled, f"delivered twice: {doubled[:5]}"
    lag = {eid: rs[0].at - _scheduled(rs[0]) for eid, rs in by_id.items()}
    scheduled = {_scheduled(rs[0]): eid for eid, rs in by_id.items()}
    first_due = min(scheduled)
    # every job's every occurrence from its first to 10 s after PostgreSQL came back, delivered
    missed = []
    for i, j in enumerate(warm):
        t = (start + timedelta(seconds=i)).timestamp()
        while t < first_due:
            t += 15
        while t <= back + 10:
            if not any(r.job_id == j and abs(_scheduled(r) - t) < 0.01 for r in received):
                missed.append(f"{j} at {t - killed:+.1f}s")
            t += 15
    assert not missed, f"occurrences never delivered: {missed}"
    soon = [lag[eid] for t, eid in scheduled.items() if killed + 0.5 <= t <= killed + 3]
    # (due past the horizon of the crash: delivered once PostgreSQL was back, whatever their lag)
    later = {t: lag[eid] for t, eid in scheduled.items() if killed + 9 <= t <= back - 2}
    after_back = [round(t + x - back, 2) for t, x in later.items()]
    report = {
        "read_ahead_before_crash": ahead,
        "outage_s": round(back - killed, 1),
        "due_within_the_horizon_lag_s": [round(x, 2) for x in sorted(soon)],
        "due_past_it_lag_s": [round(x, 2) for x in sorted(later.values())],
        "due_past_it_sent_after_postgres_was_back_s": sorted(after_back),
    }
    print("\npayloads past the horizon:", json.dumps(report))
    assert ahead >= len(warm), "payloads were not read ahead before the crash"
    assert soon and max(soon) < 1.5, f"an occurrence due within the horizon of the crash was late: {soon}"
    assert len(later) >= 8 and min(after_back) > -0.5, (
        f"occurrences due past the horizon went out before PostgreSQL was back (s after it): {after_back}"
    )
