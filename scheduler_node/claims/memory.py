"""The claim protocol in memory, with exactly the semantics of the Lua scripts beside it (the same
contract tests run against both). The deterministic simulation shares one ``ClaimSpace`` between
its nodes as the stand-in for Redis: it has its own clock (Redis time), expiring keys, and can
lose everything at once (Redis restarting empty)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

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


@dataclass
class ClaimSpace:
    """The shared state: claim values with expiry, per-slot indexes of open claims and of
    unrecorded rows, overlap guards. ``now`` is the store's own clock in ms."""

    now: Callable[[], int]
    values: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (value, expires at)
    open: dict[int, dict[str, int]] = field(default_factory=dict)  # slot -> member -> score
    unrec: dict[int, dict[str, int]] = field(default_factory=dict)  # slot -> row or batch -> score
    batches: dict[tuple[int, str], str] = field(default_factory=dict)  # (slot, batch) -> its rows

    def get(self, key: str) -> str | None:
        found = self.values.get(key)
        if found is None:
            return None
        if found[1] <= self.now():
            del self.values[key]
            return None
        return found[0]

    def set(self, key: str, value: str, ttl_ms: int) -> None:
        self.values[key] = (value, self.now() + ttl_ms)

    def lose_everything(self) -> None:
        self.values.clear()
        self.open.clear()
        self.unrec.clear()
        self.batches.clear()

    def open_count(self) -> int:
        return sum(len(v) for v in self.open.values())


def _claim_key(t: Ticket) -> str:
    return f"{t.slot}:x:{t.name}"


def _guard_key(t: Ticket) -> str:
    return f"{t.slot}:g:{t.guard}"


def _until(guard_value: str) -> tuple[str, int]:
    key, _, until = guard_value.rpartition("|")
    return key, int(until) if until.isdigit() else 0


