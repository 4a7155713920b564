"""Misfires: occurrences nobody could fire on time because no scheduler was running.

Pure functions of the timing, the window and the policy; the node decides the window (from the
cluster's persisted "fired through" watermark) and records what this returns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cronman.schedule import Timing

MAX_RECORDED = 100  # skipped occurrences recorded one row each; the rest are counted
MAX_COUNTED = 10_000


class MisfirePolicy(enum.StrEnum):
    FIRE_ONCE = "fire_once"  # fire the latest missed occurrence, late; skip the others
    SKIP = "skip"  # fire none of them
    FIRE_ALL = "fire_all"  # fire each one within the catch-up window; skip older ones


@dataclass(frozen=True)
class MisfirePlan:
    fire: list[int] = field(default_factory=list)
    skip: list[int] = field(default_factory=list)  # at most MAX_RECORDED, the latest ones
    skipped_total: int = 0  # how many were skipped in all (counted up to MAX_COUNTED)
    first_missed: int | None = None
    last_missed: int | None = None

    @property
    def reason(self) -> str:
        total = f"{self.skipped_total}+" if self.skipped_total >= MAX_COUNTED else str(self.skipped_total)
        return f"misfire: no scheduler was running; {total} occurrence(s) skipped"


def latest_at_or_before(timing: Timing, since_ms: int, until_ms: int) -> int | None:
    """The last occurrence in (since, until], found by widening a window back from ``until``."""
    width = 1000
    while True:
        lo = max(since_ms, until_ms - width)
        t = timing.next_after(lo)
        if t is not None and t <= until_ms:
            last = t
            for _ in range(MAX_COUNTED):
                nxt = timing.next_after(last)
                if nxt is None or nxt > until_ms:
                    return last
                last = nxt
            return last
        if lo == since_ms:
            return None
        width *= 8


def plan(timing: Timing, since_ms: int, until_ms: int, policy: MisfirePolicy, catchup_ms: int) -> MisfirePlan:
    """What to do with the occurrences in (since, until] that were missed."""
    latest = latest_at_or_before(timing, since_ms, until_ms)
    if latest is None:
        return MisfirePlan()
    fire: list[int] = []
    if policy is MisfirePolicy.FIRE_ONCE:
        fire = [latest]
    elif policy is MisfirePolicy.FIRE_ALL:
        t = timing.next_after(max(since_ms, until_ms - catchup_ms))
        while t is not None and t <= until_ms and len(fire) < MAX_COUNTED:
            fire.append(t)
            t = timing.next_after(t)
    fired = set(fire)
    first = timing.next_after(since_ms)
    total = 0
    t = first
    while t is not None and t <= until_ms and total < MAX_COUNTED:
        total += t not in fired
        t = timing.next_after(t)
    skipped = [t for t in _latest(timing, since_ms, until_ms, MAX_RECORDED + len(fire)) if t not in fired]
    return MisfirePlan(fire, skipped[-MAX_RECORDED:], total, first, latest)


def _latest(timing: Timing, since_ms: int, until_ms: int, n: int) -> list[int]:
    """Up to the last ``n`` occurrences in (since, until], oldest first."""
    width = 1000
    while True:
        lo = max(since_ms, until_ms - width)
        found: list[int] = []
        t = timing.next_after(lo)
        while t is not None and t <= until_ms and len(found) < MAX_COUNTED:
            found.append(t)
            t = timing.next_after(t)
        if len(found) >= n or lo == since_ms:
            return found[-n:]
        width *= 8
