"""The claim protocol in Redis: the Lua scripts beside this file, loaded once, called for a whole
batch at a time (:class:`cronman.redis.scripts.Script`). Keys are hash-tagged by the job's slot, and
every key a script touches is one of its KEYS, so one call's keys always share a Redis Cluster
slot. With ``sharded`` (a Redis Cluster) a batch becomes one call per slot tag, all in one
non-transactional pipeline that redis-py splits by shard; a standalone Redis or a Sentinel-managed
primary takes up to ``CHUNK`` executions per call. Deadlines are the store's own time (``TIME``
inside each script): no caller's clock reaches a script. Redis errors become
:class:`cronman.errors.TransientError`.
"""

from __future__ import annotations

import itertools
import secrets
from collections import defaultdict
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from redis.exceptions import RedisError

from cronman.errors import TransientError
from cronman.redis.keys import Keys
from cronman.redis.scripts import Call, Script, transient
from scheduler_node.claims.rows import BATCH_PREFIX, Kept, RowCopies, batchable, is_batch, pack, unpack
from scheduler_node.parts import (
    ClaimResult,
    Claims,
    Finish,
    Hold,
    RenewResult,
    Swept,
    TakeState,
    Ticket,
    Took,
)

CHUNK = 1000  # executions per script call, so that one call never blocks Redis for long
# An execution's flags ('0', or '1' with a guard) with their second bit set: a claim its holder
# asked for before without an answer (claim.lua), a park on to a new attempt (renew.lua).
_BIT2 = {"0": "2", "1": "3"}
SCRIPTS = ("claim", "renew", "done", "take", "sweep", "recorded")
T = TypeVar("T")


@cache
def script(name: str) -> str:
    return (Path(__file__).parent / f"{name}.lua").read_text()


