"""Schedule maths: pure functions of their inputs, times in UTC epoch milliseconds.

``next_after(after_ms)`` gives the first occurrence strictly after ``after_ms``, or ``None`` when the
schedule has no more occurrences. The clock is never read here.

Cron expressions are evaluated on the local wall clock of the job's time zone, then mapped to
instants with explicit rules for the two kinds of daylight-saving transition:

* a local time that does not exist (spring forward): ``GapPolicy.SHIFT`` fires at the first instant
  after the gap (02:30 in a 02:00-03:00 gap fires at 03:00 local); ``GapPolicy.SKIP`` does not fire.
* a local time that happens twice (fall back): ``FoldPolicy.FIRST`` fires at the first of the two;
  ``FoldPolicy.BOTH`` fires at each.

Several wall times that map to one instant (every minute of a gap, under SHIFT) fire once.
"""

from __future__ import annotations

import enum
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from cronman.timeutil import from_ms, to_ms

_MAX_DST_SHIFT = timedelta(hours=3)  # larger than any real offset change in one transition
_MAX_SCAN = 200_000  # bound on wall-clock candidates examined in one call


class GapPolicy(enum.StrEnum):
    SHIFT = "shift"
    SKIP = "skip"


class FoldPolicy(enum.StrEnum):
    FIRST = "first"
    BOTH = "both"


class Timing(Protocol):
    def next_after(self, after_ms: int) -> int | None: ...


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


@dataclass(frozen=True, slots=True)
class IntervalTiming:
    """Fires at ``anchor + k * every`` for integer k, within [start, end]."""

    every_ms: int
    anchor_ms: int
    start_ms: int | None = None
    end_ms: int | None = None

    def next_after(self, after_ms: int) -> int | None:
        lo = after_ms + 1
        if self.start_ms is not None and lo < self.start_ms:
            lo = self.start_ms
        t = self.anchor_ms + _ceil_div(lo - self.anchor_ms, self.every_ms) * self.every_ms
        if self.end_ms is not None and t > self.end_ms:
            return None
        return t


@dataclass(frozen=True, slots=True)
class OnceTiming:
    at_ms: int

    def next_after(self, after_ms: int) -> int | None:
        return self.at_ms if self.at_ms > after_ms else None


