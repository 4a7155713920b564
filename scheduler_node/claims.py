"""The per-execution claim in Redis, batched: one round trip per tick for any number of executions.

Key ``<prefix>x:<execution id>`` holds ``c|<node>|<attempt>|<deadline ms>`` while a node works on
the execution (renewed while in flight) and ``d|<node>|<status>|<attempt>`` once it is finished.
Both owners of a job try ``SET NX`` when it is due; the loser checks back after the deadline and
takes over if the holder vanished without finishing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from cronman.keys import lua

CHUNK = 2000  # keys per script call, so one call never blocks Redis for long


@dataclass(frozen=True, slots=True)
class CheckResult:
    state: int  # 0 done, -1 still held, 1 taken over (holder expired), 2 taken over (no record)
    value: int  # the holder's deadline (state -1) or the attempt to resume at (states 1, 2)


class ClaimStore:
    def __init__(self, client: aioredis.Redis, node_id: str, ttl_ms: int) -> None:
        self.client = client
        self.node_id = node_id
        self.mine = f"c|{node_id}|"
        self.ttl_ms = ttl_ms
        self._renew = client.register_script(lua("renew"))
        self._done = client.register_script(lua("done"))
        self._check = client.register_script(lua("check"))
        self._claim = client.register_script(lua("claim"))

    def claim_value(self, attempt: int, deadline_ms: int) -> str:
        return f"{self.mine}{attempt}|{deadline_ms}"

    async def claim(
        self, keys: Sequence[str], deadline_ms: int, now_ms: int, guards: Sequence[str] | None = None
    ) -> list[int]:
        """Try to claim each key (first attempt): 1 won, 0 lost, 2 won but skipped because the
        guard key (the job's previous execution, for overlap_policy=skip) is still in flight."""
        out: list[int] = []
        value = self.claim_value(1, deadline_ms)
        skipped = f"d|{self.node_id}|skipped|1"
        guards = guards if guards is not None else [""] * len(keys)
        for i in range(0, len(keys), CHUNK):
            args: list[str | int] = [value, self.ttl_ms, now_ms, skipped, *guards[i : i + CHUNK]]
            res = await self._claim(keys=list(keys[i : i + CHUNK]), args=args)
            out.extend(int(r) for r in res)
        return out

    async def renew(self, keys: Sequence[str], values: Sequence[str]) -> list[int]:
        """1 renewed, 2 re-claimed after the key vanished, 0 lost to another node."""
        out: list[int] = []
        for i in range(0, len(keys), CHUNK):
            ks = list(keys[i : i + CHUNK])
            res = await self._renew(keys=ks, args=[self.ttl_ms, self.mine, *values[i : i + CHUNK]])
            out.extend(int(r) for r in res)
        return out

    async def done(
        self, keys: Sequence[str], values: Sequence[str], rows: Sequence[str], unrecorded_key: str
    ) -> list[bool]:
        """Mark finished, remembering each history row ('' for none) until it is written;
        False where another node had taken the execution over."""
        out: list[bool] = []
        for i in range(0, len(keys), CHUNK):
            ks = [unrecorded_key, *keys[i : i + CHUNK]]
            args: list[str | int] = [self.ttl_ms, self.mine, *values[i : i + CHUNK], *rows[i : i + CHUNK]]
            res = await self._done(keys=ks, args=args)
            out.extend(bool(int(r)) for r in res)
        return out

    async def check(self, keys: Sequence[str], now_ms: int, deadline_ms: int) -> list[CheckResult]:
        out: list[CheckResult] = []
        for i in range(0, len(keys), CHUNK):
            ks = list(keys[i : i + CHUNK])
            flat = await self._check(keys=ks, args=[self.ttl_ms, now_ms, self.mine, deadline_ms])
            out.extend(CheckResult(int(flat[j]), int(flat[j + 1])) for j in range(0, len(flat), 2))
        return out
