"""A node's production parts (scheduler_node.wiring) on each Redis topology: the key-layout check,
membership, claims, throttle permits, change notifications and the maintenance lock, against a
single Redis, a 6-process Redis Cluster and a Sentinel-managed master."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from cronman.dev.embedded_redis import RedisClusterProcs, RedisSentinelProcs
from cronman.errors import ConfigError
from cronman.model.changes import Stop, encode
from cronman.redis.keys import LAYOUT_VERSION, Keys
from cronman.redis.redisconn import sync_client
from cronman.settings import Settings
from scheduler_node.node import Node
from scheduler_node.parts import ClaimResult, Ticket
from scheduler_node.wiring import production_parts
from tests.engines.conftest import cluster_settings_for, sentinel_settings_for

MODES = ["standalone", "cluster", "sentinel"]


@pytest.fixture(params=MODES)
def mode_settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """The test's settings (database, FAST timings) on the parametrised Redis topology."""
    prefix = f"w{uuid.uuid4().hex[:10]}:"
    more: dict[str, Any] = {"maintain_interval_seconds": 1.0}
    if request.param == "cluster":
        procs: RedisClusterProcs = request.getfixturevalue("shared_redis_cluster")
        redis = cluster_settings_for(procs, prefix)
    elif request.param == "sentinel":
        sentinel: RedisSentinelProcs = request.getfixturevalue("shared_redis_sentinel")
        redis = sentinel_settings_for(sentinel, prefix)
    else:
        redis = Settings(redis_url=settings.redis_url, redis_prefix=prefix)
    fields = ("redis_mode", "redis_url", "redis_sentinels", "redis_sentinel_master", "redis_sentinel_password")
    chosen = {f: getattr(redis, f) for f in fields}
    return Settings(**{**settings.model_dump(), **chosen, "redis_prefix": prefix, **more})


async def _until(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


class _Waiting:
    """As much of an execution as the throttle gate looks at."""

    def __init__(self, name: str) -> None:
        self.ticket = Ticket(0, name, name)
        self.active = True
        self.waiting_since_ms: int | None = None


def test_the_production_parts_work_on_each_topology(mode_settings: Settings) -> None:
    admin = sync_client(mode_settings)
    keys = Keys(mode_settings.redis_prefix)

    async def scenario() -> None:
        node = Node(mode_settings)
        parts = await production_parts(node)
        tasks: list[asyncio.Task[None]] = []
        try:
            assert admin.get(keys.layout) == LAYOUT_VERSION.encode()
            # membership: one hash, one script
            await parts.membership.beat({"ready": True})
            assert [m.node_id for m in await parts.membership.live()] == [mode_settings.node_id]
            # claims across every slot tag: on a cluster, one pipeline over the three shards
            tickets = [Ticket(s, f"w{s}", f"w{s}") for s in range(0, 4096, 41)]
            assert await parts.claims.claim(tickets, 2000) == [ClaimResult.WON] * len(tickets)
            # throttle permits, timed by Redis, under the policy's own tag
            gate = parts.throttle
            assert gate is not None
            gate.policies = {("ns", "p"): (1, None), ("ns", "q"): (1, None)}
            waiting = [_Waiting(f"e{i}") for i in range(3)]
            for policy, e in zip([("ns", "p"), ("ns", "p"), ("ns", "q")], waiting, strict=True):
                gate.wait(policy, e, 0)  # type: ignore[arg-type]
            assert await gate.grant(0) == [waiting[0], waiting[2]]
            await gate.renew(0)
            # change notifications: a publish from anywhere wakes the node, with what it says
            assert parts.notifications is not None
            woken = asyncio.Event()
            heard: list[bytes] = []

            def changed(message: bytes) -> None:
                heard.append(message)
                woken.set()

            tasks.append(asyncio.create_task(parts.notifications(changed)))
            await asyncio.wait_for(woken.wait(), 10)  # once subscribed (what was missed meanwhile)
            woken.clear()
            await asyncio.sleep(0.3)
            stop = encode([Stop("paused-job", 7)])
            admin.publish(keys.changes_channel, stop)
            await asyncio.wait_for(woken.wait(), 10)
            assert heard == [b"", stop]
            # the maintenance lock: one node at a time runs partition upkeep
            tasks += [asyncio.create_task(loop()) for loop in parts.extra_loops]
            holder = await _until(lambda: admin.get(keys.maintenance_lock))
            assert holder == node.holder.encode()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert parts.close is not None
            await parts.close()

    asyncio.run(scenario())


def test_a_node_of_another_key_layout_refuses_to_start(mode_settings: Settings) -> None:
    admin = sync_client(mode_settings)
    admin.set(Keys(mode_settings.redis_prefix).layout, "1")

    async def scenario() -> None:
        with pytest.raises(ConfigError, match="key layout"):
            await production_parts(Node(mode_settings))

    asyncio.run(scenario())
