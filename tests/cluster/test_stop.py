"""A pause or a delete means stop: once the API has answered the change (for a job that pauses
itself, once the API first shows it paused), at most the attempt already in flight reaches the
receiver. Real API, real node processes, a real receiver recording when each delivery arrived.

Run at the shipped timings (heartbeat every 3 s, TTL 30 s, lease 5 s, change poll 1 s), and again
with a change poll of 5 s (the longest the settings accept): a poll alone would then let a 1-second
job fire up to five times more, so at most one is mostly the notification's doing (the pause while
PostgreSQL hangs, below, is the notification's alone). Each has one job
alone and five whose slots one pair of nodes owns, beside a third node.

And around it: a pause while the nodes' database hangs (they stop on the notification alone), the
notifications after a Redis restart, a notification lost (the poll makes it up), and a retry
waiting when its job is paused or deleted (not made).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from cronman.dev.embedded import EmbeddedRedis, free_port
from cronman.model.hashing import owners, slot_of
from cronman.model.timeutil import iso
from tests.cluster.conftest import Cluster
from tests.cluster.ledger import Arrival
from tests.helpers import FreezingProxy, history_rows, wait_for
from tests.timings import DEFAULTS

# timings: the shipped ones (a pause or a delete must stop a job at the timings users get), with the
# change poll made the longest the settings accept (5 s) in the long-poll cases: a job firing every
# second then sends several more before a poll could stop it, so only the notification stops it in time
pytestmark = [pytest.mark.cluster, pytest.mark.timings(DEFAULTS)]

SHIPPED_POLL = DEFAULTS.values["change_poll_seconds"]
LONG_POLL = 5.0  # the longest change poll cronman.settings accepts
WATCHED = 6.0  # seconds watched after the change: a lease, and six change polls at the shipped timing
PAIR = ("node-a", "node-b")


def at_shipped_timings(cluster: Cluster, change_poll: float) -> None:
    cluster.env["CRONMAN_CHANGE_POLL_SECONDS"] = str(change_poll)


def ids_owned_by(pair: tuple[str, ...], members: list[str], n: int, prefix: str) -> list[str]:
    """``n`` job ids whose slots ``pair`` owns among ``members`` (replication factor two)."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        job_id = f"{prefix}-{i:03d}"
        if set(owners(slot_of(job_id), members, 2)) == set(pair):
            out.append(job_id)
        i += 1
    return out


def one_second_job(cluster: Cluster, job_id: str, **extra: Any) -> dict[str, Any]:
    return cluster.interval_job(job_id, 1, retry={"max_attempts": 1}, **extra)


def arrivals_of(cluster: Cluster, job_id: str) -> list[Arrival]:
    return [a for a in cluster.receiver.snapshot() if a.job_id == job_id]


def start(cluster: Cluster, change_poll: float) -> tuple[list[str], list[str]]:
    """The API and three nodes at the shipped timings (with this change poll); the ids of the jobs
    to create: one whose slot node-a and node-c own, and five whose slots node-a and node-b own."""
    at_shipped_timings(cluster, change_poll)
    cluster.start_api()
    members = [*PAIR, "node-c"]
    cluster.start_nodes(members)
    cluster.wait_settled(members, timeout=60)
    return ids_owned_by(("node-a", "node-c"), members, 1, "lone"), ids_owned_by(PAIR, members, 5, "pair")


def flowing(cluster: Cluster, ids: list[str], n: int = 3, timeout: float = 30.0) -> None:
    wait_for(lambda: all(len(arrivals_of(cluster, j)) >= n for j in ids), timeout, f"{n} deliveries of each job", 0.1)


def after_the_change(cluster: Cluster, answered: dict[str, float]) -> dict[str, list[float]]:
    """Watch WATCHED seconds past the last change; for each job, the arrivals after its change
    (seconds after it)."""
    time.sleep(max(answered.values()) + WATCHED - time.time())
    return {j: [round(a.at - t, 3) for a in arrivals_of(cluster, j) if a.at > t] for j, t in answered.items()}


def check(cluster: Cluster, kind: str, change_poll: float, answered: dict[str, float]) -> None:
    late = after_the_change(cluster, answered)
    cluster.report(kind=kind, change_poll_seconds=change_poll, jobs=len(answered), after_the_change=late)
    too_many = {j: v for j, v in late.items() if len(v) > 1}
    assert not too_many, f"deliveries after the API answered the {kind} (seconds after it): {too_many}"


def timed(call: Callable[[], requests.Response], expect: int) -> float:
    r = call()
    at = time.time()
    assert r.status_code == expect, r.text
    return at


POLLS = [pytest.param(SHIPPED_POLL, id="shipped-poll"), pytest.param(LONG_POLL, id="long-poll")]