class MemoryClaims(Claims):
    def __init__(self, space: ClaimSpace, holder: str, keep_ms: int) -> None:
        self.space = space
        self.holder = holder
        self.keep_ms = keep_ms
        self._mine = f"c|{holder}|"
        self.copies = RowCopies()
        self._batches = itertools.count(1)

    def _index(self, slot: int) -> dict[str, int]:
        return self.space.open.setdefault(slot, {})

    def _guard_set(self, t: Ticket, key: str, deadline: int, ttl: int, only_if_ours: bool) -> None:
        if t.guard is None:
            return
        g = self.space.get(_guard_key(t))
        if only_if_ours and g is not None and not g.startswith(key + "|"):
            return
        self.space.set(_guard_key(t), f"{key}|{deadline}", ttl)

    async def claim(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[ClaimResult]:
        sp = self.space
        now = sp.now()
        deadline = now + lease_ms
        out = []
        for t in tickets:
            key = _claim_key(t)
            v = sp.get(key)
            if v is not None:
                if t.name not in unanswered or not v.startswith(self._mine + "1|"):
                    # another's (or ours, not asked before: it is not read), or a retry of ours parked there
                    out.append(ClaimResult.LOST)
                    continue
                # Our own first-attempt claim, made by a call whose answer was lost: still ours, and
                # held from now (a repeat may come after its lease ran out: a batch that failed on
                # another shard).
                held_until = v.rpartition("|")[2]
                if (int(held_until) if held_until.isdigit() else 0) < deadline:
                    sp.set(key, f"{self._mine}1|{deadline}", self.keep_ms + lease_ms)
                    self._index(t.slot)[t.member] = deadline
                    self._guard_set(t, key, deadline, self.keep_ms + lease_ms, only_if_ours=True)
                out.append(ClaimResult.WON)
                continue
            busy = False
            if t.guard is not None:
                g = sp.get(_guard_key(t))
                if g is not None:
                    other, until = _until(g)
                    busy = other != key and until >= now
            if busy:
                # Held, like a won claim, until the holder's done mark brings the skip's history
                # row: a holder that dies first leaves it to a taker (delivered late, not lost).
                sp.set(key, f"{self._mine}1|{deadline}", self.keep_ms + lease_ms)
                self._index(t.slot)[t.member] = deadline
                out.append(ClaimResult.SKIPPED)
                continue
            sp.set(key, f"{self._mine}1|{deadline}", self.keep_ms + lease_ms)
            self._index(t.slot)[t.member] = deadline
            self._guard_set(t, key, deadline, self.keep_ms + lease_ms, only_if_ours=False)
            out.append(ClaimResult.WON)
        return out

    def _stale(self, value: str, attempt: int, advance: bool) -> bool:
        """A renewal of an attempt earlier than our claim holds (sent before the park of the next
        attempt, landed after it), or a park on to an attempt it holds already (made before, then
        tried again): it changes nothing (renew.lua)."""
        held = value[len(self._mine) :].split("|")[0]
        return held.isdigit() and (int(held) >= attempt if advance else int(held) > attempt)

    async def renew(self, holds: Sequence[Hold]) -> list[RenewResult]:
        sp = self.space
        now = sp.now()
        out = []
        for h in holds:
            t = h.ticket
            key = _claim_key(t)
            v = sp.get(key)
            if v is None:
                result = RenewResult.RECLAIMED
            elif v.startswith(self._mine):
                result = RenewResult.RENEWED
                if self._stale(v, h.attempt, h.advance):
                    out.append(result)
                    continue
            else:
                out.append(RenewResult.LOST)
                continue
            duration = max(0, h.duration_ms)
            deadline = now + duration
            sp.set(key, f"{self._mine}{h.attempt}|{deadline}", self.keep_ms + duration)
            self._index(t.slot)[t.member] = deadline
            self._guard_set(t, key, deadline, self.keep_ms + duration, only_if_ours=True)
            out.append(result)
        return out

    async def done(self, finishes: Sequence[Finish]) -> list[bool]:
        sp = self.space
        now = sp.now()
        out = []
        kept_rows = [f.row if f.row and self.copies.unwritten(f.row) else "" for f in finishes]
        rows = [(f.ticket.slot, row) for f, row in zip(finishes, kept_rows, strict=True) if row]
        together = batchable(rows)
        for f, row in zip(finishes, kept_rows, strict=True):
            t = f.ticket
            key = _claim_key(t)
            v = sp.get(key)
            if v is None or v.startswith(self._mine) or v.startswith(f"d|{self.holder}|"):
                sp.set(key, f"d|{self.holder}|{f.status}|{f.attempt}", self.keep_ms)
                self._index(t.slot).pop(t.member, None)
                if t.guard is not None:
                    g = sp.get(_guard_key(t))
                    if g is not None and g.startswith(key + "|"):
                        sp.set(_guard_key(t), f"{key}|0", self.keep_ms)
                out.append(True)
            else:
                out.append(False)
            if row and not together:
                sp.unrec.setdefault(t.slot, {})[row] = now
        if together:
            kept = (rows[0][0], f"{BATCH_PREFIX}{self.holder}|{next(self._batches)}")
            sp.batches[kept] = pack(rows)
            sp.unrec.setdefault(kept[0], {})[kept[1]] = now
            if self.copies.batched(kept, [row for _, row in rows]):
                self._forget([kept])
        return out

    async def take(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[Took]:
        sp = self.space
        now = sp.now()
        deadline = now + lease_ms
        out = []
        for t in tickets:
            index = self._index(t.slot)
            key = _claim_key(t)
            if t.member not in index:
                v = sp.get(key)
                if v is None:
                    out.append(Took(TakeState.UNKNOWN, 0))
                elif v.startswith("d|"):
                    out.append(Took(TakeState.DONE, 0))
                else:
                    parts = v.split("|")
                    out.append(Took(TakeState.HELD, int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else 0))
                continue
            v = sp.get(key)
            attempt: int | None = None
            if v is None:
                took, attempt = Took(TakeState.TAKEN_UNKNOWN, 1), 1
            elif v.startswith("d|"):
                del index[t.member]
                took = Took(TakeState.DONE, 0)
            else:
                parts = v.split("|")
                held_until = int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else 0
                # A live lease of ours on a name asked again as ``unanswered`` is a take of ours
                # whose answer was lost: taken again (take.lua). Any other live lease holds it.
                if held_until > now and not (t.name in unanswered and v.startswith(self._mine)):
                    index[t.member] = held_until
                    took = Took(TakeState.HELD, held_until)
                else:
                    attempt = int(parts[2]) if len(parts) == 4 and parts[2].isdigit() else 1
                    took = Took(TakeState.TAKEN, attempt)
            if attempt is not None:
                sp.set(key, f"{self._mine}{attempt}|{deadline}", self.keep_ms + lease_ms)
                index[t.member] = deadline
                self._guard_set(t, key, deadline, self.keep_ms + lease_ms, only_if_ours=False)
            out.append(took)
        return out

    async def sweep(self, slots: Sequence[int], limit: int, unrecorded_age_ms: int) -> Swept:
        sp = self.space
        now = sp.now()
        swept = Swept()
        for slot in slots:
            index = sp.open.get(slot)
            if index:
                due = _lowest(index, now, limit)
                if due:
                    swept.due[slot] = due
            rows = sp.unrec.get(slot)
            if rows and unrecorded_age_ms >= 0:
                for member in _lowest(rows, now - unrecorded_age_ms, limit):
                    if not is_batch(member):
                        swept.unrecorded.append((slot, member))
                        continue
                    found = unpack(sp.batches.get((slot, member), ""))
                    if not found or self.copies.batched((slot, member), [row for _, row in found]):
                        self._forget([(slot, member)])
                    swept.unrecorded.extend(found)
        return swept

    async def recorded(self, rows: Sequence[tuple[int, str]]) -> None:
        self._forget(self.copies.written(rows))

    def _forget(self, kept: Sequence[Kept]) -> None:
        for slot, member in kept:
            self.space.unrec.get(slot, {}).pop(member, None)
            self.space.batches.pop((slot, member), None)


def _lowest(scores: dict[str, int], at_most: int, limit: int) -> list[str]:
    """Members scored at most ``at_most``, lowest first (ties by member), like ZRANGEBYSCORE."""
    ranked = sorted((s, m) for m, s in scores.items() if s <= at_most)
    return [m for _, m in ranked[:limit]]


__all__ = ["ClaimSpace", "MemoryClaims"]
