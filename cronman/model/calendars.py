"""Business calendars: days on which a job does not fire, and the timings that honour them.

A calendar is a time zone and the local dates it excludes: single dates, inclusive date ranges,
dates every year (``MM-DD``; ``02-29`` only in leap years) and weekdays. An occurrence is
excluded when its local date in the calendar's zone is excluded. The document (``PUT
/v1/calendars/{name}``)::

    {"timezone": "Europe/Berlin",
     "exclude": {"dates": ["2026-12-25"], "ranges": [{"from": "2026-12-24", "to": "2026-12-31"}],
                 "annual": ["01-01"], "weekdays": ["sat", "sun"]}}

`calendar_from_dict` validates it and raises `CalendarError` (a ValueError) whose message and
``field`` name what is wrong; `calendar_from_stored` reads a document that was validated when it
was written, without checking each entry again (a node loads a 10,000-date calendar in
milliseconds). A calendar is kept compactly: its dates, ranges and their merged spans as sorted
arrays of day ordinals (4 bytes a day), annual dates and weekdays as bit masks.

**Excluded spans.** An instant is excluded when one of a job's calendars excludes its local date. A
span is a maximal stretch of excluded instants (a run of consecutive excluded days, across the
calendars and their zones), from the first instant of its first day to the first instant of the day
after it (`excluded_span`). The first instant of a local date is its midnight; where midnight does
not exist (a daylight-saving gap at midnight: America/Santiago, America/Havana, Africa/Cairo,
Asia/Beirut...) it is the first instant after the gap.

**Timings.** `CalendarTiming` gives the occurrences no calendar excludes, jumping over a whole span
at once: what is *due* (``/next``, ``next_fire_at``, backfills, misfire plans and the watchdog all
use `timing_with`). It gives up (None) only when a span never ends, or when occurrences keep
falling on excluded weekdays and annual dates for `MAX_SKIP_DAYS` (a job that only fires on days its
calendars exclude); the days of explicit dates and ranges jumped over do not count. `FiringTiming`
gives what a node's timer fires: the due occurrences, and the first occurrence of each excluded
span, which the node records as one ``skipped`` row standing for the whole span (`skip_summary`
counts its occurrences). A job firing every second costs one row for an excluded day, not 86,400,
and never steps through a span occurrence by occurrence.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from cronman.model.schedule import Timing, count_between, validate_timezone, zone
from cronman.model.timeutil import MAX_INSTANT, MIN_INSTANT, to_ms

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_ENTRIES = 10_000  # dates + ranges + annual dates in one calendar, by default (calendar_max_entries)
MAX_SKIP_DAYS = 5 * 366  # a due timing gives up when excluded weekdays and annual dates hold it back this long
MAX_RUN_DAYS = 2 * MAX_SKIP_DAYS  # a run of excluded days longer than this (walked a day at a time) never ends
MAX_SKIPS_COUNTED = 1000  # occurrences a skipped span's row counts one by one (an interval's: all, by arithmetic)
_DAY_MS = 86_400_000
_FIRST_DATE = MIN_INSTANT.date()
_LAST_DATE = MAX_INSTANT.date() - timedelta(days=1)
_FIRST_ORD = _FIRST_DATE.toordinal()
_LAST_ORD = _LAST_DATE.toordinal()
_FIRST_S = to_ms(datetime(2, 1, 1)) // 1000
_LAST_S = to_ms(datetime(9990, 1, 1)) // 1000
_ALL_WEEKDAYS = 0x7F
_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", re.ASCII)
_ANNUAL = re.compile(r"^([0-9]{2})-([0-9]{2})$", re.ASCII)


class CalendarError(ValueError):
    """A calendar document cronman cannot use; ``field`` is the path of the value at fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class Calendar:
    """A time zone and the local dates it excludes (see the module docstring). Built from dates,
    (first, last) date pairs, (month, day) pairs and weekday numbers (0 = Monday)."""

    __slots__ = ("timezone", "_zone", "_weekdays", "_annual", "_dates", "_ranges", "_starts", "_ends")

    def __init__(
        self,
        timezone: str = "UTC",
        dates: Iterable[date] = (),
        ranges: Iterable[tuple[date, date]] = (),
        annual: Iterable[tuple[int, int]] = (),
        weekdays: Iterable[int] = (),
    ) -> None:
        self._build(
            timezone,
            [d.toordinal() for d in dates],
            [(a.toordinal(), b.toordinal()) for a, b in ranges],
            _annual_bits(annual),
            _weekday_mask(weekdays),
        )

    @classmethod
    def of_ordinals(
        cls, timezone: str, dates: list[int], ranges: list[tuple[int, int]], annual: int, weekdays: int
    ) -> Calendar:
        """A calendar from day ordinals and bit masks (``annual``: bit ``month * 32 + day``)."""
        cal = cls.__new__(cls)
        cal._build(timezone, dates, ranges, annual, weekdays)
        return cal

    def _build(
        self, timezone: str, dates: list[int], ranges: list[tuple[int, int]], annual: int, weekdays: int
    ) -> None:
        error = validate_timezone(timezone)
        if error:
            raise CalendarError(error, "timezone")
        self.timezone = timezone
        self._zone = zone(timezone)
        self._weekdays = weekdays
        self._annual = annual
        self._dates = array("i", sorted(set(dates)))
        merged = _merged(sorted(ranges))
        self._ranges = array("i", [o for pair in merged for o in pair])  # first, last, first, last...
        spans = _merged(sorted([(o, o) for o in self._dates] + merged)) if merged else _runs(self._dates)
        starts = array("i", [a for a, _ in spans])
        ends = array("i", [b for _, b in spans])
        # (shared where equal: a calendar of separate dates keeps one array, not three)
        if starts == self._dates:
            starts = self._dates
        self._starts = starts
        self._ends = starts if ends == starts else ends

    # -- the document's view
    @property
    def dates(self) -> frozenset[date]:
        return frozenset(date.fromordinal(o) for o in self._dates)

    @property
    def ranges(self) -> tuple[tuple[date, date], ...]:
        """Inclusive, sorted by start, not overlapping nor touching."""
        r = self._ranges
        return tuple((date.fromordinal(r[i]), date.fromordinal(r[i + 1])) for i in range(0, len(r), 2))

    @property
    def annual(self) -> frozenset[tuple[int, int]]:
        return frozenset((b // 32, b % 32) for b in range(13 * 32) if self._annual >> b & 1)

    @property
    def weekdays(self) -> frozenset[int]:
        return frozenset(w for w in range(7) if self._weekdays >> w & 1)

    @property
    def zone(self) -> ZoneInfo:
        return self._zone

    @property
    def span_count(self) -> int:
        """How many runs of explicit dates and ranges the calendar holds."""
        return len(self._starts)

    @property
    def nbytes(self) -> int:
        """About what the calendar's days take in memory (its arrays, each counted once)."""
        arrays = {id(a): a for a in (self._dates, self._ranges, self._starts, self._ends)}
        return sum(a.buffer_info()[1] * a.itemsize + 64 for a in arrays.values()) + 120

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Calendar):
            return NotImplemented
        return (self.timezone, self._weekdays, self._annual, self._dates, self._ranges) == (
            other.timezone,
            other._weekdays,
            other._annual,
            other._dates,
            other._ranges,
        )

    def __hash__(self) -> int:
        return hash((self.timezone, self._weekdays, self._annual, self._dates.tobytes(), self._ranges.tobytes()))

    def __repr__(self) -> str:
        return (
            f"Calendar({self.timezone!r}, {len(self._dates)} dates, {len(self._ranges) // 2} ranges, "
            f"annual={sorted(self.annual)}, weekdays={sorted(self.weekdays)})"
        )

    # -- days
    def local_date(self, instant_ms: int) -> date:
        seconds = min(max(instant_ms // 1000, _FIRST_S), _LAST_S)  # total: datetime stops at 9999
        return datetime.fromtimestamp(seconds, self._zone).date()

    def excludes(self, instant_ms: int) -> bool:
        """Whether the local date of the instant, in the calendar's zone, is excluded."""
        return self.excludes_date(self.local_date(instant_ms))

    def excludes_date(self, d: date) -> bool:
        return bool(
            self._weekdays >> d.weekday() & 1
            or self._annual >> (d.month * 32 + d.day) & 1
            or self._span_of(d.toordinal()) is not None
        )

    def _excludes_ordinal(self, o: int) -> bool:
        return self.excludes_date(date.fromordinal(o))

    @property
    def excludes_every_day(self) -> bool:
        return self._weekdays == _ALL_WEEKDAYS

    def _span_of(self, o: int) -> tuple[int, int] | None:
        """The explicit span (merged dates and ranges: first and last day) holding day ``o``."""
        i = bisect_right(self._starts, o) - 1
        if i >= 0 and self._ends[i] >= o:
            return self._starts[i], self._ends[i]
        return None

    def span_end(self, d: date) -> date | None:
        """The last day of the excluded date or range holding ``d``, or None."""
        span = self._span_of(d.toordinal())
        return None if span is None else date.fromordinal(span[1])

    def run(self, d: date) -> tuple[date | None, date | None]:
        """The first and last days of the run of consecutive excluded days holding ``d`` (which
        the calendar excludes); None for a side that runs past what is computed (every weekday
        excluded, or a run walked a day at a time for longer than `MAX_RUN_DAYS`)."""
        first, last, _ = self._run(d.toordinal())
        return (
            None if first is None else date.fromordinal(first),
            None if last is None else date.fromordinal(last),
        )

    def _run(self, o: int) -> tuple[int | None, int | None, bool]:
        """``run`` by ordinals, and whether explicit dates or ranges made any of it."""
        if self._weekdays == _ALL_WEEKDAYS:
            return None, None, False
        explicit = False
        last: int | None = o
        for _ in range(MAX_RUN_DAYS):
            assert last is not None
            span = self._span_of(last)
            if span is not None:
                last, explicit = span[1], True
            if last >= _LAST_ORD:
                last = None
                break
            if not self._excludes_ordinal(last + 1):
                break
            last += 1
        else:
            last = None
        first: int | None = o
        for _ in range(MAX_RUN_DAYS):
            assert first is not None
            span = self._span_of(first)
            if span is not None:
                first, explicit = span[0], True
            if first <= _FIRST_ORD:
                first = None
                break
            if not self._excludes_ordinal(first - 1):
                break
            first -= 1
        else:
            first = None
        return first, last, explicit

    def next_included(self, d: date) -> date | None:
        """The first date after ``d`` that is not excluded (None past what is computed)."""
        o = d.toordinal()
        if self._excludes_ordinal(o):
            last = self._run(o)[1]
            return None if last is None or last >= _LAST_ORD else date.fromordinal(last + 1)
        nxt = o + 1
        if nxt > _LAST_ORD:
            return None
        if not self._excludes_ordinal(nxt):
            return date.fromordinal(nxt)
        last = self._run(nxt)[1]
        return None if last is None or last >= _LAST_ORD else date.fromordinal(last + 1)

    def start_of(self, d: date) -> int:
        """The first instant (ms) of a local date: its midnight, the first of two at a fold;
        where midnight falls in a gap, the first instant after the gap (the transition)."""
        midnight = datetime(d.year, d.month, d.day)
        readings = sorted(to_ms(midnight.replace(tzinfo=self._zone, fold=f)) for f in (0, 1))
        for t in readings:
            local = datetime.fromtimestamp(t // 1000, self._zone)
            if local.replace(tzinfo=None) == midnight:
                return t
        # Midnight does not exist: the earlier reading lies before the gap (on the day before),
        # the later one after it. The day starts at the first second whose local date is d.
        lo, hi = readings[0] // 1000, readings[1] // 1000
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, self._zone).date() >= d:
                hi = mid
            else:
                lo = mid
        return hi * 1000

    def span_at(self, instant_ms: int) -> tuple[int | None, int | None, bool] | None:
        """The stretch of instants around ``instant_ms`` whose local dates the calendar excludes
        (first instant, first instant after; None: unbounded) and whether explicit dates or ranges
        made it; None when the instant's date is not excluded."""
        d = self.local_date(instant_ms)
        if not self.excludes_date(d):
            return None
        first, last, explicit = self._run(d.toordinal())
        start = None if first is None else min(self.start_of(date.fromordinal(first)), instant_ms)
        end = None if last is None else self._end_after(instant_ms, date.fromordinal(last + 1))
        return start, end, explicit

    def _end_after(self, instant_ms: int, d: date) -> int:
        """The first instant of ``d`` after ``instant_ms``: at a fold across midnight (clocks going
        back from just after midnight to the day before, as America/Goose_Bay until 2011) the
        day before comes back for a while, and ends at the later reading of midnight."""
        end = self.start_of(d)
        if end > instant_ms:
            return end
        later = to_ms(datetime(d.year, d.month, d.day).replace(tzinfo=self._zone, fold=1))
        return later if later > instant_ms else instant_ms + 1


def _weekday_mask(weekdays: Iterable[int]) -> int:
    mask = 0
    for w in weekdays:
        mask |= 1 << w
    return mask


def _annual_bits(annual: Iterable[tuple[int, int]]) -> int:
    bits = 0
    for month, day in annual:
        bits |= 1 << (month * 32 + day)
    return bits


def _merged(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted (first, last) day pairs, overlapping or touching ones merged."""
    out: list[tuple[int, int]] = []
    for start, end in pairs:
        if out and start <= out[-1][1] + 1:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _runs(days: array) -> list[tuple[int, int]]:
    """Sorted distinct days as runs of consecutive days."""
    out: list[tuple[int, int]] = []
    for o in days:
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


# ---------------------------------------------------------------------------------------- spans
def excluded_span(calendars: Sequence[Calendar], instant_ms: int) -> tuple[int | None, int | None] | None:
    """The span of excluded instants holding ``instant_ms`` (first instant, first instant after;
    None: unbounded), across the calendars and their zones; None when none excludes it."""
    span = _span(calendars, instant_ms)
    return None if span is None else (span[0], span[1])


def _span(calendars: Sequence[Calendar], t: int) -> tuple[int | None, int | None, bool] | None:
    lo: int | None = None
    hi: int | None = None
    explicit = hit = False
    for cal in calendars:
        s = cal.span_at(t)
        if s is None:
            continue
        if not hit:
            lo, hi, explicit, hit = s[0], s[1], s[2], True
        else:
            lo = None if lo is None or s[0] is None else min(lo, s[0])
            hi = None if hi is None or s[1] is None else max(hi, s[1])
            explicit = explicit or s[2]
    if not hit or len(calendars) == 1:
        return (lo, hi, explicit) if hit else None
    # another calendar may exclude the day after (or before) in its own zone: the span goes on
    for _ in range(MAX_RUN_DAYS):
        grown = False
        for cal in calendars:
            if hi is not None and (s := cal.span_at(hi)) is not None:
                hi, explicit, grown = s[1], explicit or s[2], True
            if lo is not None and (s := cal.span_at(lo - 1)) is not None:
                lo, explicit, grown = s[0], explicit or s[2], True
        if not grown:
            return lo, hi, explicit
    return None, None, explicit


# ---------------------------------------------------------------------------------------- timings
@dataclass(frozen=True, slots=True)
class CalendarTiming:
    """A timing whose occurrences on days excluded by any of the named calendars are not due."""

    base: Timing
    calendars: tuple[tuple[str, Calendar], ...]

    def excluded_by(self, instant_ms: int) -> str | None:
        """The name of the first calendar that excludes the instant, or None."""
        for name, cal in self.calendars:
            if cal.excludes(instant_ms):
                return name
        return None

    @property
    def _cals(self) -> tuple[Calendar, ...]:
        return tuple(c for _, c in self.calendars)

    def next_after(self, after_ms: int) -> int | None:
        t = self.base.next_after(after_ms)
        if t is None or not self.calendars:
            return t
        cals = self._cals
        limit = t + MAX_SKIP_DAYS * _DAY_MS
        # Every pass jumps over one whole span, and spans made of weekdays and annual dates move
        # toward the limit a day or more each; this bound is never reached first.
        for _ in range(2 * MAX_SKIP_DAYS + sum(c.span_count for c in cals) + 2):
            span = _span(cals, t)
            if span is None:
                return t
            lo, hi, explicit = span
            if hi is None:
                return None
            if explicit:  # explicit dates and ranges jumped over do not count toward giving up
                limit += hi - (t if lo is None else max(lo, t))
            t = self.base.next_after(hi - 1)
            if t is None or t > limit:
                return None
        return None


@dataclass(frozen=True, slots=True)
class FiringTiming:
    """What a node's timer fires of a job with calendars: the due occurrences (``due``), and the
    first occurrence of each excluded span (after ``since_ms``, when given: a job made during a
    span has one for the rest of it), which is not delivered but recorded as one ``skipped`` row
    for the whole span (see `skip_summary`). One jump a call at most: a span is never walked."""

    due: CalendarTiming
    since_ms: int | None = None

    def next_after(self, after_ms: int) -> int | None:
        return self.next_with_span(after_ms)[0]

    def next_with_span(self, after_ms: int) -> tuple[int | None, tuple[int | None, int | None] | None]:
        """``next_after``, and the bounds of the excluded span the occurrence is the first of
        (None: it is due)."""
        base = self.due.base
        t = base.next_after(after_ms)
        if t is None or not self.due.calendars:
            return t, None
        span = _span(self.due._cals, t)
        if span is None:
            return t, None
        lo, hi, _ = span
        if lo is not None:
            origin = lo - 1 if self.since_ms is None else max(lo - 1, self.since_ms)
            if base.next_after(origin) == t:
                return t, (lo, hi)  # the span's first occurrence: its summary
        if hi is None:
            return None, None
        # The instant ``hi`` is excluded by no calendar: the next occurrence is due, or the first
        # occurrence of a span that starts after ``hi``.
        t = base.next_after(hi - 1)
        if t is None:
            return None, None
        after = _span(self.due._cals, t)
        return t, None if after is None else (after[0], after[1])

    def span_at(self, t: int) -> tuple[int | None, int | None] | None:
        """The bounds of the excluded span ``t`` lies in (None: ``t`` is not excluded)."""
        span = _span(self.due._cals, t) if self.due.calendars else None
        return None if span is None else (span[0], span[1])

    def resume_after(self, after_ms: int, recorded: tuple[int | None, int | None] | None = None) -> int | None:
        """The next occurrence to fire after ``after_ms`` when the calendars just changed: as
        ``next_after``, except that an occurrence in the middle of a span comes first (its row
        says why nothing arrives for the rest of the span), unless the span is ``recorded``, the
        one whose row the timer fired already (a calendar written again and again while a job is in
        a span it did not change costs no row each time)."""
        t = self.due.base.next_after(after_ms)
        span = None if t is None else self.span_at(t)
        if span is not None and span != recorded:
            return t
        return self.next_after(after_ms)


class SkipSummary(NamedTuple):
    """The occurrences of an excluded span from one of them on: how many (None: the span never
    ends), the last (None: likewise), the first instant after the span, and whether all were
    counted (else ``occurrences`` is how many were, `MAX_SKIPS_COUNTED`)."""

    occurrences: int | None
    last_ms: int | None
    until_ms: int | None
    complete: bool = True


def skip_summary(timing: CalendarTiming, instant_ms: int, cap: int = MAX_SKIPS_COUNTED) -> SkipSummary | None:
    """What the row of a skipped span says, from the occurrence at ``instant_ms`` to the span's end;
    None when no calendar excludes the instant. Bounded: an interval's occurrences are counted by
    arithmetic, any other timing's up to ``cap`` one by one."""
    span = _span(timing._cals, instant_ms)
    if span is None:
        return None
    hi = span[1]
    if hi is None:
        return SkipSummary(None, None, None, False)
    n, last, complete = count_between(timing.base, instant_ms - 1, hi - 1, cap)
    return SkipSummary(n, last, hi, complete)


def timing_with(base: Timing, names: Sequence[str], found: Mapping[str, Calendar]) -> Timing:
    """A job's due occurrences: its timing with the calendars it names applied (a name not in
    ``found`` excludes nothing). The one definition of what is due, for the nodes, the API and the
    watchdog alike."""
    cals = tuple((n, found[n]) for n in names if n in found)
    return CalendarTiming(base, cals) if cals else base


def firing_timing(
    base: Timing, names: Sequence[str], found: Mapping[str, Calendar], since_ms: int | None = None
) -> Timing:
    """What a node's timer fires of a job (see `FiringTiming`): ``timing_with``'s occurrences and
    the first occurrence of each excluded span (after ``since_ms``: the job's last change)."""
    due = timing_with(base, names, found)
    return FiringTiming(due, since_ms) if isinstance(due, CalendarTiming) else due


# ---------------------------------------------------------------------------------------- documents
def calendar_from_dict(doc: object, max_entries: int = MAX_ENTRIES) -> Calendar:
    """Validate a calendar document (the shape in the module docstring) and build its Calendar;
    it holds at most ``max_entries`` dates, ranges and annual dates together."""
    if not isinstance(doc, dict):
        raise CalendarError("a calendar is an object with timezone and exclude", "")
    _only(doc, {"timezone", "exclude"}, "")
    tz = doc.get("timezone", "UTC")
    if not isinstance(tz, str):
        raise CalendarError("timezone must be a string, an IANA name such as Europe/Berlin", "timezone")
    exclude = doc.get("exclude", {})
    if not isinstance(exclude, dict):
        raise CalendarError("exclude must be an object with dates, ranges, annual and weekdays", "exclude")
    _only(exclude, {"dates", "ranges", "annual", "weekdays"}, "exclude")
    lists = {key: _list(exclude, key, max_entries) for key in ("dates", "ranges", "annual", "weekdays")}
    entries = len(lists["dates"]) + len(lists["ranges"]) + len(lists["annual"])
    if entries > max_entries:
        raise CalendarError(f"a calendar holds at most {max_entries} dates, ranges and annual dates", "exclude")
    dates = [_date(v, f"exclude.dates[{i}]") for i, v in enumerate(lists["dates"])]
    ranges = [_range(v, f"exclude.ranges[{i}]") for i, v in enumerate(lists["ranges"])]
    annual = [_annual(v, f"exclude.annual[{i}]") for i, v in enumerate(lists["annual"])]
    weekdays = [_weekday(v, f"exclude.weekdays[{i}]") for i, v in enumerate(lists["weekdays"])]
    return Calendar(tz, dates, ranges, annual, weekdays)


def document_entries(doc: object) -> int:
    """How many dates, ranges and annual dates a calendar document lists (0 for what is not one):
    what a quota on a calendar's size counts, before anything is parsed."""
    exclude = doc.get("exclude") if isinstance(doc, dict) else None
    if not isinstance(exclude, dict):
        return 0
    return sum(len(v) for k in ("dates", "ranges", "annual") if isinstance(v := exclude.get(k), list))


def calendar_from_stored(doc: Mapping[str, Any]) -> Calendar:
    """A stored document, validated when it was written, read without checking each entry again
    (ValueError, TypeError or KeyError on what it cannot read)."""
    exclude = doc.get("exclude") or {}
    dates = [date.fromisoformat(v).toordinal() for v in exclude.get("dates") or ()]
    ranges = [
        (date.fromisoformat(r["from"]).toordinal(), date.fromisoformat(r["to"]).toordinal())
        for r in exclude.get("ranges") or ()
    ]
    for first, last in [(min(dates), max(dates))] if dates else []:
        if first < _FIRST_ORD or last > _LAST_ORD:
            raise ValueError(f"a date is outside {_FIRST_DATE} .. {_LAST_DATE}")
    for first, last in ranges:
        if first < _FIRST_ORD or last > _LAST_ORD or last < first:
            raise ValueError(f"a range is outside {_FIRST_DATE} .. {_LAST_DATE} or ends before it starts")
    annual = 0
    for v in exclude.get("annual") or ():
        month, day = int(v[:2]), int(v[3:5])
        if not (1 <= month <= 12 and 1 <= day <= 31):
            raise ValueError(f"{v!r} is not a day of the year")
        annual |= 1 << (month * 32 + day)
    weekdays = _weekday_mask(WEEKDAYS.index(str(w).lower()) for w in exclude.get("weekdays") or ())
    return Calendar.of_ordinals(str(doc.get("timezone") or "UTC"), dates, ranges, annual, weekdays)


def calendar_to_dict(cal: Calendar) -> dict:
    """The document of a calendar (ranges merged, entries sorted)."""
    return {
        "timezone": cal.timezone,
        "exclude": {
            "dates": [date.fromordinal(o).isoformat() for o in cal._dates],
            "ranges": [{"from": a.isoformat(), "to": b.isoformat()} for a, b in cal.ranges],
            "annual": [f"{m:02d}-{d:02d}" for m, d in sorted(cal.annual)],
            "weekdays": [WEEKDAYS[w] for w in sorted(cal.weekdays)],
        },
    }


def _only(doc: dict, allowed: set[str], where: str) -> None:
    for key in doc:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            raise CalendarError(f"unknown field {str(key)[:40]!r}; allowed: {', '.join(sorted(allowed))}", path)


def _list(doc: dict, key: str, max_entries: int) -> list:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise CalendarError(f"exclude.{key} must be a list", f"exclude.{key}")
    if len(value) > max_entries:
        raise CalendarError(f"exclude.{key} holds at most {max_entries} entries", f"exclude.{key}")
    return value


def _date(value: object, field: str) -> date:
    if not isinstance(value, str) or not _DATE.match(value):
        raise CalendarError(f"{field} must be a date written YYYY-MM-DD, got {str(value)[:40]!r}", field)
    try:
        d = date.fromisoformat(value)
    except ValueError:
        raise CalendarError(f"{field}: {value!r} is not a date (YYYY-MM-DD)", field) from None
    if not _FIRST_DATE <= d <= _LAST_DATE:
        raise CalendarError(f"{field}: {value} is outside {_FIRST_DATE} .. {_LAST_DATE}", field)
    return d


def _range(value: object, field: str) -> tuple[date, date]:
    if not isinstance(value, dict) or set(value) != {"from", "to"}:
        raise CalendarError(f'{field} must be an object {{"from": "YYYY-MM-DD", "to": "YYYY-MM-DD"}}', field)
    start, end = _date(value["from"], f"{field}.from"), _date(value["to"], f"{field}.to")
    if end < start:
        raise CalendarError(f"{field}: to ({end}) is before from ({start})", f"{field}.to")
    return start, end


def _annual(value: object, field: str) -> tuple[int, int]:
    m = _ANNUAL.match(value) if isinstance(value, str) else None
    if m is None:
        raise CalendarError(f"{field} must be a date every year written MM-DD, got {str(value)[:40]!r}", field)
    month, day = int(m.group(1)), int(m.group(2))
    try:
        date(2000, month, day)  # a leap year: 02-29 is a day of the year
    except ValueError:
        raise CalendarError(f"{field}: {value!r} is not a day of the year (MM-DD)", field) from None
    return month, day


def _weekday(value: object, field: str) -> int:
    if not isinstance(value, str) or value.lower() not in WEEKDAYS:
        raise CalendarError(f"{field} must be one of {', '.join(WEEKDAYS)}, got {str(value)[:40]!r}", field)
    return WEEKDAYS.index(value.lower())


__all__ = [
    "MAX_ENTRIES",
    "MAX_SKIP_DAYS",
    "Calendar",
    "CalendarError",
    "CalendarTiming",
    "FiringTiming",
    "SkipSummary",
    "calendar_from_dict",
    "calendar_from_stored",
    "calendar_to_dict",
    "document_entries",
    "excluded_span",
    "firing_timing",
    "skip_summary",
    "timing_with",
    "WEEKDAYS",
]
