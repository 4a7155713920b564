"""Deadlines with real processes: an API and a scheduler node, a receiver that always fails and
one that always answers. Each occurrence of the failing job is recorded once as a missed deadline
with what history said of it; the answered job misses none while the node runs. With the node
stopped the API's watch goes on: the occurrences nobody fires miss their deadlines too, recorded
with no status, and health reads late."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import requests

from cronman.dev.receiver import Receiver
from tests.helpers import api_session, start_api_process, start_node_process, wait_for


def _misses(database_url: str) -> list[tuple[str, str, datetime, str | None]]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT job_id, execution_id::text, scheduled_for, status FROM deadline_misses ORDER BY 3, 1")
        return list(cur.fetchall())


def _counter(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else -1.0


def test_missed_deadlines_are_recorded_once_whichever_process_watches(
    settings_env: dict[str, str], workdir: Path, redis_prefix: str
) -> None:
    logs = workdir / f"deadlines-{redis_prefix.strip(':')}"
    logs.mkdir()
    db = settings_env["CRONMAN_DATABASE_URL"]
    api, url = start_api_process(settings_env, logs / "api.log")
    node, node_port = start_node_process(settings_env, "node-1", logs / "node-1.log")
    http = api_session(settings_env)
    try:
        with Receiver(fail_first=10**6) as broken, Receiver() as fine:
            start = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
            every = {"type": "interval", "every_seconds": 2, "start_at": start}
            for job_id, receiver, deadline in (("broken", broken, 1), ("fine", fine, 3)):
                job: dict[str, Any] = {
                    "id": job_id,
                    "schedule": every,
                    "target": {"type": "http", "url": receiver.url},
                    "retry": {"max_attempts": 1},
                    "deadline_seconds": deadline,
                }
                r = http.post(f"{url}/v1/jobs", json=job, timeout=5)
                assert r.status_code == 201, r.text

            got = wait_for(lambda: m if len(m := _misses(db)) >= 3 else None, 30, "three missed deadlines")
            assert {j for j, *_ in got} == {"broken"}  # the answered job met its deadline each time
            assert {status for *_, status in got} == {"permanently_failed"}  # what history said by then
            assert len(fine.snapshot()) >= 2
            node_metrics = requests.get(f"http://127.0.0.1:{node_port}/metrics", timeout=5).text
            assert _counter(node_metrics, "cronman_deadlines_missed_total") >= 0  # the node counts when it leads

            node.stop()
            stopped = datetime.now(UTC)

            def both_missed_since_the_stop() -> list[Any] | None:
                found = _misses(db)
                return found if {"broken", "fine"} <= {j for j, _, t, _ in found if t > stopped} else None

            late = wait_for(both_missed_since_the_stop, 30, "misses of occurrences nobody fired")
            after = [(j, s) for j, _, t, s in late if t > stopped + timedelta(seconds=1)]
            assert after and all(s is None for _, s in after)  # not taken up: no status
            assert not [t for j, _, t, _ in late if j == "fine" and t < stopped - timedelta(seconds=2)]
            ids = [e for _, e, _, _ in late]
            assert len(ids) == len(set(ids))  # once each
            for job_id in ("broken", "fine"):
                health = http.get(f"{url}/v1/jobs/{job_id}", timeout=5).json()["health"]
                assert health["state"] == "late", health
            time.sleep(0.5)
            api_metrics = requests.get(f"{url}/metrics", timeout=5).text
            assert _counter(api_metrics, "cronman_deadlines_missed_total") > 0  # counted by the API's watch
    finally:
        node.stop()
        api.stop()
