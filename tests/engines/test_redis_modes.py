"""The one Redis connection factory (cronman.redis.redisconn) against real topologies: a password- and
TLS-protected server, a 6-process Redis Cluster and a Sentinel setup, each losing its primary."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from cronman.dev.embedded import EmbeddedRedis
from cronman.dev.embedded_redis import RedisClusterProcs, RedisSentinelProcs
from cronman.model.changes import Stop, decode
from cronman.redis.redisconn import AsyncRedis, RedisMode, SyncRedis, async_client, sync_client, topology
from cronman.settings import Settings
from tests.clients import job, keyed, send
from tests.conftest import ADMIN_KEY
from tests.engines.tlsproxy import TlsProxy, self_signed

# Every key a call touches is declared and shares one hash tag, so it runs on a Redis Cluster.
SCRIPT = """
local n = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return n
"""
KEYS = ["{s7}:count", "{s7}:log"]


# ---- settings ----


@pytest.mark.parametrize(
    ("given", "described", "options"),
    [
        ({}, "redis standalone 127.0.0.1:6379", {"db": 0, "ssl": False}),
        (
            {"redis_url": "rediss://u:p%2Cw@h:6380/2?ssl_ca_certs=/ca.pem"},
            "redis standalone tls h:6380",
            {"username": "u", "password": "p,w", "db": 2, "ssl": True, "ssl_ca_certs": "/ca.pem"},
        ),
        (
            {"redis_mode": "cluster", "redis_url": "redis://:pw@a:7000, redis://b:7001", "redis_password": "other"},
            "redis cluster a:7000,b:7001",
            {"password": "other", "ssl": False},
        ),
        (
            {
                "redis_mode": "sentinel",
                "redis_url": "rediss://:pw@mymaster/1",
                "redis_sentinels": "s1:26379, s2, [::1]:26380",
                "redis_sentinel_master": "mymaster",
                "redis_sentinel_password": "spw",
            },
            "redis sentinel tls s1:26379,s2:26379,::1:26380 master=mymaster",
            {"password": "pw", "db": 1, "ssl": True},
        ),
    ],
)
def test_topology_reads_each_mode(given: dict[str, Any], described: str, options: dict[str, Any]) -> None:
    t = topology(Settings(**given))
    assert t.describe() == described
    assert dict(t.options) == options
    assert "pw" not in t.describe() and "spw" not in t.describe()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"redis_url": "redis://a:1,redis://b:2"}, "CRONMAN_REDIS_MODE=cluster"),
        ({"redis_url": "http://a:1"}, "CRONMAN_REDIS_URL"),
        ({"redis_mode": "cluster", "redis_url": "redis://a:1/3"}, "only database 0"),
        ({"redis_mode": "cluster", "redis_url": "redis://a:1,rediss://b:2"}, "mix"),
        ({"redis_mode": "sentinel", "redis_sentinel_master": "m"}, "CRONMAN_REDIS_SENTINELS"),
        ({"redis_mode": "sentinel", "redis_sentinels": "s:x", "redis_sentinel_master": "m"}, "host:port"),
        ({"redis_mode": "sentinel", "redis_sentinels": "s:1"}, "CRONMAN_REDIS_SENTINEL_MASTER"),
        ({"redis_mode": "ring"}, "redis_mode"),
        ({"redis_mode": "cluster", "redis_url": "redis://a:1, redis://u:k@/0"}, "seed 2 (redis://***@/0) names no"),
        ({"redis_mode": "cluster", "redis_url": "redis://a:1, redis:///0?password=k"}, "seed 2 (redis:///0?***)"),
    ],
)
def test_bad_redis_settings_fail_at_start_with_the_setting_named(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(**given, api_key="k" * 20)
    assert message in str(info.value)
    assert "k" * 20 not in str(info.value)  # settings errors never print what they were given
    assert ":k@" not in str(info.value) and "password=k" not in str(info.value)  # nor a URL's password


def test_the_mode_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONMAN_REDIS_MODE", "sentinel")
    monkeypatch.setenv("CRONMAN_REDIS_SENTINELS", "a:1,b:2")
    monkeypatch.setenv("CRONMAN_REDIS_SENTINEL_MASTER", "m")
    monkeypatch.setenv("CRONMAN_REDIS_SENTINEL_PASSWORD", "s3")
    s = Settings()
    assert s.redis_mode is RedisMode.SENTINEL and topology(s).sentinel_password == "s3"


def test_tls_options_reach_the_cluster_and_sentinel_connections() -> None:
    """No TLS-enabled Redis Cluster or Sentinel runs here (the bundled redis-server is built
    without TLS); the standalone test below shows a real handshake. This shows the same options
    reach the connection classes of the other modes."""
    url = "rediss://:pw@m:1/0?ssl_ca_certs=/ca.pem"
    acluster = async_client(Settings(redis_mode="cluster", redis_url=url))
    assert acluster.connection_kwargs["connection_class"].__name__ == "SSLConnection"
    assert acluster.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
    sentinel_settings = Settings(redis_mode="sentinel", redis_url=url, redis_sentinels="s:1", redis_sentinel_master="m")
    for client in (sync_client(sentinel_settings), async_client(sentinel_settings)):
        pool = client.connection_pool
        assert pool.connection_class.__name__ == "SentinelManagedSSLConnection"
        assert pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
        sentinel_kwargs = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
        assert sentinel_kwargs["ssl_ca_certs"] == "/ca.pem"


# ---- standalone: password and TLS ----


def test_standalone_with_password_and_tls(workdir: Path, tmp_path: Path) -> None:
    server = EmbeddedRedis(workdir / f"redis-tls-{tmp_path.name}", persist=False)
    server.start()
    try:
        redis.Redis(port=server.port).config_set("requirepass", "s3cret")
        cert, key = self_signed(tmp_path)
        with TlsProxy(server.port, cert, key) as proxy:
            url = f"rediss://127.0.0.1:{proxy.port}/0?ssl_ca_certs={cert}"
            good = Settings(redis_url=url, redis_password="s3cret")
            client = sync_client(good)
            client.set("tls-key", "v")
            assert client.get("tls-key") == b"v"

            async def roundtrip() -> bytes | None:
                aclient = async_client(good)
                try:
                    return await aclient.get("tls-key")
                finally:
                    await aclient.aclose()

            assert asyncio.run(roundtrip()) == b"v"
            assert proxy.handshakes >= 2
            with pytest.raises(redis.AuthenticationError):
                sync_client(Settings(redis_url=url, redis_password="wrong")).ping()
            with pytest.raises(redis.ConnectionError):  # the certificate is not trusted without the CA
                sync_client(Settings(redis_url=f"rediss://127.0.0.1:{proxy.port}/0", redis_password="s3cret")).ping()
    finally:
        server.stop()


# ---- failover ----


def _until_ok(call: Callable[[], Any], timeout: float, errors: list[str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except redis.RedisError as exc:  # the factory's clients raise redis-py's errors only
            errors.append(type(exc).__name__)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def _async_until_ok(call: Callable[[], Any], timeout: float, errors: list[str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except redis.RedisError as exc:
            errors.append(type(exc).__name__)
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def _survives_failover(
    sync: SyncRedis, make_async: Callable[[], AsyncRedis], replicate: Callable[[], Any], kill: Callable[[], int]
) -> dict[str, Any]:
    """Both clients run the script before and after the primary dies; returns what happened."""

    async def scenario() -> dict[str, Any]:
        aclient = make_async()
        sync_script, async_script = sync.register_script(SCRIPT), aclient.register_script(SCRIPT)
        try:
            before = [sync_script(keys=KEYS, args=[f"sync-{i}"]) for i in range(3)]
            before += [await async_script(keys=KEYS, args=[f"async-{i}"]) for i in range(3)]
            await asyncio.to_thread(replicate)
            killed_at = time.monotonic()
            await asyncio.to_thread(kill)
            sync_errors: list[str] = []
            async_errors: list[str] = []
            after_sync = await asyncio.to_thread(
                _until_ok, lambda: sync_script(keys=KEYS, args=["sync-after"]), 30, sync_errors
            )
            after_async = await _async_until_ok(lambda: async_script(keys=KEYS, args=["async-after"]), 30, async_errors)
            log = [x.decode() for x in sync.lrange(KEYS[1], 0, -1)]
            return {
                "before": before,
                "after": [after_sync, after_async],
                "log": log,
                "seconds": time.monotonic() - killed_at,
                "errors": sync_errors + async_errors,
            }
        finally:
            await aclient.aclose()

    return asyncio.run(scenario())


def _assert_nothing_lost(outcome: dict[str, Any]) -> None:
    assert outcome["before"] == [1, 2, 3, 4, 5, 6]
    # The counter carries on from the replica's copy: nothing written before the kill was lost.
    assert outcome["after"] == [7, 8], outcome
    assert outcome["log"] == [*(f"sync-{i}" for i in range(3)), *(f"async-{i}" for i in range(3))] + [
        "sync-after",
        "async-after",
    ]


def test_cluster_clients_run_a_tagged_script_across_a_primary_failover(
    redis_cluster: RedisClusterProcs, cluster_settings: Settings
) -> None:
    sync = sync_client(cluster_settings)
    # Keys of other tags live on other primaries: the cluster is really in use.
    for i in range(30):
        sync.set(f"{{s{i}}}:probe", i)
    assert len({redis_cluster.primary_of(f"{{s{i}}}:probe") for i in range(30)}) == 3
    state: dict[str, int] = {}

    def kill() -> int:
        state["killed"] = redis_cluster.kill_primary_of(KEYS[0])
        return state["killed"]

    outcome = _survives_failover(
        sync,
        lambda: async_client(cluster_settings),
        lambda: redis_cluster.client(redis_cluster.primary_of(KEYS[0])).wait(1, 2000),
        kill,
    )
    _assert_nothing_lost(outcome)
    new_primary = redis_cluster.wait_for_failover(state["killed"])
    assert new_primary != state["killed"] and redis_cluster.primary_of(KEYS[0]) == new_primary
    assert outcome["seconds"] < 20, outcome
    print(f"cluster failover: first success {outcome['seconds']:.1f}s after the kill; errors {outcome['errors']}")


def test_sentinel_clients_run_a_script_across_a_master_failover(
    redis_sentinel: RedisSentinelProcs, sentinel_settings: Settings
) -> None:
    sync = sync_client(sentinel_settings)
    state: dict[str, int] = {}

    def kill() -> int:
        state["killed"] = redis_sentinel.kill_master()
        return state["killed"]

    outcome = _survives_failover(
        sync,
        lambda: async_client(sentinel_settings),
        lambda: redis_sentinel.client(redis_sentinel.master_port()).wait(1, 2000),
        kill,
    )
    _assert_nothing_lost(outcome)
    assert redis_sentinel.wait_for_failover(state["killed"]) != state["killed"]
    assert outcome["seconds"] < 20, outcome
    print(f"sentinel failover: first success {outcome['seconds']:.1f}s after the kill; errors {outcome['errors']}")


def test_sentinel_password_is_required_by_the_sentinels(redis_sentinel: RedisSentinelProcs) -> None:
    settings = Settings(
        redis_mode="sentinel",
        redis_url="redis://:data-pass-not-a-secret@x/0",
        redis_sentinels=",".join(redis_sentinel.sentinels),
        redis_sentinel_master=redis_sentinel.master_name,
    )
    with pytest.raises(redis.ConnectionError):  # MasterNotFoundError: no sentinel would answer
        sync_client(settings).ping()


# ---- the API on each topology ----


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
def test_the_api_uses_the_configured_topology(mode: str, request: pytest.FixtureRequest, database_url: str) -> None:
    from api import create_app

    base: Settings = request.getfixturevalue(f"{mode}_settings")
    settings = Settings(**{**base.model_dump(), "database_url": database_url, "api_key": ADMIN_KEY})
    client = keyed(create_app(settings), ADMIN_KEY)
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["checks"]["redis"] == "ok", ready.get_json()
    listener = sync_client(settings).pubsub()
    from cronman.redis.keys import Keys

    listener.subscribe(Keys(settings.redis_prefix).changes_channel)
    assert listener.get_message(timeout=2)["type"] == "subscribe"
    assert send(client, "POST", "/v1/jobs", job(f"on-{mode}")).status_code == 201
    deadline = time.monotonic() + 5
    message = None
    while message is None and time.monotonic() < deadline:
        message = listener.get_message(timeout=0.5)
    assert message is not None and message["type"] == "message", "the change notification reached subscribers"
    # a pause names the job in its notification, whatever the topology (cronman.model.changes)
    paused = send(client, "POST", f"/v1/jobs/on-{mode}/pause").get_json()
    told: list[Stop] = []
    while not told and time.monotonic() < deadline + 5:
        message = listener.get_message(timeout=0.5)
        told = decode(message["data"]) if message is not None else []
    assert told == [Stop(f"on-{mode}", paused["version"])]
    listener.close()


def test_a_cluster_node_whose_port_is_taken_starts_on_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process may bind a chosen port between the check and the server's own bind (parallel
    tests choose at random too); the cluster still starts, on other ports."""
    import socket

    import cronman.dev.embedded_redis as embedded_redis

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    chosen = iter([port])
    real = embedded_redis.cluster_port
    monkeypatch.setattr(embedded_redis, "cluster_port", lambda: next(chosen, None) or real())
    procs = RedisClusterProcs(tmp_path, primaries=3, replicas=0)
    try:
        procs.start(timeout=30)
        assert port not in procs.ports and len(procs.ports) == 3
        assert procs.client(procs.ports[0]).cluster("info")["cluster_state"] == "ok"
    finally:
        procs.stop()
        taken.close()
