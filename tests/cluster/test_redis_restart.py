"""Redis restarts empty in the middle of a run (DESIGN §8 item 4): nodes re-register and carry on,
nothing is missed, and a second delivery of an occurrence is recorded in its history row."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from cronman.dev.embedded import EmbeddedRedis, free_port
from cronman.model.timeutil import iso
from cronman.store.store import make_engine
from tests.cluster.conftest import Cluster, sleep_until
from tests.helpers import FreezingProxy, wait_for
from tests.timings import FAST

# timings: Redis restarted empty and what is claimed again after: mechanics
pytestmark = pytest.mark.timings(FAST)

OUTAGE = 1.5  # seconds Redis is gone before it is back, empty
HANG_AFTER_LOSS = 10.0  # seconds PostgreSQL stays silent after Redis is back (the double fault)


def _restart_empty(server: EmbeddedRedis, cluster: Cluster, ids: list[str]) -> tuple[float, float]:
    """Redis dies (SIGKILL), stays away for a moment as a real restart would, and comes back on
    the same port with no data at all; returns when it was back, and how long every node then
    took to register again."""
    assert server.child is not None
    server.child.proc.kill()
    server.child.proc.wait(10)
    time.sleep(OUTAGE)
    server.restart_empty()
    t_up = time.time()

    def listed() -> bool:
        return sorted(n["id"] for n in cluster.cluster_view()["nodes"]) == ids

    wait_for(listed, 10, "every node to register again after the restart", interval=0.1)
    return t_up, time.time() - t_up


@pytest.mark.cluster
def test_redis_restarted_empty_mid_run(cluster: Cluster) -> None:
    # A Redis of its own, on a fixed port, so it can be killed and started again empty.
    server = EmbeddedRedis(cluster.logdir / "redis", port=free_port(), persist=False, log=cluster.logdir / "redis.log")
    server.start()
    try:
        cluster.use_redis(server.url())
        cluster.start_api()
        specs = [cluster.interval_job(f"rr-{i:03d}", 1) for i in range(100)]
        cluster.create_jobs(specs)
        ids = ["node-a", "node-b", "node-c"]
        cluster.start_nodes(ids)
        cluster.wait_settled(ids)
        pids = {n: cluster.nodes[n].pid for n in ids}

        t0 = time.time() + 1.0
        sleep_until(t0 + 6)
        t_down = time.time()
        t_up, rejoin_s = _restart_empty(server, cluster, ids)
        settle_s = cluster.wait_settled(ids, timeout=15)
        sleep_until(t_up + 12)
        t1 = time.time() - 3.0
        whole = cluster.analyse(t0, t1)
        around = cluster.analyse(t_down - 1, t_up + 5)
        after = cluster.analyse(t_up + 3, t1)  # firing has resumed: every job delivers here

        doubled = sorted(whole.doubled_set)

        def row(job_id: str, ms: int) -> dict | None:
            for r in cluster.executions(job_id):
                if r["scheduled_for"] == iso(ms) and r["attempt"] == 1:
                    return r
            return None

        def recorded() -> dict:
            return {k: row(*k) for k in doubled}

        try:
            wait_for(lambda: all(v and v["duplicates"] >= 1 for v in recorded().values()), 10, "duplicates in history")
        except AssertionError:
            pass  # asserted below
        rows = recorded()
        alive = {n: cluster.nodes[n].alive() and cluster.nodes[n].pid == pids[n] for n in ids}
        epochs = _epochs(cluster.database_url)
        cluster.stop_nodes()
    finally:
        cluster.stop_nodes()  # before Redis, so the nodes can leave cleanly
        server.stop()

    unrecorded = [k for k, v in rows.items() if not v or v["duplicates"] < 1]
    cluster.report(
        jobs=len(specs),
        redis_down_seconds=t_up - t_down,
        nodes_listed_again_after_seconds=rejoin_s,
        settled_after_seconds=settle_s,
        whole=whole,
        around_restart=around,
        after_restart=after,
        doubled_without_duplicate_in_history=len(unrecorded),
        nodes_kept_running=alive,
    )
    assert all(alive.values()), f"every node should have carried on without a restart: {alive}"
    assert rejoin_s <= 5.0, "nodes should register again within a few seconds"
    assert whole.missed == 0, f"missed: {whole.missed_sample}"
    assert {j for j, _ in after.counts} == set(cluster.schedules), "every job fires again after the restart"
    assert after.missed == 0
    # Redis forgot which executions were done, so a second delivery is possible here, but only
    # one, and each must be recorded as a duplicate in the history row of that execution.
    assert max(whole.counts.values()) <= 2
    # The loss is on record, and every node's progress is now claimed in the new data: the marks
    # recorded before the loss no longer speak for claims Redis forgot.
    lost, current = epochs
    assert len(lost) == 1, f"one loss of Redis's data recorded: {lost}"
    assert len(current) == 1 and current != lost, f"every node records progress in the new data: {current}"
    assert not unrecorded, f"second deliveries not recorded in history: {unrecorded[:10]}"


def _epochs(database_url: str) -> tuple[set[str], set[str]]:
    """The epochs recorded lost, and those the nodes' progress was last claimed in."""
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            lost = set(conn.execute(text("SELECT epoch FROM lost_epochs")).scalars())
            current = set(
                conn.execute(
                    text("SELECT DISTINCT epoch FROM node_progress WHERE updated_at > now() - interval '5 seconds'")
                ).scalars()
            )
    finally:
        engine.dispose()
    return lost, current


