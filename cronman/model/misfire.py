"""Misfires: occurrences nobody could fire on time because no scheduler was running.

Pure functions of the timing, the window and the policy; the node decides the window (from the
cluster's persisted "fired through" watermark) and records what this returns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cronman.model.schedule import Timing

MAX_RECORDED = 100  # skipped occurrences recorded one row each; the rest are counted
MAX_COUNTED = 10_000
# How a plan's skips are recorded: rows for occurrences no node claimed, so they do not end an
# execution a node did claim (see scheduler_node.store.Attempts)
REASON_PREFIX = "misfire:"


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
        return f"{REASON_PREFIX} no scheduler was running; {total} occurrence(s) skipped"


def latest_at_or_before(timing: Timing, since_ms: int, until_ms: int) -> int | None:
    """The last occurrence in (since, until]."""
    last = _latest(timing, since_ms, until_ms, 1)
    return last[-1] if last else None


def plan(timing: Timing, since_ms: int, until_ms: int, policy: MisfirePolicy, catchup_ms: int) -> MisfirePlan:
    """What to do with the occurrences in (since, until] that were missed. Bounded: at most
    MAX_COUNTED occurrences are fired or counted, and the recorded skips are found by a search
    back from the end of the window that never lists more than a few hundred occurrences."""
    first = timing.next_after(since_ms)
    if first is None or first > until_ms:  # nothing missed (most jobs of a short outage): no search
        return MisfirePlan()
    latest = latest_at_or_before(timing, since_ms, until_ms)
    if latest is None:
        return MisfirePlan()
    fire: list[int] = []
    skip_until = until_ms  # the skipped occurrences are those in (since, skip_until]
    if policy is MisfirePolicy.FIRE_ONCE:
        fire, skip_until = [latest], latest - 1
    elif policy is MisfirePolicy.FIRE_ALL:
        skip_until = max(since_ms, until_ms - catchup_ms)
        fire = between(timing, skip_until, until_ms, MAX_COUNTED)
    fired = set(fire)
    total = sum(t not in fired for t in between(timing, since_ms, until_ms, MAX_COUNTED))
    skipped = [t for t in _latest(timing, since_ms, skip_until, MAX_RECORDED) if t not in fired]
    return MisfirePlan(fire, skipped, total, first, latest)


def between(timing: Timing, since_ms: int, until_ms: int, limit: int = MAX_COUNTED) -> list[int]:
    """The first ``limit`` occurrences in (since, until], oldest first."""
    found: list[int] = []
    t = timing.next_after(since_ms)
    while t is not None and t <= until_ms and len(found) < limit:
        found.append(t)
        nxt = timing.next_after(t)
        t = nxt if nxt is None or nxt > t else None  # a timing that does not move on ends the list
    return found


def _latest(timing: Timing, since_ms: int, until_ms: int, n: int) -> list[int]:
    """Up to the last ``n`` occurrences in (since, until], oldest first: a window back from
    ``until`` widens (x8) until it holds ``n``, and is bisected when it would hold more than can be
    listed, so each look lists at most ``8n + 64`` occurrences and there are fewer than 100 looks."""
    if until_ms <= since_ms:
        return []
    cap = 8 * n + 64
    short, big, width = 0, 0, 1000  # `short` holds fewer than n; `big` (when not 0) more than cap
    found: list[int] = []
    for _ in range(200):
        lo = max(since_ms, until_ms - width)
        found = between(timing, lo, until_ms, cap + 1)
        if len(found) > cap:
            big = width
        elif len(found) >= n or lo == since_ms:
            return found[-n:]
        else:
            short = width
        if big and big - short <= 1:
            break  # cannot happen: one more millisecond adds at most one occurrence
        width = (short + big) // 2 if big else width * 8
    return found[-n:]
