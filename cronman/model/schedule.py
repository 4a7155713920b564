"""Schedule maths: pure functions of their inputs, times in UTC epoch milliseconds.

``next_after(after_ms)`` gives the first occurrence strictly after ``after_ms``, or ``None`` when the
schedule has no more occurrences. The clock is never read here. Every timing is total: for any
``after_ms`` it returns an int or None and never raises; instants from year 9990 on have no
occurrence, and instants before year 2 are treated as year 2.

Schedule documents (stored as validated by `cronman.model.spec`; instants are ISO-8601 strings with an
offset, aware datetimes or epoch milliseconds)::

    {"type": "cron", "expression": "0 7 * * *",            # or "expressions": ["0 7 * * 1-5", "@monthly"]
     "timezone": "Europe/Berlin", "dst_gap": "shift" | "skip", "dst_fold": "first" | "both",
     "start_at": ..., "end_at": ..., "jitter_seconds": 1.5}  # the last three optional
    {"type": "interval", "every_seconds": 60, "start_at": ..., "end_at": ..., "jitter_seconds": ...}
    {"type": "once", "at": "2026-11-13T04:13:22Z", "jitter_seconds": ...}

A cron schedule holds one ``expression`` or a list of ``expressions`` (syntax in `cronman.model.cron`);
with several, an occurrence is the earliest next of any of them, and an instant named by more
than one fires once. Each is evaluated on the local wall clock of the time zone, then mapped to
instants with explicit rules for the two kinds of daylight-saving transition:

* a local time that does not exist (spring forward): ``GapPolicy.SHIFT`` fires at the first instant
  after the gap (02:30 in a 02:00-03:00 gap fires at 03:00 local); ``GapPolicy.SKIP`` does not fire.
* a local time that happens twice (fall back): ``FoldPolicy.FIRST`` fires at the first of the two;
  ``FoldPolicy.BOTH`` fires at each.

Several wall times that map to one instant (every minute of a gap, under SHIFT) fire once.

Cost: one call is a bounded number of wall-clock searches (`CronExpr.next_wall`, microseconds)
and UTC-offset look-ups. With the first instance of each wall time the wall -> instant map is
monotonic, so the first matching wall after ``after``'s wall is the answer; the second instances
of a repeated hour can only come first when ``after`` itself lies in that hour, and are found by
one more search from the start of the repeated interval.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import product
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronman.model.cron import (
    CronExpr,
    CronSyntaxError,
    cron_error,
    has_hashed,
    hashed_as_any,
    job_identity,
    parse_cron,
    resolve_hashed,
    time_outcomes,
)
from cronman.model.timeutil import parse_iso, to_ms

_FIRST_S = (datetime(2, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(seconds=1)
_LAST_S = (datetime(9990, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(seconds=1)
_NAIVE_EPOCH = datetime(1970, 1, 1)
MAX_GAP_SKIPS = 64  # under dst_gap=skip: searches in a row that land in gaps before giving up (None)


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


@dataclass(frozen=True, slots=True)
class NoTiming:
    """A schedule with no times of its own (``after``: its executions follow its upstreams')."""

    def next_after(self, after_ms: int) -> int | None:
        return None


NEVER = NoTiming()


def phase_for(job_id: str, every_ms: int) -> int:
    """A stable phase in [0, every_ms) from the job id, so equal intervals do not all fire at once."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % every_ms


# Intervals at least this long are phased when asked (see IdPhasedInterval): a job of them fires
# at most once a minute, so the id's hash (about a microsecond) is nothing beside a delivery.
LAZY_PHASE_MIN_MS = 60_000


@dataclass(frozen=True, slots=True)
class IdPhasedInterval:
    """The timing of every job of one interval schedule (no ``start_at``, no jitter) without the
    job: each job's phase comes from its id (:func:`phase_for`). Shared by all the jobs of the
    schedule, where an IntervalTiming of each and its phase took about 96 bytes a job."""

    every_ms: int
    end_ms: int | None = None

    def for_job(self, job_id: str) -> IntervalTiming:
        return IntervalTiming(self.every_ms, phase_for(job_id, self.every_ms), None, self.end_ms)


def id_phased(schedule: dict, from_ms: int = LAZY_PHASE_MIN_MS) -> IdPhasedInterval | None:
    """The shared timing of a schedule whose jobs differ only by their id's phase, if its
    interval is at least ``from_ms``; else None."""
    if schedule.get("type") != "interval" or schedule.get("start_at") is not None:
        return None
    if int(float(schedule.get("jitter_seconds") or 0) * 1000) > 0:  # as timing_maker: jittered
        return None
    every = int(schedule["every_seconds"]) * 1000
    if every < from_ms:
        return None
    return IdPhasedInterval(every, _ms_or_none(schedule.get("end_at")))


@lru_cache(maxsize=4096)
def validate_cron(expression: str) -> str | None:
    """Return an error message for an unusable expression (naming the field at fault), or None."""
    return cron_error(expression)


@lru_cache(maxsize=1024)
def cron_spacing_seconds(expressions: tuple[str, ...]) -> int:
    """The shortest time between two wall times the expressions name together (86400 when they name
    one time of day): the most a jitter may be, so that jittered occurrences keep their order and a
    search for the next one looks at a bounded number of them (`JitteredTiming`). With hashed (H)
    values, the shortest over every job's values."""
    if len(expressions) == 1:
        return _spacing_of_one(expressions[0])
    times: set[int] = set()
    for expression in expressions:  # H as every value it can be: no closer than any job's
        e = parse_cron(hashed_as_any(expression), stored=True)
        times.update(h * 3600 + m * 60 + s for h in e.hours for m in e.minutes for s in e.seconds)
    ordered = sorted(times)
    if len(ordered) < 2:
        return 86_400
    gaps = (b - a for a, b in zip(ordered, ordered[1:], strict=False))
    return min(min(gaps), 86_400 - ordered[-1] + ordered[0])


def _spacing_of_one(expression: str) -> int:
    """One expression names every (hour, minute, second) of three sets: the spacing follows from
    each set's least gap and span. Every set a job's H values can give is tried."""
    hours = {_least_gap(v, 24) for v in time_outcomes(expression, "hour")}
    minutes = {(_least_gap(v), v[-1] - v[0]) for v in time_outcomes(expression, "minute")}
    seconds = {(_least_gap(v), v[-1] - v[0]) for v in time_outcomes(expression, "second")}
    best = 86_400
    for hour_gap, (minute_gap, minute_span), (second_gap, second_span) in product(hours, minutes, seconds):
        hour_minutes = min(minute_gap, 60 * hour_gap - minute_span)  # minutes between two named ones
        best = min(best, second_gap, 60 * hour_minutes - second_span)
    return best


def _least_gap(values: tuple[int, ...], cycle: int = 0) -> int:
    """The least gap between two of the sorted values (around the cycle, when given: a day's 24
    hours); 86400, more than any, for a single value off a cycle."""
    gaps = [b - a for a, b in zip(values, values[1:], strict=False)]
    if cycle:
        gaps.append(cycle - values[-1] + values[0])
    return min(gaps, default=86_400)


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


def _seconds(delta: timedelta | None) -> int:
    assert delta is not None  # a ZoneInfo always has an offset
    return delta.days * 86_400 + delta.seconds


class CronRule:
    """A parsed cron expression in a time zone with DST policies. Shared by every job that uses it."""

    __slots__ = ("expression", "tz", "gap", "fold", "_expr", "_zone", "_cache")

    def __init__(self, expression: str, tz: str, gap: GapPolicy, fold: FoldPolicy) -> None:
        error = validate_timezone(tz)
        if error:
            raise ValueError(error)
        self.expression, self.tz, self.gap, self.fold = expression, tz, gap, fold
        self._expr: CronExpr = parse_cron(expression, stored=True)  # CronSyntaxError is a ValueError
        self._zone = zone(tz)
        self._cache: dict[int, int | None] = {}

    def next_after(self, after_ms: int) -> int | None:
        cached = self._cache.get(after_ms, -1)
        if cached != -1:
            return cached
        result = self._compute(after_ms)
        if len(self._cache) >= 4096:
            self._cache.clear()
        self._cache[after_ms] = result
        return result

    # -- instants <-> walls (local seconds) -------------------------------------------------
    def _offset_at(self, s: int) -> int:
        return _seconds(datetime.fromtimestamp(s, self._zone).utcoffset())

    def _wall_offsets(self, wall: int) -> tuple[int, int]:
        """The UTC offsets of a wall time read before (fold=0) and after (fold=1) a transition:
        equal away from transitions, the first larger in a repeated interval, smaller in a gap."""
        local = (_NAIVE_EPOCH + timedelta(seconds=wall)).replace(tzinfo=self._zone)
        return _seconds(local.utcoffset()), _seconds(local.replace(fold=1).utcoffset())

    def _transition(self, lo: int, hi: int) -> int:
        """The first second in (lo, hi] whose UTC offset differs from lo's."""
        base = self._offset_at(lo)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset_at(mid) == base:
                lo = mid
            else:
                hi = mid
        return hi

    # -- the search ---------------------------------------------------------------------------
    def _compute(self, after_ms: int) -> int | None:
        s = after_ms // 1000  # cron has second resolution: the wall search starts at after's second
        if s >= _LAST_S:
            return None
        s = max(s, _FIRST_S)
        local = datetime.fromtimestamp(s, self._zone)
        offset = _seconds(local.utcoffset())
        other = _seconds(local.replace(fold=1 - local.fold).utcoffset())
        if other == offset:
            return self._first_from(s + offset)
        return self._in_fold(s, offset, other, second_pass=local.fold == 1)

    def _first_from(self, start: int) -> int | None:
        """The instant of the first matching wall after ``start`` (first instances only, gap policy
        applied): non-decreasing in wall order, so it is the first occurrence after the instant
        whose wall is ``start``."""
        skipped: int | None = None  # the last wall skipped in a gap
        for _ in range(MAX_GAP_SKIPS):
            wall = self._expr.next_wall(start)
            if wall is None:
                return None
            before, after = self._wall_offsets(wall)
            if before == after:
                return (wall - before) * 1000
            a, b = wall - before, wall - after
            if before > after:  # the clock went back: the wall happens twice, a is the first
                return a * 1000
            # the clock went forward: the wall falls in a gap, which the transition (in (b, a]) ends
            if self.gap is GapPolicy.SHIFT:
                return self._transition(b, a) * 1000
            if skipped is not None and wall - skipped < 2 * 86_400:
                # a second wall in the same gap (gaps last at most a day and are days apart): jump
                # to the wall just before the gap's end rather than walk through every one
                start, skipped = self._transition(b, a) + after - 1, None
            else:
                start, skipped = wall, wall
        return None

    def _in_fold(self, s: int, offset: int, other: int, *, second_pass: bool) -> int | None:
        """``s`` lies in a repeated interval of walls [f0, f1): the first pass runs at the larger
        offset, up to the transition, the second at the smaller one after it."""
        early, late = max(offset, other), min(offset, other)
        wall = s + offset
        shift = self._transition(wall - early, s) if second_pass else self._transition(s, wall - late)
        f0, f1 = shift + late, shift + early
        if second_pass:
            if self.fold is FoldPolicy.BOTH:
                again = self._expr.next_wall(wall)
                if again is not None and again < f1:
                    return (again - late) * 1000
            return self._first_from(f1 - 1)
        first = self._first_from(wall)
        if self.fold is FoldPolicy.BOTH and (first is None or first >= shift * 1000):
            # no first instance before the transition: the earliest second instance may come first
            again = self._expr.next_wall(f0 - 1)
            if again is not None and again < f1 and (first is None or (again - late) * 1000 < first):
                return (again - late) * 1000
        return first


@lru_cache(maxsize=4096)
def cron_rule(
    expression: str, tz: str = "UTC", gap: GapPolicy = GapPolicy.SHIFT, fold: FoldPolicy = FoldPolicy.FIRST
) -> CronRule:
    return CronRule(expression, tz, GapPolicy(gap), FoldPolicy(fold))


@dataclass(frozen=True, slots=True)
class EarliestOf:
    """Several timings as one: the earliest next occurrence of any; equal instants fire once."""

    parts: tuple[Timing, ...]

    def next_after(self, after_ms: int) -> int | None:
        best: int | None = None
        for part in self.parts:
            t = part.next_after(after_ms)
            if t is not None and (best is None or t < best):
                best = t
        return best


@dataclass(frozen=True, slots=True)
class CronTiming:
    rule: Timing  # a CronRule, or an EarliestOf several
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
    return parse_iso(str(value))


def timing_from_dict(schedule: dict, job_id: str, namespace: str) -> Timing:
    """Build the timing of a stored (already validated) schedule document for a job."""
    return timing_maker(schedule)(job_id, namespace)


TimingMaker = Callable[[str, str], Timing]  # (job id, namespace) -> the job's timing


def timing_maker(schedule: dict) -> TimingMaker:
    """How to build a schedule's timing for a job (id, namespace), with the work done once per
    schedule (a node loading a million jobs calls it once per distinct schedule): only the phase of
    an interval without ``start_at``, a jitter offset and hashed (H) cron values depend on the job;
    every other timing is shared, and jobs whose H values come out the same share theirs."""
    start = _ms_or_none(schedule.get("start_at"))
    end = _ms_or_none(schedule.get("end_at"))
    base: TimingMaker
    if schedule["type"] == "interval" and start is None:
        every = int(schedule["every_seconds"]) * 1000

        def base(job_id: str, namespace: str) -> Timing:
            return IntervalTiming(every, phase_for(job_id, every), None, end)
    elif schedule["type"] == "cron" and any(has_hashed(e) for e in cron_expressions(schedule)):
        base = _hashed_cron(schedule, start, end)
    else:
        shared = _shared_timing(schedule, start, end)

        def base(job_id: str, namespace: str) -> Timing:
            return shared

    jitter_ms = int(float(schedule.get("jitter_seconds") or 0) * 1000)
    if jitter_ms > 0:  # under a millisecond (5e-324 passes gt=0) is no jitter, not a division by zero
        return lambda job_id, namespace: JitteredTiming(base(job_id, namespace), jitter_ms, job_id)
    return base


def cron_expressions(schedule: dict) -> list[str]:
    """The expressions of a cron schedule document: ``expressions``, or the one ``expression``."""
    expressions = schedule.get("expressions")
    if expressions is None:
        return [schedule["expression"]]
    if not expressions:
        raise ValueError("a cron schedule needs at least one expression")
    return list(expressions)


def resolved_expressions(schedule: dict, job_id: str, namespace: str) -> list[str]:
    """A cron schedule's expressions with the job's hashed (H) values in place: what it fires by."""
    identity = job_identity(namespace, job_id)
    return [resolve_hashed(e, identity, stored=True) for e in cron_expressions(schedule)]


_SHARED_HASHED = 10_000  # timings of distinct H outcomes kept per schedule (a job's is remade past that)


def _hashed_cron(schedule: dict, start: int | None, end: int | None) -> TimingMaker:
    """Each job's expressions with its H values in place; jobs with the same outcome share a timing."""
    expressions = cron_expressions(schedule)
    tz, gap, fold = _zone_and_policies(schedule)
    made: dict[tuple[str, ...], Timing] = {}

    def make(job_id: str, namespace: str) -> Timing:
        identity = job_identity(namespace, job_id)
        resolved = tuple(resolve_hashed(e, identity, stored=True) for e in expressions)
        timing = made.get(resolved)
        if timing is None:
            timing = _cron_timing(resolved, tz, gap, fold, start, end)
            if len(made) < _SHARED_HASHED:
                made[resolved] = timing
        return timing

    return make


def _zone_and_policies(schedule: dict) -> tuple[str, GapPolicy, FoldPolicy]:
    return (
        schedule.get("timezone") or "UTC",
        GapPolicy(schedule.get("dst_gap", GapPolicy.SHIFT)),
        FoldPolicy(schedule.get("dst_fold", FoldPolicy.FIRST)),
    )


def _cron_timing(
    expressions: Iterable[str], tz: str, gap: GapPolicy, fold: FoldPolicy, start: int | None, end: int | None
) -> CronTiming:
    rules = tuple(dict.fromkeys(cron_rule(e, tz, gap, fold) for e in expressions))
    return CronTiming(rules[0] if len(rules) == 1 else EarliestOf(rules), start, end)


def _shared_timing(schedule: dict, start: int | None, end: int | None) -> Timing:
    kind = schedule["type"]
    if kind == "interval":
        assert start is not None
        return IntervalTiming(int(schedule["every_seconds"]) * 1000, start, start, end)
    if kind == "cron":
        return _cron_timing(cron_expressions(schedule), *_zone_and_policies(schedule), start, end)
    if kind == "once":
        at = _ms_or_none(schedule["at"])
        assert at is not None
        return OnceTiming(at)
    if kind == "after":
        return NEVER
    raise ValueError(f"unknown schedule type {kind!r}")


def count_between(timing: Timing, since_ms: int, until_ms: int, cap: int) -> tuple[int, int | None, bool]:
    """The occurrences in (since, until]: how many, the last of them, and whether all were counted
    (else the first ``cap`` were). An interval's are counted by arithmetic, however many; any
    other timing's one by one."""
    if isinstance(timing, IntervalTiming):
        first = timing.next_after(since_ms)
        top = until_ms if timing.end_ms is None else min(until_ms, timing.end_ms)
        if first is None or first > top:
            return 0, None, True
        top = timing.anchor_ms + (top - timing.anchor_ms) // timing.every_ms * timing.every_ms
        return (top - first) // timing.every_ms + 1, top, True
    n = 0
    found: int | None = None
    t = timing.next_after(since_ms)
    while t is not None and t <= until_ms:
        if n >= cap:
            return n, found, False
        n, found = n + 1, t
        nxt = timing.next_after(t)
        t = nxt if nxt is None or nxt > t else None  # a timing that does not move on ends the count
    return n, found, True


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
    "CronSyntaxError",
    "CronTiming",
    "EarliestOf",
    "count_between",
    "FoldPolicy",
    "GapPolicy",
    "IntervalTiming",
    "JitteredTiming",
    "OnceTiming",
    "Timing",
    "TimingMaker",
    "cron_expressions",
    "cron_spacing_seconds",
    "cron_rule",
    "next_times",
    "phase_for",
    "resolved_expressions",
    "timing_from_dict",
    "timing_maker",
    "validate_cron",
    "validate_timezone",
]