@pytest.mark.cluster
def test_redis_restarted_empty_while_postgres_hangs(cluster: Cluster) -> None:
    """Two faults at once: PostgreSQL goes silent for the nodes (accepts, never answers), and while
    it is, Redis dies and comes back empty. The nodes must notice the loss without being able to
    record it: heartbeats and firing go on meanwhile, nothing is missed, and once PostgreSQL
    answers the loss is on record and progress is claimed in the new data."""
    server = EmbeddedRedis(cluster.logdir / "redis", port=free_port(), persist=False, log=cluster.logdir / "redis.log")
    server.start()
    proxy = FreezingProxy.in_front_of(cluster.database_url)
    through_proxy = proxy.url_for(cluster.database_url)
    ids = ["node-a", "node-b", "node-c"]
    try:
        cluster.use_redis(server.url())
        cluster.start_api()
        specs = [cluster.interval_job(f"rh-{i:03d}", 1) for i in range(100)]
        cluster.create_jobs(specs)
        cluster.start_nodes(ids, extra={n: {"CRONMAN_DATABASE_URL": through_proxy} for n in ids})
        cluster.wait_settled(ids)
        pids = {n: cluster.nodes[n].pid for n in ids}

        t0 = time.time() + 1.0
        sleep_until(t0 + 4)
        proxy.freeze()
        t_frozen = time.time()
        time.sleep(1.0)
        t_up, rejoin_s = _restart_empty(server, cluster, ids)  # PostgreSQL silent all along
        ages: list[float] = []
        while time.time() < t_up + HANG_AFTER_LOSS:  # PostgreSQL still silent: heartbeats must go on
            ages.append(max(n["heartbeat_age_seconds"] for n in cluster.cluster_view()["nodes"]))
            time.sleep(0.25)
        lost_in_hang = _epochs(cluster.database_url)[0]
        proxy.thaw()
        t_thawed = time.time()
        sleep_until(t_thawed + 8)
        t1 = time.time() - 3.0
        whole = cluster.analyse(t0, t1)
        hang = cluster.analyse(t_frozen, t_thawed)
        alive = {n: cluster.nodes[n].alive() and cluster.nodes[n].pid == pids[n] for n in ids}
        lost, current = wait_for(
            lambda: (lambda e: e if len(e[0]) == 1 and len(e[1]) == 1 else None)(_epochs(cluster.database_url)),
            10,
            "the loss on record and progress in the new data",
        )
        cluster.stop_nodes()
    finally:
        cluster.stop_nodes()
        proxy.close()
        server.stop()

    cluster.report(
        jobs=len(specs),
        postgres_silent_seconds=t_thawed - t_frozen,
        nodes_listed_again_after_seconds=rejoin_s,
        worst_heartbeat_age_in_hang=max(ages),
        whole=whole,
        during_hang=hang,
        nodes_kept_running=alive,
    )
    assert not lost_in_hang, "the loss was recorded while PostgreSQL hung: it did not hang"
    assert all(alive.values()), f"every node should have carried on without a restart: {alive}"
    assert rejoin_s <= 5.0, "nodes should register again within a few seconds, PostgreSQL or not"
    assert max(ages) <= 2.0, f"heartbeats stalled while PostgreSQL hung: {ages}"
    assert whole.missed == 0, f"missed: {whole.missed_sample}"
    assert max(whole.counts.values()) <= 2
    assert current != lost
