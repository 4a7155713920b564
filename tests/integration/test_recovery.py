"""History is kept when the node that delivered dies before writing it, and a node stopped with
SIGTERM leaves the cluster at once with its history written."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import redis
import requests
from flask.testing import FlaskClient

from cronman.dev.receiver import Receiver
from cronman.redis.cluster import live_nodes
from cronman.redis.keys import Keys
from cronman.settings import Settings
from tests.helpers import start_node_process, wait_for


def _create_jobs(client: FlaskClient, url: str, n: int, together: bool = False) -> None:
    for i in range(n):
        schedule: dict[str, object] = {"type": "interval", "every_seconds": 1}
        if together:  # the same phase: each second's deliveries finish together, one done call
            schedule["start_at"] = "2026-01-01T00:00:00Z"
        doc = {"id": f"r-{i}", "schedule": schedule, "target": {"type": "http", "url": url}}
        assert client.post("/v1/jobs", data=json.dumps(doc), content_type="application/json").status_code == 201


def _history(client: FlaskClient, n: int) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for i in range(n):
        for e in client.get(f"/v1/jobs/r-{i}/executions", query_string={"limit": 1000}).json["executions"]:
            rows[e["execution_id"]] = e
    return rows


def _metrics(port: int) -> dict[str, float]:
    """A node's unlabelled metrics, by name."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        name: float(value)
        for name, _, value in (line.partition(" ") for line in text.splitlines() if line and line[0] != "#")
        if "{" not in name
    }


def test_a_killed_nodes_unwritten_history_is_recovered_by_a_survivor(
    client: FlaskClient, settings: Settings, settings_env: dict[str, str], workdir: Path, redis_prefix: str
) -> None:
    """Rows kept alone and in batches (scheduler_node/claims/rows.py): the jobs fire together, so
    node-a's done calls carry several rows each."""
    logs = workdir / f"recovery-{redis_prefix.strip(':')}"
    logs.mkdir()
    with Receiver() as receiver:
        # node-a's history writes fail as while PostgreSQL is unreachable: its rows stay in Redis
        a, a_port = start_node_process(settings_env, "node-a", logs / "a.log", fault="history_unavailable")
        b, _ = start_node_process(settings_env, "node-b", logs / "b.log")
        try:
            _create_jobs(client, receiver.url, 10, together=True)
            r = redis.Redis.from_url(settings.redis_url)
            # (waited for, not slept on: on a busy machine a second's deliveries can finish apart,
            # each done call then carrying one row, kept alone)
            wait_for(
                lambda: list(r.scan_iter(match=f"{settings.redis_prefix}*rows:b|node-a/*")),
                20,
                "node-a to keep a batch of rows",
            )
            time.sleep(1)
            # node-a's own writes failed and its rows wait in its buffer: without the fault it would
            # have written them itself (which rows of node-a's are in history says nothing: node-b
            # writes those kept in Redis past history_recover_after_seconds while node-a lives)
            held = _metrics(a_port)
            assert held["cronman_history_write_failures_total"] > 0, "the fault was not injected"
            assert held["cronman_history_rows_buffered"] > 0
            a.signal(signal.SIGKILL)
            a.proc.wait(10)
            delivered = {r.execution_id for r in receiver.snapshot()}
            assert delivered
            # node-a's rows were never written by node-a; node-b writes them from Redis's copy
            rows = wait_for(
                lambda: (lambda h: h if delivered <= set(h) else None)(_history(client, 10)),
                20,
                "a history row for every delivery",
            )
            by_a = [e for e in rows.values() if e["execution_id"] in delivered and e["node"] == "node-a"]
            assert by_a, "node-a delivered nothing: the test proves nothing"
            assert all(e["status"] == "succeeded" and e["duplicates"] == 0 for e in by_a)
        finally:
            a.stop()
            b.stop()


def test_sigterm_leaves_the_cluster_at_once_with_history_written(
    client: FlaskClient, settings: Settings, settings_env: dict[str, str], workdir: Path, redis_prefix: str
) -> None:
    logs = workdir / f"sigterm-{redis_prefix.strip(':')}"
    logs.mkdir()
    r = redis.Redis.from_url(settings.redis_url)
    keys = Keys(settings.redis_prefix)
    with Receiver(delay=0.5) as receiver:
        node, _ = start_node_process(settings_env, "node-t", logs / "t.log")
        try:
            _create_jobs(client, receiver.url, 5)
            wait_for(lambda: len(receiver.snapshot()) >= 5, 10, "deliveries")
            assert [n.node_id for n in live_nodes(r, keys)] == ["node-t"]
            node.signal(signal.SIGTERM)
            assert node.proc.wait(30) == 0
            assert live_nodes(r, keys) == []  # gone at once, not after the heartbeat TTL
        finally:
            node.stop()
    delivered = {x.execution_id for x in receiver.snapshot()}
    rows = _history(client, 5)
    assert delivered <= set(rows), "a delivery finished during shutdown was not recorded"
    leftover = [k for k in r.scan_iter(match=f"{settings.redis_prefix}*unrec") if r.zcard(k)]
    leftover += list(r.scan_iter(match=f"{settings.redis_prefix}*rows:*"))  # batches (claims/rows.py)
    assert leftover == [], "rows written to history are still kept in Redis"
