"""Shared fixtures: a real PostgreSQL, Redis and SQS endpoint, started by the suite itself unless
CRONMAN_TEST_DATABASE_URL / CRONMAN_TEST_REDIS_URL point at existing ones.

Each test gets clean state: its own database (a copy of a migrated template) and its own Redis
key prefix.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from pydantic import SecretStr

from cronman.dev.embedded import EmbeddedPostgres, EmbeddedRedis, LocalSqs
from cronman.settings import Settings
from tests.timings import FAST, Timings

TEMPLATE_DB = "cronman_template"

# How `make test` shares the machine (see scripts/run-tests). Tests that need both cores to themselves
# (the benches, a node driven at its limit, loads timed against the clock) are marked ``solo`` and run
# after the rest, one at a time. Tests that start several node processes run in parallel with the light
# tests, but never more than two of them at once: each file goes to one of two groups, and each group runs
# on one worker. Tests that are CPU work and nothing else (the simulation: its clock is virtual, so no
# bound in it depends on how fast the machine is) are marked ``background``: they run beside both
# passes at the idle scheduling class, on whatever CPU the others leave, and so take none from them.
BACKGROUND = {
    "tests/sim/test_sim.py",
    # cron against cronsim and Quartz: some 50 s of CPU and no clock in it
    "tests/unit/test_cron_differential.py",
}
SOLO = {
    "tests/faults/test_fuzz_node.py",
    "tests/bench/test_bench_smoke.py",
    "tests/bench/test_bench_yardsticks.py",
    "tests/engines/test_ownership_bench.py",
    "tests/ui/test_bench_ui.py",
    # firing at a fixed rate through a Redis or PostgreSQL failover, with lag bounds: beside the
    # parallel pass it missed occurrences only because they arrived after its window closed
    "tests/engines/test_failover_under_load.py",
    # a load paced by a slowed link against a grace of 2 s: heartbeats late on a busy machine would
    # make the node look stalled
    "tests/cluster/test_slow_load.py",
    # a failover's worst lag bounded by two leases and 2 s: beside the parallel pass the whole
    # cluster ran seconds late (lag p99 6.7 s over the whole window) and the bound failed twice
    "tests/cluster/test_node_loss.py",
    # a namespace at its quotas beside 200 per-second jobs whose lag p99 is bounded by 100 ms: beside
    # the parallel pass (load average 10-13 on two cores) one run measured 108 ms (47 ms in the same
    # run before the neighbour came), another 78 ms (113 ms before): the machine's load, not the neighbour
    "tests/fleet/test_noisy_neighbour.py",
    # incidents at the shipped timings, their worst lag bounded by lease + 2 heartbeats + 2 s
    "tests/cluster/test_incidents_at_defaults.py",
    # bursts of 500 deliveries a second against a lag bound of 1 s: a receiver in the test's own
    # process and a node at the shipped defaults, both timed against the clock
    "tests/cluster/test_host_connections.py",
}
# Two groups of about equal length (the durations of `make test`, 2026-11-24: about 355 s and
# 375 s of test time): each is one worker's queue.
PROCESS_GROUPS = {
    "tests/cluster/test_claims.py": "processes-a",
    "tests/cluster/test_redis_restart.py": "processes-a",
    "tests/cluster/test_rolling_restart.py": "processes-a",
    "tests/cluster/test_standby.py": "processes-a",
    "tests/cluster/test_stop.py": "processes-a",
    "tests/faults/test_outages.py": "processes-b",
    "tests/fleet/test_fleet_processes.py": "processes-b",
    "tests/cluster/test_backfill.py": "processes-b",
    "tests/cluster/test_membership.py": "processes-b",
    "tests/cluster/test_partition.py": "processes-b",
    "tests/cluster/test_power_cut.py": "processes-b",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "timings(t): the node timings the test runs with, a tests.timings.Timings (DEFAULTS or FAST); "
        "required with cluster",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        rel = Path(str(item.path)).relative_to(root).as_posix()
        if rel in BACKGROUND:
            item.add_marker(pytest.mark.background)
        elif rel in SOLO:
            item.add_marker(pytest.mark.solo)
        elif item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.xdist_group(PROCESS_GROUPS.get(rel, "processes-b")))


ADMIN_KEY = "test-admin-key-not-a-secret"


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cronman-test-"))
    path.chmod(0o755)  # the embedded PostgreSQL runs unprivileged when the suite runs as root
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_url(workdir: Path) -> Iterator[str]:
    """URL of a maintenance database on the test server (``postgres``)."""
    given = os.environ.get("CRONMAN_TEST_DATABASE_URL")
    if given:
        yield given
        return
    server = EmbeddedPostgres(workdir / "pg" / "data", durable=False, log=workdir / "pg-test.log")
    server.start()
    yield server.url("postgres")
    server.stop()


def _admin(url: str):  # type: ignore[no-untyped-def]
    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def template_url(pg_admin_url: str) -> str:
    from datetime import UTC, datetime

    from cronman.store.migrate import run_maintenance, upgrade
    from cronman.store.store import make_engine

    name = f"{TEMPLATE_DB}_{uuid.uuid4().hex[:8]}"
    conn = _admin(pg_admin_url)
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    url = _with_db(pg_admin_url, name)
    upgrade(url)
    engine = make_engine(url, pool_size=1)
    run_maintenance(engine, datetime.now(UTC).date(), 45, 7)
    engine.dispose()
    return url


@pytest.fixture
def database_url(pg_admin_url: str, template_url: str) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    template = template_url.rpartition("/")[2]
    conn = _admin(pg_admin_url)
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    yield _with_db(pg_admin_url, name)
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


@pytest.fixture(scope="session")
def redis_server_url(workdir: Path) -> Iterator[str]:
    given = os.environ.get("CRONMAN_TEST_REDIS_URL")
    if given:
        yield given
        return
    server = EmbeddedRedis(workdir / "redis", persist=False)
    server.start()
    yield server.url()
    server.stop()


@pytest.fixture
def redis_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture(scope="session")
def sqs_endpoint(workdir: Path) -> Iterator[str]:
    server = LocalSqs(log=workdir / "sqs.log")
    server.start()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    yield server.url
    server.stop()


# Not timings: every test's nodes take a free port for health and metrics, and may call back to
# the loopback receivers of the tests.
HARNESS: dict[str, Any] = {"node_port": 0, "dev_mode": True}


@pytest.fixture
def timings(request: pytest.FixtureRequest) -> Timings:
    """The timings the test names with ``@pytest.mark.timings(...)`` (tests/timings.py); FAST
    when it names none, except for a test marked ``cluster``, which must name them."""
    marker = request.node.get_closest_marker("timings")
    if marker is not None:
        chosen = marker.args[0]
        assert isinstance(chosen, Timings), f"pytest.mark.timings takes a tests.timings.Timings, not {chosen!r}"
        return chosen
    if request.node.get_closest_marker("cluster") is not None:
        pytest.fail(
            "a cluster test names the timings it runs: @pytest.mark.timings(DEFAULTS) for an incident at the "
            "shipped timings, @pytest.mark.timings(FAST) for mechanics (see tests/timings.py)",
            pytrace=False,
        )
    return FAST


@pytest.fixture
def settings(database_url: str, redis_server_url: str, redis_prefix: str, timings: Timings) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_server_url,
        redis_prefix=redis_prefix,
        node_id="node-a",
        api_key=ADMIN_KEY,
        **HARNESS,
        **timings.values,
    )


@pytest.fixture
def settings_env(settings: Settings) -> dict[str, str]:
    """The same settings as environment variables, for child processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONMAN_")}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[f"CRONMAN_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env
