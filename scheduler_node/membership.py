"""Heartbeats with a TTL, and the live set of nodes read from them."""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from cronman.cluster import NodeInfo, parse_members
from cronman.keys import Keys, lua


class Membership:
    def __init__(self, client: aioredis.Redis, keys: Keys, node_id: str, ttl_seconds: float) -> None:
        self.client = client
        self.keys = keys
        self.node_id = node_id
        self.ttl_ms = int(ttl_seconds * 1000)
        self._members = client.register_script(lua("members"))
        self.last_beat: float | None = None

    async def beat(self, info: dict[str, Any]) -> None:
        now = time.time()
        value = json.dumps({**info, "ts": now})
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.heartbeat(self.node_id), value, px=self.ttl_ms)
        pipe.sadd(self.keys.members, self.node_id)
        await pipe.execute()
        self.last_beat = now

    async def live(self) -> list[NodeInfo]:
        flat = await self._members(keys=[self.keys.members], args=[self.keys.heartbeat_prefix])
        return parse_members(list(flat), time.time())

    async def leave(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.keys.heartbeat(self.node_id))
        pipe.srem(self.keys.members, self.node_id)
        await pipe.execute()