def phase_for(job_id: str, every_ms: int) -> int:
    """A stable phase in [0, every_ms) from the job id, so equal intervals do not all fire at once."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % every_ms


def cron_field_count(expression: str) -> int:
    return len(expression.split())


@lru_cache(maxsize=4096)
def validate_cron(expression: str) -> str | None:
    """Return an error message for an unusable expression, or None when it is valid (cached: a
    batch of jobs usually shares a few expressions, and checking one costs ~0.1 ms)."""
    fields = expression.split()
    if expression.startswith("@"):
        if len(fields) != 1 or not croniter.is_valid(expression):
            return "unknown cron alias; use @yearly, @monthly, @weekly, @daily, @midnight or @hourly"
        return None
    if len(fields) not in (5, 6):
        return (
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 with a "
            f"leading seconds field; got {len(fields)}"
        )
    try:
        if not croniter.is_valid(expression, second_at_beginning=len(fields) == 6):
            return "invalid cron expression"
    except (CroniterError, ValueError, KeyError, TypeError) as exc:
        return f"invalid cron expression: {exc}"
    return None


def validate_timezone(name: str) -> str | None:
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        return "unknown time zone; use an IANA name such as America/New_York"
    try:
        zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return f"unknown time zone {name!r}; use an IANA name such as America/New_York"
    return None


@lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


class CronRule:
    """A parsed cron expression in a time zone with DST policies. Shared by every job that uses it."""

    __slots__ = ("expression", "tz", "gap", "fold", "_zone", "_six", "_local", "_cache")

    def __init__(self, expression: str, tz: str, gap: GapPolicy, fold: FoldPolicy) -> None:
        error = validate_cron(expression) or validate_timezone(tz)
        if error:
            raise ValueError(error)
        self.expression, self.tz, self.gap, self.fold = expression, tz, gap, fold
        self._zone = zone(tz)
        self._six = cron_field_count(expression) == 6
        self._local = threading.local()  # croniter iterators are stateful: one per thread
        self._cache: dict[int, int | None] = {}

    # -- wall clock <-> instants ------------------------------------------------------------
    def _wall(self, ms: int) -> datetime:
        return from_ms(ms).astimezone(self._zone).replace(tzinfo=None)

    def _instants(self, wall: datetime, both: bool) -> list[int]:
        """The instants at which the local wall time happens, per the DST policies (sorted)."""
        z = self._zone
        first = wall.replace(tzinfo=z, fold=0)
        second = wall.replace(tzinfo=z, fold=1)
        if first.utcoffset() == second.utcoffset():
            return [to_ms(first)]
        a, b = to_ms(first), to_ms(second)
        if self._wall(a) == wall:  # happens twice (fold): a is the earlier instant
            return [a, b] if both else [a]
        # does not exist (gap): the transition lies between the two interpretations
        if self.gap is GapPolicy.SKIP:
            return []
        return [self._transition(min(a, b), max(a, b))]

    def _transition(self, lo: int, hi: int) -> int:
        """First instant in (lo, hi] whose UTC offset differs from lo's (second resolution)."""
        base = from_ms(lo).astimezone(self._zone).utcoffset()
        lo_s, hi_s = lo // 1000, _ceil_div(hi, 1000)
        while hi_s - lo_s > 1:
            mid = (lo_s + hi_s) // 2
            if datetime.fromtimestamp(mid, UTC).astimezone(self._zone).utcoffset() == base:
                lo_s = mid
            else:
                hi_s = mid
        return hi_s * 1000

    def _walls_from(self, start: datetime):  # type: ignore[no-untyped-def]
        it = getattr(self._local, "it", None)
        if it is None:
            it = croniter(self.expression, datetime(2000, 1, 1), second_at_beginning=self._six)
            self._local.it = it
        it.set_current(start, force=True)
        for _ in range(_MAX_SCAN):
            try:
                yield it.get_next(datetime)
            except CroniterBadDateError:
                return

    # -- public ----------------------------------------------------------------------------
    def next_after(self, after_ms: int) -> int | None:
        cached = self._cache.get(after_ms, -1)
        if cached != -1:
            return cached
        result = self._compute(after_ms)
        if len(self._cache) >= 4096:
            self._cache.clear()
        self._cache[after_ms] = result
        return result

    def _compute(self, after_ms: int) -> int | None:
        # Whole seconds: cron has second resolution; start the wall scan at the second of `after`.
        start_wall = self._wall(after_ms - after_ms % 1000)
        best = self._scan_first(after_ms, start_wall)
        if self.fold is FoldPolicy.BOTH:
            best = self._scan_second_instances(after_ms, start_wall, best)
        return best

    def _scan_first(self, after_ms: int, start_wall: datetime) -> int | None:
        # Taking only the first instance of repeated times, instants are non-decreasing in wall
        # order, so the first one past `after` is the answer.
        for wall in self._walls_from(start_wall - timedelta(seconds=1)):
            for t in self._instants(wall, both=False):
                if t > after_ms:
                    return t
        return None

    def _scan_second_instances(self, after_ms: int, start_wall: datetime, best: int | None) -> int | None:
        # The second instance of a repeated hour is later than the first instances that follow
        # it in wall order; look for one before `best` only when a fold lies in between.
        horizon = best if best is not None else after_ms + 400 * 86_400_000
        lo = from_ms(after_ms) - _MAX_DST_SHIFT
        hi = from_ms(horizon) + _MAX_DST_SHIFT
        if not self._offset_drops_between(lo, hi):
            return best
        for wall in self._walls_from(start_wall - _MAX_DST_SHIFT):
            if best is not None and wall > self._wall(best) + _MAX_DST_SHIFT:
                break
            for t in self._instants(wall, both=True):
                if t > after_ms and (best is None or t < best):
                    best = t
        return best

    def _offset_drops_between(self, lo: datetime, hi: datetime) -> bool:
        step = timedelta(days=7)
        prev = lo.astimezone(self._zone).utcoffset()
        t = lo
        while t < hi:
            t = min(t + step, hi)
            cur = t.astimezone(self._zone).utcoffset()
            if cur is not None and prev is not None and cur < prev:
                return True
            prev = cur
        return False


