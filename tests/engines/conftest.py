"""Highly available engines, real processes on loopback: a PostgreSQL primary with a streaming
standby, a 6-process Redis Cluster and a Redis Sentinel setup.

Fixtures (function-scoped: each test gets its own servers, and may break them):

- ``pg_failover_pair`` -> :class:`PgFailoverPair`: ``.url`` is the multi-host libpq URL
  (``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/cronman?target_session_attrs=read-write``) of a
  migrated database; ``.fail_over()`` SIGKILLs the primary, promotes the standby and returns once
  the URL gives a writable connection again. Replication is synchronous, so a commit that returned
  before the kill is on the new primary.
- ``redis_cluster`` -> :class:`cronman.dev.embedded_redis.RedisClusterProcs` (3 primaries, 3 replicas,
  password ``CLUSTER_PASSWORD``); ``.seed_urls``, ``.kill_primary_of(key)``, ``.wait_for_failover()``.
- ``redis_sentinel`` -> :class:`cronman.dev.embedded_redis.RedisSentinelProcs` (master, replica, 3
  sentinels; passwords for the data nodes and for the sentinels); ``.sentinels``, ``.master_name``,
  ``.kill_master()``, ``.wait_for_failover()``.
- ``*_settings`` fixtures: :class:`cronman.settings.Settings` for each Redis mode.
- ``shared_redis_cluster`` and ``shared_redis_sentinel``: the same setups, one per test module, for
  tests that do not break them (each uses its own key prefix); ``cluster_settings_for`` and
  ``sentinel_settings_for`` build the settings for either kind.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from cronman.dev.embedded import EmbeddedPostgres
from cronman.dev.embedded_redis import RedisClusterProcs, RedisSentinelProcs
from cronman.settings import Settings

CLUSTER_PASSWORD = "cluster-pass-not-a-secret"
SENTINEL_DATA_PASSWORD = "data-pass-not-a-secret"
SENTINEL_PASSWORD = "sentinel-pass-not-a-secret"


@dataclass
class PgFailoverPair:
    primary: EmbeddedPostgres
    standby: EmbeddedPostgres
    database: str = "cronman"

    @property
    def url(self) -> str:
        """Both servers, primary first; libpq keeps whichever accepts writes."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{self.database}?target_session_attrs=read-write&connect_timeout=2"

    def writable(self) -> bool:
        try:
            conn = psycopg2.connect(self.url, connect_timeout=2)
        except psycopg2.OperationalError:
            return False
        conn.close()
        return True

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and its backends (a crash, nothing flushed or said)."""
        self.primary.kill()

    def promote(self, timeout: float = 30.0) -> None:
        self.standby.promote(timeout)

    def fail_over(self, timeout: float = 30.0) -> float:
        """Kill the primary, promote the standby, wait until the URL is writable; seconds taken."""
        started = time.monotonic()
        self.kill_primary()
        self.promote(timeout)
        deadline = started + timeout
        while not self.writable():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.url} not writable {timeout}s after the failover")
            time.sleep(0.05)
        return time.monotonic() - started


@pytest.fixture
def pg_failover_pair(workdir: Path) -> Iterator[PgFailoverPair]:
    from cronman.store.migrate import run_maintenance, upgrade
    from cronman.store.store import make_engine

    base = workdir / f"pgpair-{uuid.uuid4().hex[:8]}"
    # fsync stays off (a SIGKILL loses nothing the kernel holds), but commits wait for the standby
    # once it is named below; a command-line setting wins over ALTER SYSTEM, hence this one here.
    primary = EmbeddedPostgres(
        base / "primary", durable=False, log=base / "primary.log", settings={"synchronous_commit": "on"}
    )
    standby: EmbeddedPostgres | None = None
    try:
        primary.start()
        standby = primary.make_standby(base / "standby", log=base / "standby.log")
        standby.start()
        # Synchronous from now on: a commit returns once the standby has flushed its WAL.
        conn = psycopg2.connect(primary.url("postgres"))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            cur.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while True:
                cur.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                if (cur.fetchone() or (0,))[0] == 1:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby did not become synchronous")
                time.sleep(0.05)
        conn.close()
        pair = PgFailoverPair(primary, standby)
        upgrade(pair.url)
        engine = make_engine(pair.url, pool_size=1)
        run_maintenance(engine, datetime.now(UTC).date(), 45, 7)
        engine.dispose()
        yield pair
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


# ---- Redis ----


def _cluster(workdir: Path) -> RedisClusterProcs:
    return RedisClusterProcs(workdir / f"rcluster-{uuid.uuid4().hex[:8]}", password=CLUSTER_PASSWORD)


def _sentinel(workdir: Path) -> RedisSentinelProcs:
    return RedisSentinelProcs(
        workdir / f"rsentinel-{uuid.uuid4().hex[:8]}",
        password=SENTINEL_DATA_PASSWORD,
        sentinel_password=SENTINEL_PASSWORD,
    )


def _running(procs: RedisClusterProcs | RedisSentinelProcs) -> Iterator[Any]:
    try:
        procs.start()
        yield procs
    finally:
        procs.stop()


@pytest.fixture
def redis_cluster(workdir: Path) -> Iterator[RedisClusterProcs]:
    yield from _running(_cluster(workdir))


@pytest.fixture
def redis_sentinel(workdir: Path) -> Iterator[RedisSentinelProcs]:
    yield from _running(_sentinel(workdir))


@pytest.fixture(scope="module")
def shared_redis_cluster(workdir: Path) -> Iterator[RedisClusterProcs]:
    yield from _running(_cluster(workdir))


@pytest.fixture(scope="module")
def shared_redis_sentinel(workdir: Path) -> Iterator[RedisSentinelProcs]:
    yield from _running(_sentinel(workdir))


def cluster_settings_for(procs: RedisClusterProcs, prefix: str = "t:", **more: Any) -> Settings:
    return Settings(redis_mode="cluster", redis_url=",".join(procs.seed_urls()), redis_prefix=prefix, **more)


def sentinel_settings_for(procs: RedisSentinelProcs, prefix: str = "t:", **more: Any) -> Settings:
    return Settings(
        redis_mode="sentinel",
        redis_url=f"redis://:{SENTINEL_DATA_PASSWORD}@{procs.master_name}/0",
        redis_sentinels=",".join(procs.sentinels),
        redis_sentinel_master=procs.master_name,
        redis_sentinel_password=SENTINEL_PASSWORD,
        redis_prefix=prefix,
        **more,
    )


@pytest.fixture
def cluster_settings(redis_cluster: RedisClusterProcs) -> Settings:
    return cluster_settings_for(redis_cluster)


@pytest.fixture
def sentinel_settings(redis_sentinel: RedisSentinelProcs) -> Settings:
    return sentinel_settings_for(redis_sentinel)