@pytest.mark.parametrize("change_poll", POLLS)
def test_pause_stops_at_once(cluster: Cluster, change_poll: float) -> None:
    """One job paused alone; then five jobs whose slots one pair of nodes owns, in one batch."""
    lone, group = start(cluster, change_poll)
    cluster.create_jobs([one_second_job(cluster, j) for j in lone + group])
    flowing(cluster, lone + group)
    s, url = cluster.session, cluster.api_url
    answered = {lone[0]: timed(lambda: s.post(f"{url}/v1/jobs/{lone[0]}/pause", timeout=10), 200)}
    time.sleep(0.5)
    body = {"jobs": [one_second_job(cluster, j, paused=True) for j in group]}
    answered |= dict.fromkeys(group, timed(lambda: s.post(f"{url}/v1/jobs:batch", json=body, timeout=10), 200))
    check(cluster, "pause", change_poll, answered)


@pytest.mark.parametrize("change_poll", POLLS)
def test_delete_stops_at_once(cluster: Cluster, change_poll: float) -> None:
    """One job deleted alone; then five jobs whose slots one pair of nodes owns, one after another."""
    lone, group = start(cluster, change_poll)
    cluster.create_jobs([one_second_job(cluster, j) for j in lone + group])
    flowing(cluster, lone + group)
    s, url = cluster.session, cluster.api_url
    answered = {j: timed(lambda j=j: s.delete(f"{url}/v1/jobs/{j}", timeout=10), 204) for j in lone + group}
    check(cluster, "delete", change_poll, answered)


@pytest.mark.parametrize("change_poll", POLLS)
def test_auto_pause_stops_at_once(cluster: Cluster, change_poll: float) -> None:
    """Six failing jobs (one alone, five whose slots one pair of nodes owns) pause themselves."""
    lone, group = start(cluster, change_poll)
    ids = lone + group
    for j in ids:
        cluster.receiver.statuses[j] = 500
    policy = {"pause_after_consecutive_failures": 3}
    cluster.create_jobs([one_second_job(cluster, j, failure_policy=policy) for j in ids])
    s, url = cluster.session, cluster.api_url
    answered: dict[str, float] = {}
    deadline = time.monotonic() + 40
    while len(answered) < len(ids) and time.monotonic() < deadline:  # as soon as the API shows each paused
        for j in [j for j in ids if j not in answered]:
            asked = time.time()
            if s.get(f"{url}/v1/jobs/{j}", timeout=10).json()["paused"]:
                answered[j] = asked  # (counted from when the request that showed it was sent: the stricter)
        time.sleep(0.02)
    assert len(answered) == len(ids), f"only {sorted(answered)} of {ids} paused themselves within 40 s"
    check(cluster, "auto-pause", change_poll, answered)


def test_a_pause_stops_the_job_while_the_nodes_cannot_read_the_feed(cluster: Cluster) -> None:
    """The nodes' PostgreSQL hangs (the API's does not): they keep firing what they hold, and
    their read of the change feed waits. A pause answered meanwhile still stops the job at once:
    the notification names it, and the nodes need nothing from the database to stop it."""
    at_shipped_timings(cluster, SHIPPED_POLL)
    proxy = FreezingProxy.in_front_of(cluster.database_url)
    try:
        cluster.start_api()
        through = {"CRONMAN_DATABASE_URL": proxy.url_for(cluster.database_url)}
        cluster.start_nodes(list(PAIR), extra=dict.fromkeys(PAIR, through))
        cluster.wait_settled(list(PAIR), timeout=60)
        job_id = ids_owned_by(PAIR, list(PAIR), 1, "hang")[0]
        cluster.create_jobs([one_second_job(cluster, job_id)])
        flowing(cluster, [job_id])
        proxy.freeze()
        time.sleep(2.5)
        assert len(arrivals_of(cluster, job_id)) >= 4, "the nodes stopped firing when their database hung"
        url = f"{cluster.api_url}/v1/jobs/{job_id}/pause"
        answered = {job_id: timed(lambda: cluster.session.post(url, timeout=10), 200)}
        late = after_the_change(cluster, answered)
    finally:
        proxy.thaw()
    cluster.report(kind="pause while the nodes' database hangs", after_the_change=late)
    assert len(late[job_id]) <= 1, f"deliveries after the API answered the pause (seconds after it): {late}"


