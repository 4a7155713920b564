"""Outages while jobs fire (DESIGN section 8, items 5 and 8): PostgreSQL crashes and comes back,
and every scheduler node is down for a while. Real processes, a real receiver."""

from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import requests
from sqlalchemy import text

from cronman.dev.embedded import EmbeddedPostgres
from cronman.dev.receiver import Receiver
from cronman.store.store import make_engine
from tests.conftest import ADMIN_KEY
from tests.helpers import FreezingProxy, start_api_process, start_node_process, wait_for
from tests.timings import FAST

# timings: PostgreSQL away or hanging under real processes: mechanics
pytestmark = [pytest.mark.cluster, pytest.mark.timings(FAST)]


def _env(settings_env: dict[str, str], database_url: str) -> dict[str, str]:
    return {**settings_env, "CRONMAN_DATABASE_URL": database_url}


def _create(api_url: str, jobs: list[dict]) -> None:
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    for job in jobs:
        r = s.post(f"{api_url}/v1/jobs", json=job, timeout=10)
        assert r.status_code == 201, r.text


def _every_second(prefix: str, url: str, count: int = 30) -> list[dict]:
    return [
        {
            "id": f"{prefix}-{i}",
            "schedule": {"type": "interval", "every_seconds": 1},
            "target": {"type": "http", "url": url},
        }
        for i in range(count)
    ]


def _history_ids(database_url: str) -> set[str]:
    engine = make_engine(database_url, pool_size=1)
    with engine.connect() as conn:
        ids = {str(r[0]) for r in conn.execute(text("SELECT execution_id FROM scheduled_jobs"))}
    engine.dispose()
    return ids


def test_a_postgres_crash_loses_no_history(
    own_postgres: EmbeddedPostgres, settings_env: dict[str, str], workdir: Path
) -> None:
    env = _env(settings_env, own_postgres.url())
    logs = workdir / f"pg-crash-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    api, api_url = start_api_process(env, logs / "api.log")
    node, _ = start_node_process(env, "node-1", logs / "node-1.log")
    try:
        with Receiver() as receiver:
            _create(api_url, _every_second("pg", receiver.url))
            time.sleep(4)
            before = len(receiver.snapshot())
            own_postgres.kill()  # SIGKILL: a crash, not a clean shutdown
            time.sleep(6)
            during = len(receiver.snapshot()) - before
            own_postgres.start()
            time.sleep(4)
            node.signal(signal.SIGTERM)
            assert node.proc.wait(60) == 0
            delivered = {r.execution_id for r in receiver.snapshot()}
        rows = _history_ids(own_postgres.url())
    finally:
        node.stop()
        api.stop()
    missing = delivered - rows
    report = {"delivered": len(delivered), "during_outage": during, "history_rows": len(rows), "missing": len(missing)}
    print("\npostgres crash:", json.dumps(report))
    assert during >= 100, "firing stopped while PostgreSQL was down"
    if missing:
        log = (logs / "node-1.log").read_text()
        lines = [ln for ln in log.splitlines() if "warning" in ln or "error" in ln][-30:]
        pytest.fail(f"{len(missing)} deliveries have no history row: {sorted(missing)}\n" + "\n".join(lines))


