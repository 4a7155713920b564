"""Claims under faults: a winner that dies before sending (DESIGN §8 item 2) and a winner paused
past its lease (item 3)."""

from __future__ import annotations

import math
import signal
import time
from typing import Any

import pytest

from cronman.model.timeutil import iso
from tests.cluster.conftest import Cluster, sleep_until
from tests.helpers import wait_for
from tests.timings import FAST

# timings: the claim protocol between real processes (takeover after a lease, a stop's handover): mechanics
pytestmark = pytest.mark.timings(FAST)

TAKEN_OVER = ("cronman_claims_total", (("result", "taken_over"),))
SUPERSEDED = ("cronman_claims_total", (("result", "superseded"),))
DUPLICATES = ("cronman_duplicates_detected_total", ())


def _history_row(cluster: Cluster, job_id: str, scheduled_ms: int, attempt: int = 1) -> dict[str, Any] | None:
    for row in cluster.executions(job_id):
        if row["scheduled_for"] == iso(scheduled_ms) and row["attempt"] == attempt:
            return row
    return None


@pytest.mark.cluster
def test_winner_killed_between_claim_and_send(cluster: Cluster) -> None:
    cluster.start_api()
    ids = ["node-a", "node-b"]
    # node-a exits (137) at its first send, before sending anything: it dies holding the claims it won.
    cluster.start_nodes(ids, faults={"node-a": "exit_at_send"})
    cluster.wait_settled(ids)

    due_ms = math.ceil(time.time() + 7) * 1000
    specs = [
        {
            "id": f"once-{i:02d}",
            "schedule": {"type": "once", "at": iso(due_ms)},
            "target": {"type": "http", "url": f"{cluster.receiver.url}/hook", "timeout_seconds": 30},
            "payload": {"i": i},
        }
        for i in range(20)
    ]
    cluster.create_jobs(specs)
    cluster.wait_settled(ids, timeout=4)  # both nodes hold all 20 jobs before they are due
    due = due_ms / 1000

    # Both owners race for the claims; whoever's batch reaches Redis first wins them all. To make
    # node-a the winner every run, node-b is held still (SIGSTOP) across the due instant and let go
    # 0.3 s after it: it then claims, loses every claim to node-a, and checks back after the lease.
    assert time.time() < due - 0.5, "too slow to set the scene before the jobs were due"
    sleep_until(due - 0.5)
    cluster.signal("node-b", signal.SIGSTOP)
    try:
        sleep_until(due + 0.3)
    finally:
        cluster.signal("node-b", signal.SIGCONT)
    a = cluster.nodes["node-a"].child.proc
    wait_for(lambda: a.poll() is not None, 10, "node-a to die holding its claims")
    a_exit = a.returncode

    def all_arrived() -> bool:
        return {x.job_id for x in cluster.receiver.snapshot()} >= set(cluster.schedules)

    wait_for(all_arrived, 15, "every job to be delivered by node-b", interval=0.1)
    time.sleep(cluster.timings.lease + 1)  # room for a second delivery to show up, if there were to be one
    figures = cluster.analyse(due - 1, due + 1)
    b = cluster.nodes["node-b"].metrics()
    history = {j: cluster.executions(j) for j in cluster.schedules}
    lags = {x.job_id: round(x.at - due, 3) for x in cluster.receiver.snapshot()}
    cluster.stop_nodes()

    cluster.report(
        jobs=len(specs),
        node_a_exit=a_exit,
        figures=figures,
        lag_seconds_min=min(lags.values()),
        lag_seconds_max=max(lags.values()),
        node_b_taken_over=b.get(TAKEN_OVER, 0.0),
        node_b_claims_lost=b.get(("cronman_claims_total", (("result", "lost"),)), 0.0),
    )
    assert a_exit == 137, "node-a should have died right after winning a claim (the injected fault)"
    assert figures.expected == len(specs)
    assert figures.missed == 0, f"never delivered: {figures.missed_sample}"
    assert figures.doubled == 0, f"delivered twice: {figures.doubled_sample}"
    assert all(n == 1 for n in figures.counts.values())
    # node-b fired what node-a had claimed, within about one lease of the scheduled time.
    late = figures.worst_late_arrival_ms
    assert late is not None and late <= (cluster.timings.lease + 2) * 1000
    assert b.get(TAKEN_OVER, 0.0) >= 1
    for job_id, rows in history.items():
        assert len(rows) == 1, (job_id, rows)
        assert rows[0]["node"] == "node-b" and rows[0]["status"] == "succeeded", rows
        assert rows[0]["duplicates"] == 0, rows


