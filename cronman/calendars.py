"""Business calendars: days on which a job does not fire, and a timing that skips them.

A calendar is a time zone and the local dates it excludes: single dates, inclusive date ranges,
dates every year (``MM-DD``; ``02-29`` only in leap years) and weekdays. An occurrence is
excluded when its local date in the calendar's zone is excluded. The document (``PUT
/v1/calendars/{name}``)::

    {"timezone": "Europe/Berlin",
     "exclude": {"dates": ["2026-12-25"], "ranges": [{"from": "2026-12-24", "to": "2026-12-31"}],
                 "annual": ["01-01"], "weekdays": ["sat", "sun"]}}

`calendar_from_dict` validates it and raises `CalendarError` (a ValueError) whose message and
``field`` name what is wrong. `CalendarTiming` wraps any timing: ``next_after`` returns the first
occurrence no calendar excludes, jumping over an excluded day (or a run of excluded dates and
ranges) at once. It gives up (None) after `MAX_SKIPS` jumps, or when excluded weekdays and annual
dates alone have held occurrences back for `MAX_SKIP_DAYS` (a job that only fires on days its
calendars exclude: that costs a few milliseconds once). ``excluded_by`` names the calendar that
excludes an occurrence, so a node can record it ``skipped`` with that name.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from cronman.schedule import Timing, validate_timezone, zone
from cronman.timeutil import MAX_INSTANT, MIN_INSTANT, to_ms

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_ENTRIES = 10_000  # dates + ranges + annual dates in one calendar
MAX_SKIPS = 1000  # excluded days (or ranges) jumped over in one next_after before giving up
MAX_SKIP_DAYS = 5 * 366  # ... or when excluded weekdays and annual dates hold it back this long
_DAY_MS = 86_400_000
_FIRST_DATE = MIN_INSTANT.date()
_LAST_DATE = MAX_INSTANT.date() - timedelta(days=1)
_FIRST_S = to_ms(datetime(2, 1, 1)) // 1000
_LAST_S = to_ms(datetime(9990, 1, 1)) // 1000
_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", re.ASCII)
_ANNUAL = re.compile(r"^([0-9]{2})-([0-9]{2})$", re.ASCII)


class CalendarError(ValueError):
    """A calendar document cronman cannot use; ``field`` is the path of the value at fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Calendar:
    timezone: str = "UTC"
    dates: frozenset[date] = frozenset()
    ranges: tuple[tuple[date, date], ...] = ()  # inclusive, sorted by start, not overlapping
    annual: frozenset[tuple[int, int]] = frozenset()  # (month, day)
    weekdays: frozenset[int] = frozenset()  # 0 = Monday
    _spans: tuple[tuple[date, date], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        error = validate_timezone(self.timezone)
        if error:
            raise CalendarError(error, "timezone")
        object.__setattr__(self, "ranges", _merged(self.ranges))
        # dates and ranges as merged spans, so a run of excluded dates is jumped over at once
        object.__setattr__(self, "_spans", _merged(self.ranges + tuple((d, d) for d in self.dates)))

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)

    def local_date(self, instant_ms: int) -> date:
        seconds = min(max(instant_ms // 1000, _FIRST_S), _LAST_S)  # total: datetime stops at 9999
        return datetime.fromtimestamp(seconds, self.zone).date()

    def excludes(self, instant_ms: int) -> bool:
        """Whether the local date of the instant, in the calendar's zone, is excluded."""
        return self.excludes_date(self.local_date(instant_ms))

    def excludes_date(self, d: date) -> bool:
        return d.weekday() in self.weekdays or (d.month, d.day) in self.annual or self.span_end(d) is not None

    @property
    def excludes_every_day(self) -> bool:
        return len(self.weekdays) == 7

    def next_included(self, d: date) -> date | None:
        """The first date after ``d`` that is not excluded (None past the accepted range)."""
        for _ in range(MAX_SKIPS):
            end = self.span_end(d) or d
            if end >= _LAST_DATE:
                return None
            d = end + timedelta(days=1)
            if not self.excludes_date(d):
                return d
        return None

    def start_of(self, d: date) -> int:
        """The first instant (ms) of a local date; at a gap or fold at midnight, the earliest
        reading of midnight (never later than the day's first instant)."""
        midnight = datetime(d.year, d.month, d.day)
        return min(to_ms(midnight.replace(tzinfo=self.zone, fold=f)) for f in (0, 1))

    def span_end(self, d: date) -> date | None:
        """The last day of the excluded date or range holding ``d``, or None."""
        i = bisect_right(self._spans, (d, date.max)) - 1
        if i >= 0 and self._spans[i][0] <= d <= self._spans[i][1]:
            return self._spans[i][1]
        return None


def _merged(ranges: tuple[tuple[date, date], ...]) -> tuple[tuple[date, date], ...]:
    out: list[tuple[date, date]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + timedelta(days=1):
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CalendarTiming:
    """A timing whose occurrences on days excluded by any of the named calendars are skipped."""

    base: Timing
    calendars: tuple[tuple[str, Calendar], ...]

    def excluded_by(self, instant_ms: int) -> str | None:
        """The name of the first calendar that excludes the instant, or None."""
        for name, cal in self.calendars:
            if cal.excludes(instant_ms):
                return name
        return None

    def next_after(self, after_ms: int) -> int | None:
        t = self.base.next_after(after_ms)
        if t is None or not self.calendars:
            return t
        # Give up (None) when occurrences keep falling on excluded weekdays or annual dates for
        # MAX_SKIP_DAYS; the days of explicit dates and ranges jumped over do not count.
        limit = t + MAX_SKIP_DAYS * _DAY_MS
        for _ in range(MAX_SKIPS):
            if t is None or t > limit:
                return None
            cal = next((c for _, c in self.calendars if c.excludes(t)), None)
            if cal is None:
                return t
            if cal.excludes_every_day:
                return None
            day = cal.local_date(t)
            resume = cal.next_included(day)
            if resume is None:
                return None
            span = cal.span_end(day)
            if span is not None:
                limit += ((span - day).days + 1) * _DAY_MS
            t = self.base.next_after(max(t, cal.start_of(resume) - 1))
        return None


def timing_with(base: Timing, names: Sequence[str], found: Mapping[str, Calendar]) -> Timing:
    """A job's timing with the calendars it names applied (a name not in ``found`` excludes nothing)."""
    cals = tuple((n, found[n]) for n in names if n in found)
    return CalendarTiming(base, cals) if cals else base


# ---------------------------------------------------------------------------------------- documents
def calendar_from_dict(doc: object) -> Calendar:
    """Validate a calendar document (the shape in the module docstring) and build its Calendar."""
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
    dates = [_date(v, f"exclude.dates[{i}]") for i, v in enumerate(_list(exclude, "dates"))]
    ranges = [_range(v, f"exclude.ranges[{i}]") for i, v in enumerate(_list(exclude, "ranges"))]
    annual = [_annual(v, f"exclude.annual[{i}]") for i, v in enumerate(_list(exclude, "annual"))]
    weekdays = [_weekday(v, f"exclude.weekdays[{i}]") for i, v in enumerate(_list(exclude, "weekdays"))]
    if len(dates) + len(ranges) + len(annual) > MAX_ENTRIES:
        raise CalendarError(f"a calendar holds at most {MAX_ENTRIES} dates, ranges and annual dates", "exclude")
    return Calendar(tz, frozenset(dates), tuple(ranges), frozenset(annual), frozenset(weekdays))


def calendar_to_dict(cal: Calendar) -> dict:
    """The document of a calendar (ranges merged, entries sorted)."""
    return {
        "timezone": cal.timezone,
        "exclude": {
            "dates": sorted(d.isoformat() for d in cal.dates),
            "ranges": [{"from": a.isoformat(), "to": b.isoformat()} for a, b in cal.ranges],
            "annual": sorted(f"{m:02d}-{d:02d}" for m, d in cal.annual),
            "weekdays": [WEEKDAYS[w] for w in sorted(cal.weekdays)],
        },
    }


def _only(doc: dict, allowed: set[str], where: str) -> None:
    for key in doc:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            raise CalendarError(f"unknown field {str(key)[:40]!r}; allowed: {', '.join(sorted(allowed))}", path)


def _list(doc: dict, key: str) -> list:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise CalendarError(f"exclude.{key} must be a list", f"exclude.{key}")
    if len(value) > MAX_ENTRIES:
        raise CalendarError(f"exclude.{key} holds at most {MAX_ENTRIES} entries", f"exclude.{key}")
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
    "MAX_SKIPS",
    "Calendar",
    "CalendarError",
    "CalendarTiming",
    "calendar_from_dict",
    "calendar_to_dict",
    "timing_with",
    "WEEKDAYS",
]