@lru_cache(maxsize=4096)
def cron_rule(
    expression: str, tz: str = "UTC", gap: GapPolicy = GapPolicy.SHIFT, fold: FoldPolicy = FoldPolicy.FIRST
) -> CronRule:
    return CronRule(expression, tz, GapPolicy(gap), FoldPolicy(fold))


@dataclass(frozen=True, slots=True)
class CronTiming:
    rule: CronRule
    start_ms: int | None = None
    end_ms: int | None = None

    def next_after(self, after_ms: int) -> int | None:
        if self.start_ms is not None and after_ms < self.start_ms - 1:
            after_ms = self.start_ms - 1
        t = self.rule.next_after(after_ms)
        if t is None or (self.end_ms is not None and t > self.end_ms):
            return None
        return t


_MAX_JITTER_SCAN = 1000


@dataclass(frozen=True, slots=True)
class JitteredTiming:
    """Moves each occurrence later by a deterministic offset in [0, jitter): the same occurrence
    of the same job always gets the same offset, so every node agrees on it."""

    base: Timing
    jitter_ms: int
    seed: str

    def offset(self, t: int) -> int:
        digest = hashlib.blake2b(f"{self.seed}\x00{t}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.jitter_ms

    def next_after(self, after_ms: int) -> int | None:
        best: int | None = None
        t = self.base.next_after(after_ms - self.jitter_ms)
        for _ in range(_MAX_JITTER_SCAN):
            if t is None or (best is not None and t >= best):
                break
            moved = t + self.offset(t)
            if moved > after_ms and (best is None or moved < best):
                best = moved
            t = self.base.next_after(t)
        return best


def _ms_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        return to_ms(value)
    from cronman.timeutil import parse_iso

    return parse_iso(str(value))


def timing_from_dict(schedule: dict, job_id: str) -> Timing:
    """Build the timing of a stored (already validated) schedule document."""
    return timing_maker(schedule)(job_id)


def timing_maker(schedule: dict) -> Callable[[str], Timing]:
    """How to build a schedule's timing for a job id, with the work done once per schedule (a node
    loading a million jobs calls it once per distinct schedule): only the phase of an interval
    without ``start_at`` and a jitter offset depend on the job id; every other timing is shared."""
    start = _ms_or_none(schedule.get("start_at"))
    end = _ms_or_none(schedule.get("end_at"))
    base: Callable[[str], Timing]
    if schedule["type"] == "interval" and start is None:
        every = int(schedule["every_seconds"]) * 1000

        def base(job_id: str) -> Timing:
            return IntervalTiming(every, phase_for(job_id, every), None, end)
    else:
        shared = _shared_timing(schedule, start, end)

        def base(job_id: str) -> Timing:
            return shared

    jitter_ms = int(float(schedule.get("jitter_seconds") or 0) * 1000)
    if jitter_ms > 0:  # under a millisecond (5e-324 passes gt=0) is no jitter, not a division by zero
        return lambda job_id: JitteredTiming(base(job_id), jitter_ms, job_id)
    return base


def _shared_timing(schedule: dict, start: int | None, end: int | None) -> Timing:
    kind = schedule["type"]
    if kind == "interval":
        assert start is not None
        return IntervalTiming(int(schedule["every_seconds"]) * 1000, start, start, end)
    if kind == "cron":
        rule = cron_rule(
            schedule["expression"],
            schedule.get("timezone") or "UTC",
            GapPolicy(schedule.get("dst_gap", GapPolicy.SHIFT)),
            FoldPolicy(schedule.get("dst_fold", FoldPolicy.FIRST)),
        )
        return CronTiming(rule, start, end)
    if kind == "once":
        at = _ms_or_none(schedule["at"])
        assert at is not None
        return OnceTiming(at)
    raise ValueError(f"unknown schedule type {kind!r}")


def next_times(timing: Timing, after_ms: int, count: int) -> list[int]:
    out: list[int] = []
    t: int | None = after_ms
    while len(out) < count and t is not None:
        t = timing.next_after(t)
        if t is not None:
            out.append(t)
    return out


__all__ = [
    "CronRule",
    "CronTiming",
    "CroniterBadCronError",
    "FoldPolicy",
    "GapPolicy",
    "IntervalTiming",
    "JitteredTiming",
    "OnceTiming",
    "Timing",
    "cron_rule",
    "next_times",
    "phase_for",
    "timing_from_dict",
    "validate_cron",
    "validate_timezone",
]