def test_all_nodes_down_then_up_applies_the_misfire_policy(
    database_url: str, settings_env: dict[str, str], workdir: Path
) -> None:
    env = _env(settings_env, database_url)
    logs = workdir / f"all-down-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    api, api_url = start_api_process(env, logs / "api.log")
    try:
        with Receiver() as receiver:
            nodes = [start_node_process(env, f"node-{i}", logs / f"node-{i}-a.log")[0] for i in (1, 2)]
            _create(
                api_url,
                [
                    {
                        "id": f"{policy}-{i}",
                        "schedule": {"type": "interval", "every_seconds": 2},
                        "target": {"type": "http", "url": receiver.url},
                        "misfire_policy": policy,
                    }
                    for policy in ("fire_once", "skip")
                    for i in range(5)
                ],
            )
            wait_for(lambda: len(receiver.snapshot()) >= 20, 15, "deliveries before the outage")
            for n in nodes:
                n.signal(signal.SIGTERM)
            for n in nodes:
                assert n.proc.wait(60) == 0
            down_at = time.time()
            time.sleep(20)  # longer than the look-back window of a starting node (6.8 s here)
            nodes = [start_node_process(env, f"node-{i}", logs / f"node-{i}-b.log")[0] for i in (1, 2)]
            time.sleep(6)
            for n in nodes:
                n.stop()
            got = receiver.snapshot()
        history = requests.get(
            f"{api_url}/v1/jobs/fire_once-0/executions",
            params={"limit": 1000},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=10,
        ).json()["executions"]
    finally:
        api.stop()
    # The restarted nodes log the outage window they applied the policies to.
    until = None
    for f in logs.glob("node-*-b.log"):
        for line in f.read_text().splitlines():
            if "no scheduler was running" in line:
                until = datetime.fromisoformat(json.loads(line)["until"].replace("Z", "+00:00")).timestamp()
    assert until is not None, "no node noticed the outage"

    def in_outage(job: str) -> list[str]:
        return [
            r.headers["Cronman-Scheduled-For"]
            for r in got
            if r.job_id == job and down_at + 0.5 < _ts(r.headers["Cronman-Scheduled-For"]) <= until
        ]

    for i in range(5):
        assert len(in_outage(f"fire_once-{i}")) == 1, in_outage(f"fire_once-{i}")  # fire once, late
        assert in_outage(f"skip-{i}") == []  # skip: none of them
    skipped = [e for e in history if e["status"] == "skipped"]
    assert len(skipped) >= 4 and all(e["error"].startswith("misfire:") for e in skipped)
    keys = [(r.job_id, r.headers["Cronman-Scheduled-For"]) for r in got]
    assert len(keys) == len(set(keys)), "an occurrence was delivered twice"


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _heartbeat_ages(api_url: str) -> dict[str, float]:
    r = requests.get(f"{api_url}/v1/cluster", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=5)
    r.raise_for_status()
    return {n["id"]: n["heartbeat_age_seconds"] for n in r.json()["nodes"]}


def test_a_postgres_that_hangs_stops_neither_heartbeats_nor_firing(settings_env: dict[str, str], workdir: Path) -> None:
    """PostgreSQL goes silent for a node (it accepts, acknowledges and never answers: a hung server,
    which no TCP timeout of the node's own notices) for 8 s while 30 jobs fire every second. The
    node keeps its heartbeat, so nobody takes its slots; it keeps firing from what it holds; and
    once PostgreSQL answers again, every delivery of the hang has its history row."""
    database_url = settings_env["CRONMAN_DATABASE_URL"]
    logs = workdir / f"pg-hang-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    with FreezingProxy.in_front_of(database_url) as proxy:
        through_proxy = proxy.url_for(database_url)
        api, api_url = start_api_process(settings_env, logs / "api.log")
        node, _ = start_node_process(_env(settings_env, through_proxy), "node-1", logs / "node-1.log")
        try:
            with Receiver() as receiver:
                _create(api_url, _every_second("hang", receiver.url))
                wait_for(lambda: len(receiver.snapshot()) >= 60, 15, "the jobs to fire")
                proxy.freeze()
                frozen_at = time.time()
                ages: list[float] = []
                while time.time() - frozen_at < 8:
                    ages.append(_heartbeat_ages(api_url).get("node-1", float("inf")))
                    time.sleep(0.25)
                thawed_at = time.time()
                during = [r for r in receiver.snapshot() if frozen_at + 1 <= r.at < thawed_at]
                # the hang is real: nothing the node fired in it reached PostgreSQL
                written_in_hang = {r.execution_id for r in during} & _history_ids(database_url)
                proxy.thaw()
                time.sleep(2)
                node.signal(signal.SIGTERM)
                assert node.proc.wait(60) == 0
                delivered = {r.execution_id for r in receiver.snapshot()}
            rows = _history_ids(database_url)
        finally:
            node.stop()
            api.stop()
    missing = delivered - rows
    gaps = sorted(b.at - a.at for a, b in zip(during, during[1:], strict=False))
    report = {
        "delivered_during_hang": len(during),
        "worst_heartbeat_age_s": max(ages),
        "longest_gap_s": round(gaps[-1], 2) if gaps else None,
        "delivered": len(delivered),
        "history_rows": len(rows),
        "missing": len(missing),
        "written_during_hang": len(written_in_hang),
    }
    print("\npostgres hang:", json.dumps(report))
    assert not written_in_hang, f"PostgreSQL did not hang for the node: {report}"
    assert max(ages) <= 2.0, f"the node's heartbeat stalled while PostgreSQL hung: ages {ages}"
    assert len(during) >= 30 * 7 * 0.8, f"firing stalled while PostgreSQL hung: {report}"
    assert not missing, f"{len(missing)} deliveries have no history row: {report}"
