"""A node whose load takes long but keeps moving is waited for: the other nodes do not load its
share meanwhile (only to drop it again the moment it is ready).

Found with ``cronman bench --scenarios scale10m --param scale10m.jobs=1000000``: three nodes
started together take about 30 s to load a million jobs. The first one ready made the others,
ready a few seconds later, take into account only the nodes ready or first seen loading less than
``load_grace_seconds`` (10 s) ago, so each loaded a third node's share (330,000 jobs, seconds of
CPU on a machine already saturated), dropped it seconds later, and handed back what it had claimed
for it meanwhile. Now a loading node's heartbeat carries how far its load has come, and the grace
counts from when that last moved.

Here node-b and node-c start together, each reaching PostgreSQL through a slowed link: node-c's
load takes several grace periods, moving all the while; node-b is ready seconds before it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from bench.loader import JobTemplate, copy_jobs
from cronman.model.hashing import SLOTS, owned_slots
from tests.cluster.conftest import REPLICAS, Cluster
from tests.helpers import FreezingProxy, wait_for
from tests.timings import FAST

# timings: a load paced by a slowed link against the load grace: mechanics
pytestmark = pytest.mark.timings(FAST)

JOBS = 60_000
# bytes a second from PostgreSQL: node-c's share takes about 6 s to arrive, node-b's about 2.5 s
# (longer than the grace: node-b is ready after node-c was first seen loading more than that ago)
RATE_C, RATE_B = 4_000_000, 10_000_000
GRACE = "2.0"
LOADED = ("cronman_slots_moved_total", (("direction", "loaded"),))
DROPPED = ("cronman_slots_moved_total", (("direction", "dropped"),))


# The nodes are stopped before their proxies close. A node stopping after its link to
# PostgreSQL is gone spends about 10 s on its last history write before it exits (its rows stay in
# Redis for an owner to write), which made this file's teardown 13-15 s in `make test`.


@pytest.mark.cluster
def test_a_node_whose_load_keeps_moving_is_waited_for(cluster: Cluster, database_url: str) -> None:
    cluster.start_api()
    template = JobTemplate.of(
        {
            "schedule": {"type": "interval", "every_seconds": 3600},
            "target": {"type": "http", "url": cluster.receiver.url},
        }
    )
    ids = [f"slow-load-{i:06d}" for i in range(JOBS)]
    copy_jobs(database_url, ((i, template) for i in ids), JOBS)
    cluster.schedules.update(dict.fromkeys(ids, template.schedule))
    grace = {"CRONMAN_LOAD_GRACE_SECONDS": GRACE}
    cluster.start_nodes(["node-a"], extra={"node-a": grace})
    cluster.wait_settled(["node-a"], timeout=60)

    with FreezingProxy.in_front_of(database_url) as link_c, FreezingProxy.in_front_of(database_url) as link_b:
        link_c.limit, link_b.limit = RATE_C, RATE_B
        extra: dict[str, dict[str, Any]] = {
            "node-b": {**grace, "CRONMAN_DATABASE_URL": link_b.url_for(database_url)},
            "node-c": {**grace, "CRONMAN_DATABASE_URL": link_c.url_for(database_url)},
        }
        t0 = time.monotonic()
        started = cluster.start_nodes(["node-b", "node-c"], extra=extra)  # together
        three = ["node-a", "node-b", "node-c"]
        cluster.wait_settled(three, timeout=60)
        took = time.monotonic() - t0
        assert all(n.alive() for n in started)
        b = cluster.nodes["node-b"].metrics()
        cluster.stop_nodes()  # before their links close (see the note above the tests)

    share = len(owned_slots("node-b", three, REPLICAS))
    cluster.report(jobs=JOBS, settled_s=round(took, 1), b_loaded=b.get(LOADED), b_share=share)
    # node-c's load took several grace periods (node-b's, a fraction of one)
    assert took > 3 * float(GRACE), took
    # node-b loaded its share of the three and nothing more (before: all 4096 slots, then dropped)
    assert b.get(LOADED) == share < SLOTS, (b.get(LOADED), share)
    assert b.get(DROPPED, 0.0) == 0.0


@pytest.mark.cluster
def test_nodes_whose_loads_stall_are_not_waited_for(cluster: Cluster, database_url: str) -> None:
    """Three nodes start together and two of them stall in their loads (their links to PostgreSQL
    go silent): the slots those two would own together have no ready owner, so once the grace has
    run out the third takes them. (Before, nothing made it look again while the two stayed
    listed: a third of the jobs waited for one of them to be ready.) Back, the cluster settles on
    the three."""
    cluster.start_api()
    jobs = 40_000
    hourly = {"type": "interval", "every_seconds": 3600}
    template = JobTemplate.of({"schedule": hourly, "target": {"type": "http", "url": cluster.receiver.url}})
    ids = [f"stalled-load-{i:06d}" for i in range(jobs)]
    copy_jobs(database_url, ((i, template) for i in ids), jobs)
    cluster.schedules.update(dict.fromkeys(ids, template.schedule))
    grace = {"CRONMAN_LOAD_GRACE_SECONDS": "3.0"}
    three = ["node-a", "node-b", "node-c"]
    with FreezingProxy.in_front_of(database_url) as link_b, FreezingProxy.in_front_of(database_url) as link_c:
        link_b.limit = link_c.limit = 3_000_000  # their loads take about 5 s, moving about every second
        extra: dict[str, dict[str, Any]] = {
            "node-a": grace,
            "node-b": {**grace, "CRONMAN_DATABASE_URL": link_b.url_for(database_url)},
            "node-c": {**grace, "CRONMAN_DATABASE_URL": link_c.url_for(database_url)},
        }
        nodes = {n.node_id: n for n in cluster.start_nodes(three, extra=extra, wait=False)}
        a = nodes["node-a"]
        wait_for(lambda: bool(a.readyz()["_ok"]), 60, "node-a to be ready")
        assert not nodes["node-b"].readyz()["_ok"] and not nodes["node-c"].readyz()["_ok"]
        shared = a.readyz()["jobs"]
        link_b.freeze()
        link_c.freeze()
        t = time.monotonic()
        wait_for(lambda: a.readyz()["jobs"] == jobs, 30, "node-a to take every job while the others stall")
        took = time.monotonic() - t
        link_b.thaw()
        link_c.thaw()
        settled = cluster.wait_settled(three, timeout=90)
        cluster.stop_nodes()  # before their links close (see the note above the tests)
    cluster.report(jobs=jobs, a_before=shared, a_took_all_s=round(took, 1), settled_s=round(settled, 1))
    assert shared < jobs
