"""libpq multi-host URLs for the API, engines and migrations, and a real failover: the primary is
SIGKILLed, the streaming standby promoted, and the running API and engines carry on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import requests
import sqlalchemy.exc
from sqlalchemy import text

from cronman.dev.embedded import free_port
from cronman.errors import ConfigError
from cronman.store.store import engine_url, make_engine
from tests.conftest import ADMIN_KEY
from tests.engines.conftest import PgFailoverPair
from tests.helpers import start_api_process


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:p@h:5432/db", "postgresql+psycopg2://u:p@h:5432/db"),
        ("postgres://h/db?sslmode=require", "postgresql+psycopg2://h/db?sslmode=require"),
        (
            "postgresql://u:p%40ss@h1:5432,h2:5433/db?target_session_attrs=read-write&sslmode=verify-full",
            "postgresql+psycopg2://u:p%40ss@/db?host=h1,h2&port=5432,5433"
            "&target_session_attrs=read-write&sslmode=verify-full",
        ),
        ("postgresql://h1,h2/db", "postgresql+psycopg2:///db?host=h1,h2"),
        ("postgresql://u@h1,h2:6000", "postgresql+psycopg2://u@/?host=h1,h2&port=,6000"),
        ("postgresql://[::1]:5432,[fd00::2]/db", "postgresql+psycopg2:///db?host=%3A%3A1,fd00%3A%3A2&port=5432,"),
        ("postgresql+psycopg2://u@/db?host=a,b", "postgresql+psycopg2://u@/db?host=a,b"),
    ],
)
def test_engine_url_moves_a_host_list_into_the_query(given: str, expected: str) -> None:
    assert engine_url(given) == expected


@pytest.mark.parametrize(
    "bad",
    ["postgresql://h1,h2/db?host=h3", "postgresql://h1,:5432/db", "postgresql://h1:x,h2/db", "postgresql://[::1,h2/db"],
)
def test_malformed_host_lists_are_refused_clearly(bad: str) -> None:
    with pytest.raises(ConfigError):
        engine_url(bad)


def _server(url: str) -> tuple[int, bool]:
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            port, standby = conn.execute(text("SELECT inet_server_port(), pg_is_in_recovery()")).one()
            return int(port), bool(standby)
    finally:
        engine.dispose()


def test_a_host_list_skips_dead_hosts_and_with_read_write_the_standby(pg_failover_pair: PgFailoverPair) -> None:
    primary, standby = pg_failover_pair.primary.port, pg_failover_pair.standby.port
    hosts = f"127.0.0.1:{free_port()},127.0.0.1:{standby},127.0.0.1:{primary}"
    assert _server(f"postgresql://postgres@{hosts}/cronman?target_session_attrs=read-write") == (primary, False)
    # Without target_session_attrs libpq keeps the first host that answers, here the standby.
    assert _server(f"postgresql://postgres@{hosts}/cronman") == (standby, True)


def test_cronman_migrate_takes_a_host_list(pg_failover_pair: PgFailoverPair, tmp_path: Path) -> None:
    conn = psycopg2.connect(pg_failover_pair.primary.url("postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute('CREATE DATABASE "fresh"')
    conn.close()
    url = pg_failover_pair.url.replace("/cronman?", "/fresh?")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONMAN_")}
    env["CRONMAN_DATABASE_URL"] = url
    proc = subprocess.run(
        [sys.executable, "-m", "cronman", "migrate"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["migrated"] is True
    # Replicated to the standby as well.
    with psycopg2.connect(pg_failover_pair.standby.url("fresh")) as check, check.cursor() as cur:
        deadline = time.monotonic() + 10
        while True:
            cur.execute("SELECT to_regclass('public.jobs') IS NOT NULL")
            row = cur.fetchone()
            if (row and row[0]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert row == (True,)
    check.close()


def test_api_and_engines_carry_on_after_the_primary_is_killed_and_the_standby_promoted(
    pg_failover_pair: PgFailoverPair, redis_server_url: str, redis_prefix: str, workdir: Path
) -> None:
    url = pg_failover_pair.url
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONMAN_")}
    env.update(
        CRONMAN_DATABASE_URL=url,
        CRONMAN_REDIS_URL=redis_server_url,
        CRONMAN_REDIS_PREFIX=redis_prefix,
        CRONMAN_API_KEY=ADMIN_KEY,
    )
    api, base = start_api_process(env, workdir / f"api-failover-{redis_prefix.strip(':')}.log")
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    pinged = make_engine(url, pool_size=2)
    unpinged = make_engine(url, pool_size=2, pre_ping=False)
    try:
        doc: dict[str, Any] = {
            "schedule": {"type": "interval", "every_seconds": 3600},
            "target": {"type": "http", "url": "https://example.com/h"},
        }
        assert http.put(f"{base}/v1/jobs/before", json=doc, timeout=10).status_code == 201
        for engine in (pinged, unpinged):  # each holds a pooled connection to the old primary
            with engine.connect() as conn:
                assert conn.execute(text("SELECT inet_server_port()")).scalar() == pg_failover_pair.primary.port

        seconds = pg_failover_pair.fail_over()
        new_primary = pg_failover_pair.standby.port

        # The API, same process: it answers 503 (never 500) until its pool has reconnected, then
        # serves the job written before the failover (replication was synchronous) and takes writes.
        statuses: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            statuses.append(http.get(f"{base}/v1/jobs/before", timeout=10).status_code)
            if statuses[-1] == 200:
                break
            time.sleep(0.1)
        assert statuses[-1] == 200 and set(statuses) <= {200, 503}, statuses
        assert http.put(f"{base}/v1/jobs/after", json=doc, timeout=10).status_code == 201
        assert [http.get(f"{base}/v1/jobs/{j}", timeout=10).status_code for j in ("before", "after")] == [200, 200]
        assert api.alive()

        # A pre-pinging engine notices the dead connection and reconnects before the query.
        with pinged.connect() as conn:
            assert conn.execute(text("SELECT inet_server_port()")).scalar() == new_primary
        # Without pre-ping, the first use fails, the pool drops every old connection, the next works.
        failures = 0
        for _ in range(3):
            try:
                with unpinged.connect() as conn:
                    assert conn.execute(text("SELECT inet_server_port()")).scalar() == new_primary
                break
            except sqlalchemy.exc.OperationalError:
                failures += 1
        assert failures <= 1
        with unpinged.begin() as conn:
            conn.execute(text("CREATE TABLE written_after (x int)"))
        print(f"failover {seconds:.1f}s; API answers while reconnecting: {statuses}; unpinged failures {failures}")
    finally:
        pinged.dispose()
        unpinged.dispose()
        api.stop()
