"""Nodes joining and leaving under load (DESIGN §8 item 6): no gaps, no doubles, and only the slots
whose owners changed are reloaded."""

from __future__ import annotations

import time

import pytest

from cronman.model.hashing import SLOTS, owned_slots
from tests.cluster.conftest import REPLICAS, Cluster, sleep_until
from tests.timings import FAST

# timings: which slots a join and a leave reload: mechanics (the incident at the shipped timings:
# test_incidents_at_defaults.py)
pytestmark = pytest.mark.timings(FAST)

LOADED = ("cronman_slots_moved_total", (("direction", "loaded"),))
DROPPED = ("cronman_slots_moved_total", (("direction", "dropped"),))
# Room for a stray membership blip on a busy machine; a full reload (4096 slots) is far above it.
TOLERANCE = SLOTS // 20


def _moved(cluster: Cluster, ids: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for n in ids:
        m = cluster.nodes[n].metrics()
        out[n] = (m.get(LOADED, 0.0), m.get(DROPPED, 0.0))
    return out


def _gained(node: str, before: list[str], after: list[str]) -> int:
    """Slots ``node`` owns under ``after`` that it did not own under ``before``."""
    return len(owned_slots(node, after, REPLICAS) - (owned_slots(node, before, REPLICAS) if node in before else set()))


@pytest.mark.cluster
def test_a_node_joins_and_one_leaves_under_load(cluster: Cluster) -> None:
    cluster.trace("jl-*")  # a miss or a double is explained step by step in the assertion
    cluster.start_api()
    specs = [cluster.interval_job(f"jl-{i:03d}", 1 if i % 2 == 0 else 2) for i in range(300)]
    cluster.create_jobs(specs)
    first = ["node-a", "node-b", "node-c"]
    cluster.start_nodes(first)
    cluster.wait_settled(first)

    t0 = time.time() + 1.0
    sleep_until(t0 + 5)
    m0 = _moved(cluster, first)
    t_join = time.time()
    cluster.start_nodes(["node-d"])
    four = ["node-a", "node-b", "node-c", "node-d"]
    join_settle_s = cluster.wait_settled(four, timeout=20)
    t_joined = time.time()
    m1 = _moved(cluster, four)

    sleep_until(t_join + 10)
    leaver, remaining = "node-c", ["node-a", "node-b", "node-d"]
    t_leave = cluster.terminate(leaver)
    leave_settle_s = cluster.wait_settled(remaining, timeout=20)
    t_left = time.time()
    m2 = _moved(cluster, remaining)
    sleep_until(t_leave + 10)
    t1 = time.time() - 3.0
    whole = cluster.analyse(t0, t1)
    join = cluster.analyse(t_join, t_joined + 3)
    leave = cluster.analyse(t_leave - 1, t_left + 3)
    cluster.stop_nodes()

    loaded_on_join = {n: m1[n][0] - m0[n][0] for n in first}
    loaded_on_leave = {n: m2[n][0] - m1[n][0] for n in remaining}
    expect_join = {n: _gained(n, first, four) for n in first}
    newcomer_share = len(owned_slots("node-d", four, REPLICAS))
    expect_leave = {n: _gained(n, four, remaining) for n in remaining}
    cluster.report(
        jobs=len(specs),
        join_settle_seconds=join_settle_s,
        leave_settle_seconds=leave_settle_s,
        whole=whole,
        join=join,
        leave=leave,
        slots_loaded_on_join=loaded_on_join,
        slots_loaded_on_join_expected=expect_join,
        newcomer_slots_loaded=m1["node-d"][0],
        newcomer_share=newcomer_share,
        slots_dropped_on_join={n: m1[n][1] - m0[n][1] for n in first},
        slots_loaded_on_leave=loaded_on_leave,
        slots_loaded_on_leave_expected=expect_leave,
        leaver_exit=cluster.nodes[leaver].child.proc.returncode,
    )
    assert cluster.nodes[leaver].child.proc.returncode == 0
    assert whole.missed == 0, f"gaps: {whole.missed_sample}\n{cluster.steps(whole.missed_sample)}"
    assert whole.doubled == 0, f"doubles: {whole.doubled_sample}\n{cluster.steps(whole.doubled_sample)}"
    assert whole.unexpected == 0
    # Only moved slots are reloaded: a join takes slots away from the others (they load none),
    # the newcomer loads its own share and no more, and a departure moves only the leaver's slots.
    for n in first:
        assert loaded_on_join[n] <= expect_join[n] + TOLERANCE, (n, loaded_on_join, expect_join)
    assert newcomer_share <= m1["node-d"][0] <= newcomer_share + TOLERANCE, (m1["node-d"], newcomer_share)
    for n in remaining:
        assert expect_leave[n] <= loaded_on_leave[n] <= expect_leave[n] + TOLERANCE, (n, loaded_on_leave)
