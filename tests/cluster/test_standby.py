"""Leading and standing by (scheduler_node.standby), with real nodes, Redis and PostgreSQL: the
owner that leads a slot claims on time and the other leaves those claims alone, and a leader
that has not read a job change covers none of the occurrences that change brings."""

from __future__ import annotations

import math
import time

import pytest

from cronman.model.timeutil import iso
from tests.cluster.conftest import Cluster, sleep_until
from tests.timings import FAST

# timings: the standby's hold-back between real processes: mechanics
pytestmark = pytest.mark.timings(FAST)

GRACE = 0.5
STANDBY = {"CRONMAN_STANDBY_GRACE_SECONDS": str(GRACE)}  # off unless set


def _claims(cluster: Cluster, node: str, result: str) -> float:
    return cluster.nodes[node].metrics().get(("cronman_claims_total", (("result", result),)), 0.0)


@pytest.mark.cluster
def test_the_standby_leaves_the_leaders_claims_alone(cluster: Cluster) -> None:
    cluster.start_api()
    specs = [cluster.interval_job(f"lead-{i:03d}", 1) for i in range(200)]
    cluster.create_jobs(specs)
    ids = ["node-a", "node-b"]
    cluster.start_nodes(ids, extra={n: STANDBY for n in ids})
    cluster.wait_settled(ids)
    time.sleep(2.0)  # standings exchanged
    before = {(n, r): _claims(cluster, n, r) for n in ids for r in ("won", "lost", "covered")}
    t0 = time.time()
    sleep_until(t0 + 8)
    after = {(n, r): _claims(cluster, n, r) for n in ids for r in ("won", "lost", "covered")}
    t1 = time.time() - 2.0
    figures = cluster.analyse(t0, t1)
    cluster.stop_nodes()

    delta = {k: after[k] - before[k] for k in after}
    won = sum(v for (n, r), v in delta.items() if r == "won")
    lost = sum(v for (n, r), v in delta.items() if r == "lost")
    covered = sum(v for (n, r), v in delta.items() if r == "covered")
    cluster.report(jobs=len(specs), figures=figures, claims={f"{n} {r}": v for (n, r), v in delta.items()})
    assert figures.missed == 0, figures.missed_sample
    assert figures.doubled == 0, figures.doubled_sample
    assert figures.expected > 1000
    # each node leads about half the slots and claims those on time ...
    assert all(delta[(n, "won")] > 0.25 * won for n in ids), delta
    # (on time as this machine allows: in a parallel run of the suite, four test workers on two
    # cores, one run's p99 was 2.4 s with nothing missed, doubled or claimed by the standby)
    assert figures.p99_lag_ms is not None and figures.p99_lag_ms < 3000
    # ... and the other owner claims almost none of them: it saw the leader's claim first
    assert lost < 0.05 * won, delta
    assert covered > 0.9 * won, delta


@pytest.mark.cluster
def test_a_leader_that_has_not_read_a_change_covers_nothing_it_brings(cluster: Cluster) -> None:
    """node-a never reads the change feed (a fault: tests/fault_node.py): jobs created after it
    loaded its slots reach only node-b. In the slots node-a leads, node-b must not take node-a's
    progress as evidence for occurrences of jobs node-a does not know: it claims them after the
    grace."""
    cluster.start_api()
    ids = ["node-a", "node-b"]
    cluster.start_nodes(ids, extra={n: STANDBY for n in ids}, faults={"node-a": "feed_unread"})
    cluster.wait_settled(ids)
    time.sleep(1.5)  # standings exchanged
    due_ms = math.ceil(time.time() + 5) * 1000
    specs = [
        {
            "id": f"new-{i:02d}",
            "schedule": {"type": "once", "at": iso(due_ms)},
            "target": {"type": "http", "url": f"{cluster.receiver.url}/hook", "timeout_seconds": 30},
        }
        for i in range(40)
    ]
    cluster.create_jobs(specs)
    due = due_ms / 1000

    def arrived() -> set[str]:
        return {x.job_id for x in cluster.receiver.snapshot()}

    deadline = due + GRACE + 8
    while time.time() < deadline and arrived() < set(cluster.schedules):
        time.sleep(0.2)
    time.sleep(1.0)
    figures = cluster.analyse(due - 1, due + 1)
    b_covered = _claims(cluster, "node-b", "covered")
    a_jobs = cluster.nodes["node-a"].readyz().get("jobs")
    cluster.stop_nodes()
    cluster.report(jobs=len(specs), figures=figures, node_b_covered=b_covered, node_a_jobs=a_jobs)
    assert a_jobs == 0, "node-a should not have read the jobs created after it started"
    assert figures.missed == 0, f"never delivered: {figures.missed_sample}"
    assert figures.doubled == 0, figures.doubled_sample
    # the occurrences of slots node-a leads came late by about the grace, not never
    assert figures.worst_lag_ms is not None and figures.worst_lag_ms <= (GRACE + 2.0) * 1000
