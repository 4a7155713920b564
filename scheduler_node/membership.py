"""Heartbeats with a TTL, in Redis time, and the live set of nodes read from them: one hash
(tagged ``{m}``) holds every node's heartbeat with its expiry, so one script reads the cluster."""

from __future__ import annotations

import json
import secrets
from typing import Any

from redis.exceptions import RedisError

from cronman.cluster import parse_members
from cronman.errors import TransientError
from cronman.keys import Keys, lua
from scheduler_node.parts import Beat, Member, Membership


class RedisMembership(Membership):
    def __init__(self, client: Any, keys: Keys, node_id: str, ttl_seconds: float) -> None:
        self.client = client
        self.keys = keys
        self.node_id = node_id
        self.ttl_ms = int(ttl_seconds * 1000)
        self._beat = client.register_script(lua("beat"))
        self._members = client.register_script(lua("members"))

    async def beat(self, info: dict[str, Any], progress_ms: int | None = None) -> Beat:
        try:
            epoch, progress = await self._beat(
                keys=[self.keys.members, self.keys.epoch, self.keys.progress],
                args=[
                    self.node_id,
                    self.ttl_ms,
                    json.dumps(info),
                    secrets.token_hex(8),
                    "" if progress_ms is None else progress_ms,
                ],
            )
        except (RedisError, OSError) as exc:
            raise TransientError(f"redis: {type(exc).__name__}: {exc}") from exc
        epoch = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
        progress = progress.decode() if isinstance(progress, bytes) else str(progress)
        return Beat(epoch, int(progress) if progress.isdigit() else None)

    async def live(self) -> list[Member]:
        try:
            flat = await self._members(keys=[self.keys.members])
        except (RedisError, OSError) as exc:
            raise TransientError(f"redis: {type(exc).__name__}: {exc}") from exc
        return [
            Member(n.node_id, n.heartbeat_age_seconds, bool(n.info.get("ready")), n.info) for n in parse_members(flat)
        ]

    async def leave(self) -> None:
        try:
            await self.client.hdel(self.keys.members, self.node_id)
        except (RedisError, OSError) as exc:
            raise TransientError(f"redis: {type(exc).__name__}: {exc}") from exc