def test_notifications_come_back_after_a_redis_restart(cluster: Cluster) -> None:
    """Redis restarts (empty): the nodes subscribe again, and a pause after that is heard at once
    (with the longest change poll, 5 s, nothing else would stop the job in time)."""
    server = EmbeddedRedis(cluster.logdir / "redis", port=free_port(), persist=False, log=cluster.logdir / "redis.log")
    server.start()
    try:
        cluster.use_redis(server.url())
        ids, _ = start(cluster, LONG_POLL)
        cluster.create_jobs([one_second_job(cluster, ids[0])])
        flowing(cluster, ids)
        assert server.child is not None
        server.child.proc.kill()
        server.child.proc.wait(10)
        time.sleep(1.5)
        server.restart_empty()
        back = time.time()
        wait_for(lambda: any(a.at > back + 1 for a in arrivals_of(cluster, ids[0])), 30, "firing again after Redis")
        time.sleep(2.0)  # a subscription made again within a second of Redis coming back (see wiring)
        url = f"{cluster.api_url}/v1/jobs/{ids[0]}/pause"
        answered = {ids[0]: timed(lambda: cluster.session.post(url, timeout=10), 200)}
        check(cluster, "pause after a Redis restart", LONG_POLL, answered)
    finally:
        cluster.stop_nodes()
        server.stop()


def test_a_notification_lost_is_made_up_by_the_poll(cluster: Cluster) -> None:
    """The API's link to Redis hangs (the nodes' does not): its answer to a pause is held up at
    most briefly, the notification does not go out, and the nodes stop the job at their next read
    of the change feed."""
    at_shipped_timings(cluster, SHIPPED_POLL)
    where = urlsplit(cluster.redis_url)
    assert where.hostname and where.port
    proxy = FreezingProxy((where.hostname, where.port))
    direct = cluster.redis_url
    try:
        cluster.env["CRONMAN_REDIS_URL"] = direct.replace(where.netloc, f"{proxy.host}:{proxy.port}")
        cluster.start_api()
        cluster.env["CRONMAN_REDIS_URL"] = direct
        cluster.start_nodes(list(PAIR))
        cluster.wait_settled(list(PAIR), timeout=60)
        job_id = ids_owned_by(PAIR, list(PAIR), 1, "lost")[0]
        cluster.create_jobs([one_second_job(cluster, job_id)])
        flowing(cluster, [job_id])
        proxy.freeze()
        asked = time.time()
        url = f"{cluster.api_url}/v1/jobs/{job_id}/pause"
        answered = timed(lambda: cluster.session.post(url, timeout=10), 200)
        late = after_the_change(cluster, {job_id: answered})[job_id]
    finally:
        proxy.thaw()
    poll = SHIPPED_POLL
    cluster.report(kind="pause, notification lost", answer_seconds=answered - asked, after_the_change=late)
    assert answered - asked < 2.0, "the API's answer waited for a Redis it cannot reach"
    # the last delivery: one the node sent before its next read of the feed applied the pause
    assert all(t <= poll + 1.5 for t in late), f"deliveries after the API answered the pause: {late}"


def test_a_retry_waiting_is_not_made(cluster: Cluster) -> None:
    """Attempt 1 of two jobs fails and attempt 2 waits 4 s for its time: a pause of one and a
    delete of the other meanwhile cancel it, recorded as such; it is not sent."""
    _, group = start(cluster, SHIPPED_POLL)
    paused, deleted = group[:2]
    due_ms = math.ceil(time.time() + 4) * 1000
    specs = []
    for job_id in (paused, deleted):
        cluster.receiver.statuses[job_id] = 500
        specs.append(
            {
                **cluster.interval_job(job_id, 1),
                "schedule": {"type": "once", "at": iso(due_ms)},
                "retry": {"max_attempts": 3, "backoff_seconds": 4, "jitter": False},
            }
        )
    cluster.create_jobs(specs)
    wait_for(lambda: all(arrivals_of(cluster, j) for j in (paused, deleted)), 15, "attempt 1 of each")
    time.sleep(0.5)  # their failures recorded: attempt 2 waits
    s, url = cluster.session, f"{cluster.api_url}/v1/jobs"
    timed(lambda: s.post(f"{url}/{paused}/pause", timeout=10), 200)
    timed(lambda: s.delete(f"{url}/{deleted}", timeout=10), 204)
    time.sleep(4 + 3)  # past when attempt 2 was due
    for job_id, reason in ((paused, "the job was paused"), (deleted, "the job was deleted")):
        attempts = [a.attempt for a in arrivals_of(cluster, job_id)]
        wait_for(lambda j=job_id: len(history_rows(cluster.database_url, j)) >= 2, 10, "the cancelled retry's row")
        rows = [(r["attempt"], r["status"], r["error"]) for r in history_rows(cluster.database_url, job_id)]
        cluster.report(kind=f"retry after: {reason}", attempts=attempts, history=rows)
        assert attempts == [1], f"{job_id}: attempts delivered: {attempts}"
        assert rows[0][:2] == (1, "failed") and rows[1:] == [(2, "cancelled", reason)], rows
