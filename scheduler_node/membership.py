"""Heartbeats with a TTL, in Redis time, and the live set of nodes read from them: one hash
(tagged ``{m}``) holds every node's heartbeat with its expiry, so one script on one shard reads
the cluster, whatever the Redis topology."""

from __future__ import annotations

import json
import secrets
from typing import Any

from redis.exceptions import RedisError

from cronman.errors import TransientError
from cronman.redis.cluster import parse_members
from cronman.redis.keys import Keys, lua
from cronman.redis.scripts import Script
from scheduler_node.parts import Beat, Member, Membership


class RedisMembership(Membership):
    def __init__(self, client: Any, keys: Keys, node_id: str, ttl_seconds: float) -> None:
        self.client = client
        self.keys = keys
        self.node_id = node_id
        self.ttl_ms = int(ttl_seconds * 1000)
        self._beat = Script(client, lua("beat"))
        self._members = Script(client, lua("members"))

    async def beat(self, info: dict[str, Any], progress_ms: int | None = None) -> Beat:
        epoch, progress = await self._beat(
            [self.keys.members, self.keys.epoch, self.keys.progress],
            [
                self.node_id,
                self.ttl_ms,
                json.dumps(info),
                secrets.token_hex(8),
                "" if progress_ms is None else progress_ms,
            ],
        )
        epoch = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
        progress = progress.decode() if isinstance(progress, bytes) else str(progress)
        return Beat(epoch, int(progress) if progress.isdigit() else None)

    async def live(self) -> list[Member]:
        flat = await self._members([self.keys.members])
        return [
            Member(n.node_id, n.heartbeat_age_seconds, bool(n.info.get("ready")), n.info) for n in parse_members(flat)
        ]

    async def leave(self) -> None:
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hdel(self.keys.members, self.node_id)
                pipe.hdel(self.keys.standings, self.node_id)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise TransientError(f"redis: {type(exc).__name__}: {exc}") from exc

    async def stand(self, standing: str | None) -> dict[str, str]:
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                if standing is None:
                    pipe.hdel(self.keys.standings, self.node_id)
                else:
                    pipe.hset(self.keys.standings, self.node_id, standing)
                pipe.hgetall(self.keys.standings)
                *_, everyone = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise TransientError(f"redis: {type(exc).__name__}: {exc}") from exc
        return {_str(k): _str(v) for k, v in everyone.items()}


def overdue(members: list[Member], me: str, after_s: float, reached_for_s: float) -> frozenset[str]:
    """The members whose heartbeat is overdue (older than ``after_s``): ownership routes around
    them at once instead of waiting for their heartbeat's TTL (a node killed, its heartbeat living
    on 30 s, and the other owner of its slots gone too: nobody fired them for that long). Judged
    only once this node has read the live set for ``after_s`` without a failure (``reached_for_s``):
    Redis away makes every heartbeat old at once, and the nodes beat again within an interval of
    its return. A node is never overdue to itself."""
    if reached_for_s < after_s:
        return frozenset()
    return frozenset(m.node_id for m in members if m.age_s > after_s and m.node_id != me)


def _str(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
