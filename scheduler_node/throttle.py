"""Throttle policies: a named limit on deliveries in flight (and optionally per second) shared by
every job of a namespace that names it, across the whole cluster.

Executions that need a permit wait in a queue per policy, oldest first; each timer pass asks
Redis for permits for every waiting queue: one script call per policy, all in one round trip
(on a Redis Cluster each policy's keys share the policy's hash tag, so each call runs on one shard). A rate limit spaces
permits evenly (a generic cell rate algorithm), so a burst is staggered rather than clumped. Nothing is dropped: an
execution waits until it gets a permit, and its history row records how long it waited. Permits
are leases (renewed while the delivery is in flight), so a node that dies frees its permits. Lease
deadlines and rate slots are Redis's time, never a node's clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from cronman.errors import TransientError
from cronman.redis.keys import Keys, lua
from cronman.redis.scripts import Script

if TYPE_CHECKING:
    from scheduler_node.execution import Execution

PolicyKey = tuple[str, str]  # (namespace, name)
_MAX_ASK = 1000
_AHEAD_MS = 50  # a rate-limited permit may start this much before its slot (about one timer pass)


class ThrottleGate:
    def __init__(self, client: Any, keys: Keys, lease_ms: int) -> None:
        self.client = client
        self.keys = keys
        self.lease_ms = lease_ms
        self.policies: dict[PolicyKey, tuple[int, float | None]] = {}
        self.waiting: dict[PolicyKey, deque[Execution]] = {}
        self.held: dict[str, PolicyKey] = {}  # permit member (execution key) -> policy
        self._released: list[tuple[PolicyKey, str]] = []
        self._grant = Script(client, lua("throttle"))
        self._renew = Script(client, lua("permits"))

    def policy_of(self, e: Execution) -> PolicyKey | None:
        name = e.job.opts.throttle
        if name is None:
            return None
        key = (e.job.namespace, name)
        return key if key in self.policies else None

    def wait(self, policy: PolicyKey, e: Execution, now_ms: int) -> None:
        if e.waiting_since_ms is None:
            e.waiting_since_ms = now_ms
        self.waiting.setdefault(policy, deque()).append(e)

    def waiting_count(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def _holders(self, p: PolicyKey) -> str:
        return self.keys.throttle(p[0], p[1])

    async def grant(self, now_ms: int) -> list[Execution]:
        """Free released permits, then hand out what is available; returns the executions granted.
        (``now_ms`` is the node's clock, unused: permits are timed by Redis.)"""
        await self._flush_releases()
        granted: list[Execution] = []
        asked: list[tuple[PolicyKey, list[str]]] = []
        calls = []
        for p, queue in list(self.waiting.items()):
            while queue and not queue[0].active:
                queue.popleft()
            if not queue:
                del self.waiting[p]
                continue
            max_in_flight, per_second = self.policies.get(p, (0, None))
            if max_in_flight <= 0:  # the policy was removed: no limit any more
                granted.extend(queue)
                del self.waiting[p]
                continue
            interval = 1000.0 / per_second if per_second else 0
            # Ask for no more than one call can grant (at most max_in_flight, and under a rate limit
            # the permits due within _AHEAD_MS): a deep queue behind a saturated policy would
            # otherwise send a thousand names to Redis at every timer pass.
            ask = min(len(queue), _MAX_ASK, max_in_flight)
            if interval:
                ask = min(ask, int(_AHEAD_MS / interval) + 2)  # (+1: rounding)
            members = [queue[i].ticket.name for i in range(ask)]
            asked.append((p, members))
            calls.append(
                (
                    [self._holders(p), self.keys.throttle_tat(*p)],
                    [self.lease_ms, max_in_flight, interval, _AHEAD_MS, *members],
                )
            )
        if not calls:
            return granted
        for (p, members), n in zip(asked, await self._grant.many(calls), strict=True):
            won = set(members[: int(n)])
            now_waiting = self.waiting.get(p)
            while now_waiting and now_waiting[0].ticket.name in won:
                e = now_waiting.popleft()
                won.discard(e.ticket.name)
                self.held[e.ticket.name] = p
                granted.append(e)
            self._released.extend((p, m) for m in won)  # no longer waiting here: give the permit back
        return granted

    def release(self, e: Execution) -> bool:
        """Give back the execution's permit, if it holds one (freed in Redis on the next pass)."""
        p = self.held.pop(e.ticket.name, None)
        if p is None:
            return False
        self._released.append((p, e.ticket.name))
        return True

    def forget(self, keep: Callable[[Execution], bool]) -> list[Execution]:
        """Take waiting executions out (a handover), keeping those ``keep`` says to keep."""
        out: list[Execution] = []
        for p in list(self.waiting):
            queue = self.waiting[p]
            out.extend(e for e in queue if not keep(e))
            rest = deque(e for e in queue if keep(e))
            if rest:
                self.waiting[p] = rest
            else:
                del self.waiting[p]
        return out

    async def _flush_releases(self) -> None:
        if not self._released:
            return
        batch, self._released = self._released, []
        by_policy: dict[PolicyKey, list[str]] = {}
        for p, member in batch:
            by_policy.setdefault(p, []).append(member)
        pipe = self.client.pipeline(transaction=False)
        for p, members in by_policy.items():
            pipe.zrem(self._holders(p), *members)
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            self._released[:0] = batch
            raise TransientError(f"redis: {type(exc).__name__}: {exc}") from exc

    async def renew(self, now_ms: int) -> None:
        """Extend the leases of permits held by deliveries still in flight (in Redis time;
        ``now_ms`` is unused)."""
        if not self.held:
            return
        by_policy: dict[PolicyKey, list[str]] = {}
        for member, p in self.held.items():
            by_policy.setdefault(p, []).append(member)
        await self._renew.many(
            [
                ([self._holders(p)], [self.lease_ms, *members[i : i + _MAX_ASK]])
                for p, members in by_policy.items()
                for i in range(0, len(members), _MAX_ASK)
            ]
        )
