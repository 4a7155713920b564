"""One node cut off from Redis while the other nodes and the API reach it as ever: what the node
sends goes unanswered (a dropped route, not a refused connection), and what it sent during the cut
reaches Redis late, when the route is back. The others see it gone and fire its slots; nothing is
missed; it comes back by itself, and its late requests do not bring back what others finished."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from tests.cluster.conftest import Cluster, sleep_until
from tests.helpers import FreezingProxy, wait_for
from tests.timings import FAST

# timings: a node cut off from Redis until its heartbeat expires, inside one short test: mechanics
pytestmark = pytest.mark.timings(FAST)

CUT = 8.0  # seconds node-a cannot reach Redis


@pytest.mark.cluster
def test_a_node_cut_off_from_redis_loses_nothing_and_comes_back(cluster: Cluster) -> None:
    where = urlsplit(cluster.redis_url)
    assert where.hostname and where.port, cluster.redis_url
    proxy = FreezingProxy((where.hostname, where.port))
    through = where._replace(netloc=f"{proxy.host}:{proxy.port}").geturl()
    ids = ["node-a", "node-b", "node-c"]
    try:
        cluster.start_api()
        specs = [cluster.interval_job(f"pc-{i:03d}", 1) for i in range(100)]
        cluster.create_jobs(specs)
        cluster.start_nodes(ids, extra={"node-a": {"CRONMAN_REDIS_URL": through}})
        cluster.wait_settled(ids)
        pid = cluster.nodes["node-a"].pid

        t0 = time.time() + 1.0
        sleep_until(t0 + 4)
        proxy.freeze()
        t_cut = time.time()

        def others_only() -> bool:
            return sorted(n["id"] for n in cluster.cluster_view()["nodes"]) == ids[1:]

        wait_for(others_only, cluster.timings.heartbeat_ttl + 3, "the other nodes to see node-a gone", interval=0.1)
        seen_gone_s = time.time() - t_cut
        sleep_until(t_cut + CUT)
        proxy.thaw()
        t_back = time.time()
        settle_s = cluster.wait_settled(ids, timeout=20)
        sleep_until(t_back + 8)
        t1 = time.time() - 3.0
        whole = cluster.analyse(t0, t1)
        cut = cluster.analyse(t_cut, t_back)
        after = cluster.analyse(t_back + settle_s + 1, t1)
        same_process = cluster.nodes["node-a"].alive() and cluster.nodes["node-a"].pid == pid
        cluster.stop_nodes()
    finally:
        cluster.stop_nodes()
        proxy.close()

    cluster.report(
        jobs=len(specs),
        cut_seconds=t_back - t_cut,
        seen_gone_after_seconds=seen_gone_s,
        settled_after_seconds=settle_s,
        whole=whole,
        during_cut=cut,
        after=after,
        same_process=same_process,
    )
    assert same_process, "node-a should ride out the cut without a restart"
    assert whole.missed == 0, f"missed: {whole.missed_sample}"
    assert whole.unexpected == 0
    # At most a second delivery (same execution id) of what node-a was sending when it was cut
    # off, or claimed and could not renew: about one lease of its share of the jobs, once each.
    assert max(whole.counts.values()) <= 2
    assert whole.doubled <= 100 * (cluster.timings.lease + 2), f"doubled: {whole.doubled_sample}"
    # The other owner of each of node-a's slots claims its occurrences on time all along.
    assert cut.worst_lag_ms is not None and cut.worst_lag_ms <= (cluster.timings.lease + 3) * 1000, cut
    assert after.doubled == 0, f"doubled after node-a came back: {after.doubled_sample}"
