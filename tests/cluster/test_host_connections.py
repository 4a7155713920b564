"""Connections per receiver: a burst to one host queues in the node, in due order, instead of
opening a connection per delivery; one host's queue never delays another host's deliveries.

Found from outside: 500 jobs in one phase every second, no fault, against a receiver whose accept
queue is 5 (Python's ``http.server`` default, as many small services have): the node opened a
connection per delivery, the kernel dropped the SYNs beyond the accept queue, and they waited on
retransmits (1 s, then 3 s, ...): lag p99 11.2 s, max 26.8 s, 581 second attempts (timeouts) and
64 deliveries twice. Here, before the cap: against the receiver that keeps its connections, p99
10.6 s, 403 second attempts, 19 twice (464 connections at once); against the one that closes them,
p99 11.2 s, 29 twice. And 300 jobs a second to a black-holed host held every delivery slot of their
namespace: 100 jobs of the same namespace to a fast host delivered nothing in 20 s.

The node runs at the shipped defaults (connections per host, in-flight limits, timeouts, lease),
as a user gets them.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from bench.loader import JobTemplate, copy_jobs
from tests.cluster.conftest import Cluster, sleep_until
from tests.cluster.ledger import Arrival, Figures, analyse
from tests.helpers import BlackHole, SmallServer, wait_for
from tests.timings import DEFAULTS

# timings: the shipped ones, as a user gets them (nothing here fails a node)
pytestmark = pytest.mark.timings(DEFAULTS)

BURST = 500  # jobs, all in one phase, every second
WINDOW = 20.0  # seconds of firing measured


def one_phase(url: str, start: float, **target: Any) -> JobTemplate:
    """Every second from ``start`` (epoch seconds): every job made from it fires at the same instants."""
    at = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return JobTemplate.of(
        {
            "schedule": {"type": "interval", "every_seconds": 1, "start_at": at},
            "target": {"type": "http", "url": url, **target},
        }
    )


def load(cluster: Cluster, database_url: str, prefix: str, n: int, template: JobTemplate) -> list[str]:
    ids = [f"{prefix}-{i:04d}" for i in range(n)]
    copy_jobs(database_url, ((i, template) for i in ids), n)
    cluster.schedules.update(dict.fromkeys(ids, template.schedule))
    return ids


def only(schedules: dict[str, dict[str, Any]], ids: list[str]) -> dict[str, dict[str, Any]]:
    return {i: schedules[i] for i in ids}


def worst_by_second(arrivals: list[Arrival], t0: float, t1: float) -> list[int]:
    """The worst first-arrival lag (ms) of each second's occurrences in the window, for the report."""
    first: dict[tuple[str, int], float] = {}
    for a in arrivals:
        key = (a.job_id, a.scheduled_ms)
        first[key] = min(first.get(key, a.at), a.at)
    worst: dict[int, int] = {}
    for (_, ms), at in first.items():
        if t0 * 1000 <= ms <= t1 * 1000:
            worst[ms] = max(worst.get(ms, 0), int(at * 1000) - ms)
    return [worst[ms] for ms in sorted(worst)]


def second_attempts(arrivals: list[Arrival]) -> int:
    return sum(1 for a in arrivals if a.attempt > 1)


def twice(arrivals: list[Arrival]) -> int:
    return sum(1 for n in Counter(a.execution_id for a in arrivals).values() if n > 1)


def start_node(cluster: Cluster) -> None:
    """One node at the shipped defaults, ready with every job loaded."""
    (node,) = cluster.start_nodes(["node-a"])
    wait_for(lambda: node.readyz()["jobs"] == len(cluster.schedules), 60, "the node to load every job")


@pytest.mark.cluster
@pytest.mark.parametrize("keep_alive", [True, False], ids=["keep-alive", "close"])
def test_a_burst_to_a_small_accept_queue_arrives_once_and_on_time(
    cluster: Cluster, database_url: str, keep_alive: bool
) -> None:
    with SmallServer(keep_alive) as server:
        start = time.time() + 20  # after the node is ready (its grace at the defaults is 10 s)
        ids = load(cluster, database_url, "burst", BURST, one_phase(server.url, start))
        start_node(cluster)
        t0 = max(start, time.time()) + 2.0  # past the first second's connections
        sleep_until(t0 + WINDOW + 3)
        t1 = t0 + WINDOW
        figures: Figures = analyse(only(cluster.schedules, ids), server.arrivals, t0, t1)
        arrivals = list(server.arrivals)
        cluster.report(
            keep_alive=keep_alive,
            figures=figures,
            second_attempts=second_attempts(arrivals),
            twice=twice(arrivals),
            peak_connections=server.peak_connections,
            peak_requests=server.peak_requests,
            worst_lag_ms_by_second=worst_by_second(arrivals, t0, t1),
        )
    assert figures.expected >= BURST * WINDOW
    assert figures.missed == 0, f"missed: {figures.missed_sample}"
    assert figures.doubled == 0 and twice(arrivals) == 0, f"delivered twice: {figures.doubled_sample}"
    assert second_attempts(arrivals) == 0, "an attempt failed (a timeout waiting for the receiver)"
    assert figures.p99_lag_ms is not None and figures.p99_lag_ms <= 1000, figures.as_dict()


@pytest.mark.cluster
def test_a_black_holed_host_does_not_delay_another_hosts_deliveries(cluster: Cluster, database_url: str) -> None:
    """Deliveries to a host that never answers a connect wait for their own connections (each
    attempt's timeout, then its retries); deliveries of the same namespace to a host that answers
    go out on time all the while."""
    with BlackHole() as hole:
        start = time.time() + 20
        fast = load(cluster, database_url, "fast", 100, one_phase(f"{cluster.receiver.url}/hook", start))
        load(cluster, database_url, "hole", 300, one_phase(hole.url, start))
        start_node(cluster)
        t0 = max(start, time.time()) + 12.0  # past the first attempts' timeouts (10 s): retries are out too
        sleep_until(t0 + WINDOW + 3)
        t1 = t0 + WINDOW
        figures = analyse(only(cluster.schedules, fast), cluster.receiver.snapshot(), t0, t1)
        cluster.report(fast=figures)
    assert figures.expected >= 100 * WINDOW
    assert figures.missed == 0, f"missed: {figures.missed_sample}"
    assert figures.doubled == 0
    assert figures.p99_lag_ms is not None and figures.p99_lag_ms <= 1000, figures.as_dict()