@pytest.mark.cluster
def test_sigstop_past_the_lease_then_sigcont(cluster: Cluster) -> None:
    cluster.start_api()
    slow = [cluster.interval_job(f"slow-{i:02d}", 1) for i in range(20)]
    fast = [cluster.interval_job(f"fast-{i:02d}", 1) for i in range(60)]
    for spec in slow:
        cluster.receiver.delays[spec["id"]] = 3.0  # answered after 3 s: always some in flight
    cluster.create_jobs(slow + fast)
    ids = ["node-a", "node-b"]
    cluster.start_nodes(ids)
    cluster.wait_settled(ids)

    t0 = time.time() + 1.0
    sleep_until(t0 + 4)
    t_stop = cluster.signal("node-a", signal.SIGSTOP)
    try:
        # node-a is frozen, so this is exactly what it held (claimed, not finished) when it stopped.
        held = cluster.claims_held_by("node-a")
        sleep_until(t_stop + 2 * cluster.timings.lease + 1)
    finally:
        t_cont = cluster.signal("node-a", signal.SIGCONT)
    sleep_until(t_cont + 8)
    t1 = t_cont + 4.0  # slow answers take 3 s; later occurrences are outside the window
    figures = cluster.analyse(t0, t1)
    pause = cluster.analyse(t_stop - 3.5, t_cont + 1)
    arrivals = cluster.receiver.snapshot()
    execution_of = {(x.job_id, x.scheduled_ms): x.execution_id for x in arrivals}
    doubled_ids = {execution_of[k] for k in figures.doubled_set}

    # Each extra delivery must be visible: the history row of that attempt counts a duplicate.
    def rows_of_doubled() -> dict[tuple[str, int], dict[str, Any] | None]:
        return {k: _history_row(cluster, k[0], k[1]) for k in sorted(figures.doubled_set)}

    def all_recorded() -> bool:
        return all(v and v["duplicates"] >= 1 for v in rows_of_doubled().values())

    try:
        wait_for(all_recorded, 15, "the duplicates to be recorded in history", interval=0.5)
    except AssertionError:
        pass  # reported and asserted below
    rows = rows_of_doubled()
    metrics = {n: cluster.nodes[n].metrics() for n in ids}
    cluster.stop_nodes()

    unrecorded = [k for k, v in rows.items() if not v or v["duplicates"] < 1]
    cluster.report(
        paused_seconds=t_cont - t_stop,
        held_by_a_at_stop=len(held),
        slow_held_by_a=len(
            {x.execution_id for x in arrivals if x.execution_id in held and x.job_id.startswith("slow-")}
        ),
        whole=figures,
        pause=pause,
        doubled_not_held_by_a=len(doubled_ids - held),
        doubled_without_duplicate_in_history=len(unrecorded),
        node_a_superseded=metrics["node-a"].get(SUPERSEDED, 0.0),
        duplicates_detected={n: m.get(DUPLICATES, 0.0) for n, m in metrics.items()},
        node_b_taken_over=metrics["node-b"].get(TAKEN_OVER, 0.0),
    )
    assert held, "node-a should have had executions in flight when it was stopped"
    assert metrics["node-b"].get(TAKEN_OVER, 0.0) >= 1, "node-b should have taken over node-a's claims"
    assert figures.missed == 0, f"missed: {figures.missed_sample}"
    assert figures.unexpected == 0
    # At most one extra delivery per execution, and only for executions node-a had in flight.
    assert max(figures.counts.values()) <= 2, [k for k, n in figures.counts.items() if n > 2][:10]
    assert doubled_ids <= held, f"doubled executions node-a did not hold: {sorted(doubled_ids - held)[:10]}"
    # Every extra delivery is recorded as such: in the execution's history row, and node-a knows
    # it lost claims it had worked on.
    assert not unrecorded, f"doubled without a duplicate in history: {unrecorded[:10]}"
    if doubled_ids:
        assert metrics["node-a"].get(SUPERSEDED, 0.0) >= 1
        assert sum(m.get(DUPLICATES, 0.0) for m in metrics.values()) >= len(doubled_ids)