class RedisClaims(Claims):
    def __init__(self, client: Any, keys: Keys, holder: str, keep_ms: int, *, sharded: bool = False) -> None:
        self.client = client
        self.keys = keys
        self.holder = holder
        self.keep_ms = keep_ms
        self.sharded = sharded  # a Redis Cluster: one call per slot tag
        self._scripts = {n: Script(client, script(n)) for n in SCRIPTS}
        self.copies = RowCopies()  # which batch each kept row is in (scheduler_node/claims/rows.py)
        self._batch_names = f"{BATCH_PREFIX}{holder}|{secrets.token_hex(3)}"  # (one holder, one name)
        self._batches = itertools.count(1)

    # -- batching
    def _groups(self, items: Sequence[T], slot_of: Callable[[T], int]) -> list[list[int]]:
        """Indexes of ``items`` per call: one group per slot tag when sharded, else chunks."""
        if not self.sharded:
            return [list(range(i, min(i + CHUNK, len(items)))) for i in range(0, len(items), CHUNK)]
        by_slot: dict[int, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            by_slot[slot_of(item)].append(i)
        return [g[i : i + CHUNK] for g in by_slot.values() for i in range(0, len(g), CHUNK)]

    async def _run(self, name: str, calls: Sequence[Call]) -> list[Any]:
        """Run one script for several argument sets: one round trip (a pipeline when several)."""
        return await self._scripts[name].many(calls)

    def _guard(self, t: Ticket) -> tuple[str, str]:
        if t.guard is None:
            return self.keys.claim(t.slot, t.name), "0"
        return self.keys.guard(t.slot, t.guard), "1"

    def _triple(self, t: Ticket) -> tuple[list[str], str]:
        claim = self.keys.claim(t.slot, t.name)
        if t.guard is None:  # the claim key again (as _guard has it), built once
            return [claim, self.keys.open(t.slot), claim], "0"
        return [claim, self.keys.open(t.slot), self.keys.guard(t.slot, t.guard)], "1"

    # -- the protocol
    async def claim(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[ClaimResult]:
        if not tickets:
            return []
        calls = []
        groups = self._groups(tickets, lambda t: t.slot)
        for group in groups:
            keys: list[str] = []
            args: list[Any] = [self.holder, lease_ms, self.keep_ms]
            for i in group:
                t = tickets[i]
                triple, flag = self._triple(t)
                keys += triple
                args += [t.member, _BIT2[flag] if t.name in unanswered else flag]
            calls.append((keys, args))
        out: list[ClaimResult] = [ClaimResult.LOST] * len(tickets)
        for group, res in zip(groups, await self._run("claim", calls), strict=True):
            for i, r in zip(group, res, strict=True):
                out[i] = ClaimResult(int(r))
        return out

    async def renew(self, holds: Sequence[Hold]) -> list[RenewResult]:
        if not holds:
            return []
        calls = []
        groups = self._groups(holds, lambda h: h.ticket.slot)
        for group in groups:
            keys: list[str] = []
            args: list[Any] = [self.holder, self.keep_ms]
            for i in group:
                h = holds[i]
                triple, flag = self._triple(h.ticket)
                keys += triple
                args += [h.ticket.member, h.attempt, max(0, h.duration_ms), _BIT2[flag] if h.advance else flag]
            calls.append((keys, args))
        out: list[RenewResult] = [RenewResult.LOST] * len(holds)
        for group, res in zip(groups, await self._run("renew", calls), strict=True):
            for i, r in zip(group, res, strict=True):
                out[i] = RenewResult(int(r))
        return out

    async def done(self, finishes: Sequence[Finish]) -> list[bool]:
        if not finishes:
            return []
        calls = []
        batches: list[tuple[Kept, list[str]] | None] = []
        groups = self._groups(finishes, lambda f: f.ticket.slot)
        unwritten = self.copies.unwritten
        kept_rows = [f.row if f.row and unwritten(f.row) else "" for f in finishes]
        for group in groups:
            keys: list[str] = []
            rows = [(finishes[i].ticket.slot, kept_rows[i]) for i in group if kept_rows[i]]
            together = batchable(rows)
            if together:
                kept: Kept = (rows[0][0], f"{self._batch_names}{next(self._batches)}")
                args: list[Any] = [self.holder, self.keep_ms, kept[1], pack(rows)]
                batches.append((kept, [row for _, row in rows]))
            else:
                args = [self.holder, self.keep_ms, "", ""]
                batches.append(None)
            for i in group:
                f = finishes[i]
                triple, flag = self._triple(f.ticket)
                keys += [*triple, self.keys.unrecorded(f.ticket.slot)]
                args += [
                    f.ticket.member,
                    f"d|{self.holder}|{f.status}|{f.attempt}",
                    "" if together else kept_rows[i],
                    flag,
                ]
            if together:
                keys += [self.keys.row_batch(*kept), self.keys.unrecorded(kept[0])]
            calls.append((keys, args))
        out = [False] * len(finishes)
        for group, res in zip(groups, await self._run("done", calls), strict=True):
            for i, r in zip(group, res, strict=True):
                out[i] = bool(int(r))
        # Counted once the store has them (a call whose answer was lost is found by a sweep later).
        written = [b[0] for b in batches if b is not None and self.copies.batched(*b)]
        if written:
            try:
                await self._forget(written)
            except TransientError:
                pass  # the marks are made: these are found by a sweep, written again, forgotten
        return out

    async def take(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[Took]:
        if not tickets:
            return []
        calls = []
        groups = self._groups(tickets, lambda t: t.slot)
        for group in groups:
            keys: list[str] = []
            args: list[Any] = [self.holder, lease_ms, self.keep_ms]
            for i in group:
                t = tickets[i]
                triple, flag = self._triple(t)
                keys += triple
                args += [t.member, _BIT2[flag] if t.name in unanswered else flag]
            calls.append((keys, args))
        out: list[Took] = [Took(TakeState.GONE, 0)] * len(tickets)
        for group, flat in zip(groups, await self._run("take", calls), strict=True):
            for k, i in enumerate(group):
                out[i] = Took(TakeState(int(flat[2 * k])), int(flat[2 * k + 1]))
        return out

    async def sweep(self, slots: Sequence[int], limit: int, unrecorded_age_ms: int) -> Swept:
        if not slots:
            return Swept()
        calls = []
        groups = self._groups(slots, lambda s: s)
        for group in groups:
            keys: list[str] = []
            for i in group:
                keys += [self.keys.open(slots[i]), self.keys.unrecorded(slots[i])]
            calls.append((keys, [limit, unrecorded_age_ms]))
        swept = Swept()
        batches: list[Kept] = []
        for group, res in zip(groups, await self._run("sweep", calls), strict=True):
            for k in range(0, len(res), 3):  # (position in the call, due members, old rows): only slots with either
                slot = slots[group[int(res[k]) - 1]]
                due, old = res[k + 1], res[k + 2]
                if due:
                    swept.due[slot] = [_text(m) for m in due]
                for member in map(_text, old):
                    if is_batch(member):
                        batches.append((slot, member))
                    else:
                        swept.unrecorded.append((slot, member))
        if batches:
            swept.unrecorded.extend(await self._open_batches(batches))
        return swept

    async def _open_batches(self, batches: list[Kept]) -> list[tuple[int, str]]:
        """The rows of old batches, counted from now on by this node; a batch whose value is gone
        (nothing left to write) is forgotten."""
        pipe = self.client.pipeline(transaction=False)
        for kept in batches:
            pipe.get(self.keys.row_batch(*kept))
        try:
            values = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise transient(exc) from exc
        rows: list[tuple[int, str]] = []
        empty: list[Kept] = []
        for kept, value in zip(batches, values, strict=True):
            found = unpack(_text(value)) if value is not None else []
            if not found or self.copies.batched(kept, [row for _, row in found]):
                empty.append(kept)
            rows.extend(found)
        if empty:
            await self._forget(empty)
        return rows

    async def recorded(self, rows: Sequence[tuple[int, str]]) -> None:
        await self._forget(self.copies.written(rows))

    async def _forget(self, kept: Sequence[Kept]) -> None:
        if not kept:
            return
        calls = []
        for group in self._groups(kept, lambda k: k[0]):
            keys: list[str] = []
            for i in group:
                slot, member = kept[i]
                unrec = self.keys.unrecorded(slot)
                keys += [unrec, self.keys.row_batch(slot, member) if is_batch(member) else unrec]
            calls.append((keys, [kept[i][1] for i in group]))
        await self._run("recorded", calls)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
