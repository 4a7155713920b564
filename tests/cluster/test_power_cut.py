"""A power cut: Redis (without persistence) and every node die at the same instant (SIGKILL), and
come back, Redis empty. No node that saw the old data lives to notice that Redis lost it, so the
nodes that start must tell from what they find: progress recorded in data Redis no longer has.
Every occurrence is delivered (fire_all: even one inside an outage), none more than twice, and
every delivery ends up in history, the ones whose rows died with the nodes' buffers and Redis's
copy of them included (delivered again, with the same execution id, and recorded)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from cronman.dev.embedded import EmbeddedRedis, free_port
from cronman.store.store import make_engine
from tests.cluster.conftest import Cluster, sleep_until
from tests.helpers import wait_for
from tests.timings import FAST

# timings: Redis and every node lost at once, and what is claimed again after: mechanics
pytestmark = pytest.mark.timings(FAST)

DARK = 2.0  # seconds everything stays down


def _recorded(database_url: str, t0: float, t1: float) -> set[tuple[str, int]]:
    """Occurrences (job id, scheduled ms) of [t0, t1] with a final history row, the window in
    whole milliseconds as the ledger's analysis has it (an occurrence in t0's own millisecond, before
    t0's fraction of it, counts in both)."""
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT job_id, ms FROM (SELECT job_id, status, "
                    "floor(extract(epoch from scheduled_for) * 1000)::bigint AS ms FROM scheduled_jobs "
                    "WHERE scheduled_for BETWEEN to_timestamp(:a) - interval '1 second' "
                    "AND to_timestamp(:b) + interval '1 second') r WHERE ms BETWEEN :a_ms AND :b_ms "
                    "AND status IN ('succeeded', 'permanently_failed', 'skipped', 'cancelled')"
                ),
                {"a": t0, "b": t1, "a_ms": int(t0 * 1000), "b_ms": int(t1 * 1000)},
            ).all()
    finally:
        engine.dispose()
    return {(str(j), int(ms)) for j, ms in rows}


@pytest.mark.cluster
def test_a_power_cut_of_redis_and_every_node(cluster: Cluster) -> None:
    server = EmbeddedRedis(cluster.logdir / "redis", port=free_port(), persist=False, log=cluster.logdir / "redis.log")
    server.start()
    ids = ["node-a", "node-b", "node-c"]
    try:
        cluster.use_redis(server.url())
        cluster.start_api()
        specs = [
            cluster.interval_job(f"pw-{i:03d}", 1, misfire_policy="fire_all", catchup_window_seconds=3600)
            for i in range(100)
        ]
        for spec in specs[:20]:  # answered after 1.5 s: some always in flight, their rows written late
            cluster.receiver.delays[spec["id"]] = 1.5
        cluster.create_jobs(specs)
        cluster.start_nodes(ids)
        cluster.wait_settled(ids)

        t0 = time.time() + 1.0
        sleep_until(t0 + 5)
        assert server.child is not None
        for n in ids:
            cluster.signal(n, 9)
        server.child.proc.kill()
        t_cut = time.time()
        for n in ids:
            cluster.nodes[n].child.proc.wait(10)
        server.child.proc.wait(10)
        time.sleep(DARK)
        server.restart_empty()
        cluster.start_nodes(ids)
        t_back = time.time()
        settle_s = cluster.wait_settled(ids, timeout=30)
        sleep_until(t_back + 10)
        t1 = time.time() - 3.0
        whole = cluster.analyse(t0, t1)
        delivered = set(whole.counts)

        def unrecorded() -> set[tuple[str, int]]:
            return delivered - _recorded(cluster.database_url, t0, t1)

        try:
            wait_for(lambda: not unrecorded(), 10, "a history row for every delivery")
        except AssertionError:
            pass  # asserted below, with the figures
        missing = sorted(unrecorded())
        cluster.stop_nodes()
    finally:
        cluster.stop_nodes()
        server.stop()

    cluster.report(
        jobs=len(specs),
        dark_seconds=t_back - t_cut,
        settled_after_seconds=settle_s,
        whole=whole,
        delivered_without_history=len(missing),
        delivered_without_history_sample=[list(k) for k in missing[:10]],
    )
    assert whole.missed == 0, f"missed: {whole.missed_sample}"
    assert whole.unexpected == 0
    assert max(whole.counts.values()) <= 2
    assert not missing, f"{len(missing)} deliveries without a history row, e.g. {missing[:5]}"
