"""Backfills on a cluster of real node processes: the rate holds across the cluster, a cancel stops
one half-way, and killing the node that drives one loses nothing."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from cronman.dev.receiver import Receiver
from cronman.model.execution import execution_id
from cronman.model.timeutil import iso, parse_iso
from tests.cluster.conftest import Cluster, sleep_until
from tests.helpers import wait_for
from tests.timings import FAST

# timings: a backfill's progress handed between node processes: mechanics
pytestmark = pytest.mark.timings(FAST)

RATE = 10
HOURS = 6


def _backfill(cluster: Cluster, backfill_id: str) -> dict[str, Any]:
    r = cluster.session.get(f"{cluster.api_url}/v1/backfills/{backfill_id}", timeout=10)
    assert r.ok, r.text
    return dict(r.json())


def _ask(cluster: Cluster, job_id: str, from_ms: int, to_ms: int) -> dict[str, Any]:
    body = {"from": iso(from_ms), "to": iso(to_ms), "max_per_second": RATE}
    r = cluster.session.post(f"{cluster.api_url}/v1/jobs/{job_id}/backfill", json=body, timeout=30)
    assert r.status_code == 202, r.text
    return dict(r.json())


@pytest.mark.cluster
def test_backfill_rate_cancel_and_node_loss(cluster: Cluster) -> None:
    """Must show: a backfill of a 1-minute job over the past 6 hours at 10/s delivers exactly 360
    executions, each once, marked as backfill; cancelling half-way stops it; a node killed during
    it loses none."""
    cluster.start_api()
    with Receiver() as receiver:
        for job_id in ("minutely", "minutely-cancelled"):
            spec = {
                "id": job_id,
                "schedule": {"type": "interval", "every_seconds": 60, "start_at": "2026-01-01T00:00:00Z"},
                "target": {"type": "http", "url": f"{receiver.url}/hook", "timeout_seconds": 10},
                "payload": {"job": job_id},
            }
            r = cluster.session.post(f"{cluster.api_url}/v1/jobs", json=spec, timeout=30)
            assert r.status_code == 201, r.text
        ids = ["node-a", "node-b", "node-c"]
        cluster.start_nodes(ids)
        # The last 6 hours of whole minutes: 360 occurrences of each job.
        minute = int(datetime.now(UTC).timestamp()) // 60 * 60_000
        to_ms, from_ms = minute - 60_000, minute - HOURS * 3_600_000
        expected = [from_ms + 60_000 * k for k in range(HOURS * 60)]

        t0 = time.time()
        kept = _ask(cluster, "minutely", from_ms, to_ms)
        cancelled = _ask(cluster, "minutely-cancelled", from_ms, to_ms)
        assert kept["total"] == cancelled["total"] == 360

        def arrivals(backfill_id: str) -> list[Any]:
            return [r for r in receiver.snapshot() if r.headers.get("Cronman-Backfill-Id") == backfill_id]

        # Half-way through the other one (about 180 after 18 s at 10/s), cancel it.
        sleep_until(t0 + 18)
        r = cluster.session.delete(f"{cluster.api_url}/v1/backfills/{cancelled['id']}", timeout=10)
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
        at_cancel = len(arrivals(cancelled["id"]))

        # Later, kill the node that drives the first one.
        sleep_until(t0 + 22)
        driver = wait_for(lambda: _backfill(cluster, kept["id"])["driver"], 10, "a driver")
        held_at_kill = cluster.claims_held_by(driver)
        delivered_at_kill = len(arrivals(kept["id"]))
        t_kill = cluster.kill(driver)

        done = wait_for(
            lambda: (lambda b: b if b["state"] == "completed" else None)(_backfill(cluster, kept["id"])),
            90,
            "the backfill to complete",
            interval=0.5,
        )
        t_done = time.time()
        after_cancel = len(arrivals(cancelled["id"]))
        time.sleep(3)
        late_cancel = len(arrivals(cancelled["id"]))
        stopped = _backfill(cluster, cancelled["id"])
        got = arrivals(kept["id"])
        cluster.stop_nodes()

    trigger = f"backfill:{kept['id']}"
    wanted = {execution_id("minutely", t, 0, trigger): t for t in expected}
    by_id = Counter(r.execution_id for r in got)
    per_second = Counter(int(r.at) for r in got)
    cluster.report(
        backfill=kept["id"],
        total=done["total"],
        delivered=done["delivered"],
        arrivals=len(got),
        distinct=len(by_id),
        seconds=round(max(r.at for r in got) - min(r.at for r in got), 1),
        busiest_second=max(per_second.values()),
        driver_killed=driver,
        delivered_at_kill=delivered_at_kill,
        victim_claims_held_at_kill=len(held_at_kill),
        kill_to_done_seconds=round(t_done - t_kill, 1),
        cancelled_at=at_cancel,
        cancelled_final=late_cancel,
        cancelled_progress={k: stopped[k] for k in ("state", "dispatched", "delivered", "pending")},
    )
    # every occurrence, under its backfill execution id, marked as a backfill's
    assert set(by_id) == set(wanted), f"missing: {sorted(set(wanted) - set(by_id))[:5]}"
    assert {parse_iso(r.headers["Cronman-Scheduled-For"]) for r in got} == set(expected)
    # each once, but what the killed node held when it died (delivered, not yet marked done)
    doubled = {e for e, n in by_id.items() if n > 1}
    assert doubled <= held_at_kill, f"doubled without a claim held at the kill: {doubled - held_at_kill}"
    assert (done["total"], done["delivered"], done["failed"], done["pending"]) == (360, 360, 0, 0)
    assert 100 < delivered_at_kill < 300  # the kill came during the backfill
    # the rate: at most 10 a second (one more at the edges of a second), so it took at least ~35 s
    assert max(per_second.values()) <= RATE + 2, per_second.most_common(3)
    assert max(r.at for r in got) - min(r.at for r in got) >= 33
    # the cancelled one stopped half-way, within a second or so of the cancel
    assert 120 < at_cancel < 240, at_cancel
    assert after_cancel - at_cancel <= 2 * RATE and late_cancel == after_cancel
    assert stopped["state"] == "cancelled" and stopped["delivered"] == late_cancel < 360
