"""Cron expressions on the wall clock: parsing, and the first matching wall time after another.

Wall times are whole seconds counted from 1970-01-01T00:00 on a local calendar with no time zone
("local seconds"); `cronman.model.schedule` maps them to instants with the daylight-saving policies.

Syntax: 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds field,
or one alias: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly. Each field is a
list of elements; an element is ``*``, a value (a number, or a name for months and weekdays), a
range ``a-b``, each with an optional step ``/n``:

* ``a-b`` with ``a <= b`` is a to b (``20-20`` is 20 alone); with ``a > b`` it wraps around the
  field (``22-2``: 22, 23, 0, 1, 2; ``FRI-MON``), and a step counts on across the wrap;
* ``*/n`` and ``a/n`` run from the field's start (or ``a``) to its end; in day-of-week that end is
  Saturday, 6 (``1/2`` is Monday, Wednesday, Friday: Sunday is in it only when written, 0 or 7);
* a step may be longer than its range: ``11-58/55`` and ``6-6/8`` are 11 and 6.

Day fields take more:

* day-of-month: ``L`` (last day), ``L-2`` (two days before it), ``LW`` (last weekday,
  Monday-Friday), ``L-2W`` (the weekday nearest L-2), ``15W`` or ``W15`` (the weekday nearest the
  15th within its month; a day past the month's end counts as its last day);
* day-of-week: ``6#3`` (third Saturday; ``n`` is 1-5), ``5L`` or ``L5`` (last Friday); names work
  too (``FRI#2``, ``FRIL``); 0 and 7 are Sunday;
* these mix freely with plain values in a list (``1,15,L``; ``MON,5L``); ``?`` is ``*``;
* a day field is restricted when it leaves a day out (``*``, ``?``, ``*/1``, ``1-31`` and ``0-7``
  do not). When both are, a day matches when either does (the classic cron OR); when one is,
  it alone decides.

``H`` (hashed) values, as Jenkins has them (``H``, ``H/15``, ``H(0-29)``, ``H(0-29)/10``), come
from the job's namespace and id (`cronman.model.cron_hash`); the plain grammar of the fields is in
`cronman.model.cron_fields`. Where cron dialects differ, docs/api.md says which way cronman reads an
expression.

Evaluation is O(months searched) with per-month day sets cached by (month length, weekday of the
1st), so one call costs microseconds even for expressions that match once in decades.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from itertools import product
from math import prod

from cronman.model.cron_fields import (
    ALIASES,
    DAY_NAMES,
    DAY_OF_MONTH,
    DAY_OF_WEEK,
    MONTH,
    CronSyntaxError,
    Field,
    bad,
    plain,
    split_fields,
)
from cronman.model.cron_hash import (
    MAX_HASHED_OUTCOMES,
    Hashed,
    has_hashed,
    hashed_as_any,
    hashed_tokens,
    job_identity,
    resolve_hashed,
    time_outcomes,
    with_outcomes,
)

_NEAREST = re.compile(r"^(?:([0-9]{1,2})w|w([0-9]{1,2}))$", re.ASCII)
_FROM_LAST = re.compile(r"^l(?:-([0-9]{1,2}))?(w?)$", re.ASCII)
_NTH = re.compile(r"^([a-z0-9]+)#([0-9]+)$", re.ASCII)
_LAST_DOW = re.compile(r"^(?:([a-z0-9]+)l|l([a-z0-9]+))$", re.ASCII)

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
MAX_YEAR = 9998  # walls past this are never produced (datetime stops at 9999)
_DAY = 86_400


@dataclass(frozen=True, slots=True)
class DayRule:
    """Which days of a month match; depends only on the month's length and its first weekday."""

    dom: frozenset[int] = frozenset()  # plain days of the month
    from_last: frozenset[int] = frozenset()  # L (0), L-2 (2): days before the last
    nearest_from_last: frozenset[int] = frozenset()  # LW (0), L-2W (2): the weekday nearest such a day
    nearest: frozenset[int] = frozenset()  # 15W
    dom_restricted: bool = False
    dow: frozenset[int] = frozenset()  # plain weekdays, 0 = Sunday
    nth: frozenset[tuple[int, int]] = frozenset()  # (weekday, n): 6#3
    last_dow: frozenset[int] = frozenset()  # 5L
    dow_restricted: bool = False

    def days(self, ndays: int, first_weekday: int) -> tuple[int, ...]:
        """The matching days of a month of ``ndays`` days whose 1st is ``first_weekday`` (0 = Monday)."""
        if not (self.dom_restricted or self.dow_restricted):
            return tuple(range(1, ndays + 1))
        found: set[int] = set()
        if self.dom_restricted:
            found |= self._dom_days(ndays, first_weekday)
        if self.dow_restricted:
            found |= self._dow_days(ndays, first_weekday)
        return tuple(sorted(found))

    def _dom_days(self, ndays: int, first_weekday: int) -> set[int]:
        found = {d for d in self.dom if d <= ndays}
        found.update(ndays - n for n in self.from_last if n < ndays)
        found.update(nearest_weekday(ndays - n, ndays, first_weekday) for n in self.nearest_from_last if n < ndays)
        found.update(nearest_weekday(n, ndays, first_weekday) for n in self.nearest)
        return found

    def _dow_days(self, ndays: int, first_weekday: int) -> set[int]:
        def first(weekday: int) -> int:  # the first day of the month that is this cron weekday (0 = Sunday)
            return (weekday - first_weekday - 1) % 7 + 1

        found: set[int] = set()
        for weekday in self.dow:
            found.update(range(first(weekday), ndays + 1, 7))
        found.update(d for weekday, n in self.nth if (d := first(weekday) + 7 * (n - 1)) <= ndays)
        found.update(first(weekday) + 7 * ((ndays - first(weekday)) // 7) for weekday in self.last_dow)
        return found


def nearest_weekday(n: int, ndays: int, first_weekday: int) -> int:
    """The Monday-Friday day nearest day ``n`` (capped at the month's end) without leaving the month."""
    n = min(n, ndays)
    weekday = (first_weekday + n - 1) % 7  # 0 = Monday
    if weekday == 5:  # Saturday: the Friday before, or the Monday after when the 1st is a Saturday
        return n - 1 if n > 1 else n + 2
    if weekday == 6:  # Sunday: the Monday after, or the Friday before when it ends the month
        return n + 1 if n < ndays else n - 2
    return n


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed expression: sorted value tuples per field plus the day rule."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]  # only months in which the day rule can match at all
    day: DayRule
    _days: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def never_fires(self) -> bool:
        return not self.months

    def matches(self, wall: int) -> bool:
        """Whether a wall time (local seconds) matches."""
        days, sod = divmod(wall, _DAY)
        d = date.fromordinal(_EPOCH_ORDINAL + days)
        h, rest = divmod(sod, 3600)
        m, s = divmod(rest, 60)
        return (
            s in self.seconds
            and m in self.minutes
            and h in self.hours
            and d.month in self.months
            and d.day in self._month_days(d.year, d.month)
        )

    def next_wall(self, after: int) -> int | None:
        """The first matching wall time strictly after ``after`` (local seconds), or None."""
        if not self.months:
            return None
        days, sod = divmod(after + 1, _DAY)
        ordinal = _EPOCH_ORDINAL + days
        if ordinal < 1:
            ordinal, sod = 1, 0
        if ordinal > _MAX_ORDINAL:
            return None
        d = date.fromordinal(ordinal)
        year, month, day = d.year, d.month, d.day
        first = self.hours[0] * 3600 + self.minutes[0] * 60 + self.seconds[0]
        tod = self._time_at_or_after(sod)
        if tod is None:
            day, tod = day + 1, first
        if month not in self.months:
            year, month = self._next_month(year, month)
            day, tod = 1, first
        while year <= MAX_YEAR:
            matching = self._month_days(year, month)
            i = bisect_left(matching, day)
            if i < len(matching):
                found = matching[i]
                offset = tod if found == day else first
                return (date(year, month, found).toordinal() - _EPOCH_ORDINAL) * _DAY + offset
            year, month = self._next_month(year, month)
            day, tod = 1, first
        return None

    def days_of(self, year: int, month: int) -> tuple[int, ...]:
        """The days of a month the day fields allow (the month itself aside)."""
        return self._month_days(year, month)

    # -- helpers -------------------------------------------------------------------------------
    def _next_month(self, year: int, month: int) -> tuple[int, int]:
        i = bisect_right(self.months, month)
        if i < len(self.months):
            return year, self.months[i]
        return year + 1, self.months[0]

    def _month_days(self, year: int, month: int) -> tuple[int, ...]:
        ndays = _MONTH_DAYS[month] + (month == 2 and calendar.isleap(year))
        key = (ndays, date(year, month, 1).weekday())
        found = self._days.get(key)
        if found is None:
            found = self._days[key] = self.day.days(*key)
        return found

    def _time_at_or_after(self, sod: int) -> int | None:
        """The first matching time of day at or after ``sod`` seconds, or None."""
        h, rest = divmod(sod, 3600)
        m, s = divmod(rest, 60)
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_left(hours, h)
        if i < len(hours) and hours[i] == h:
            j = bisect_left(minutes, m)
            if j < len(minutes) and minutes[j] == m:
                k = bisect_left(seconds, s)
                if k < len(seconds):
                    return h * 3600 + m * 60 + seconds[k]
                j += 1
            if j < len(minutes):
                return h * 3600 + minutes[j] * 60 + seconds[0]
            i += 1
        if i < len(hours):
            return hours[i] * 3600 + minutes[0] * 60 + seconds[0]
        return None


_MAX_ORDINAL = date(MAX_YEAR, 12, 31).toordinal()
_MONTH_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


# ---------------------------------------------------------------------------------------- expressions
def parse_cron(expression: str, *, stored: bool = False, identity: str = "") -> CronExpr:
    """Parse an expression; raise CronSyntaxError with a message naming the field at fault.

    ``H`` values are those of the job ``identity`` (see :func:`resolve_hashed`); ``stored=True``
    reads ``R`` as ``H`` (documents stored before ``R`` was refused) instead of refusing it."""
    low = expression.lower()
    if stored and "r" not in low:  # one cache entry for what stored or not reads alike
        stored = False
    if "h" not in low and "r" not in low:
        identity = ""
    return _parse_cached(expression, stored, identity)


@lru_cache(maxsize=4096)
def _parse_cached(expression: str, stored: bool, identity: str) -> CronExpr:
    return _parse(expression, stored, identity)


def _parse(expression: str, stored: bool = False, identity: str = "") -> CronExpr:
    specs, fields = split_fields(resolve_hashed(expression, identity, stored=stored))
    plain = {spec.name: _field_values(spec, text) for spec, text in zip(specs, fields, strict=True)}
    day = _day_rule(fields[-3], fields[-1])
    return CronExpr(
        text=" ".join(fields),
        seconds=tuple(sorted(plain.get("second", (0,)))),
        minutes=tuple(sorted(plain["minute"])),
        hours=tuple(sorted(plain["hour"])),
        months=_months_that_can_match(day, plain["month"]),
        day=day,
    )


def _field_values(spec: Field, text: str) -> frozenset[int]:
    """A field's plain values (checking the fields in order, so an error names the first at fault)."""
    if spec is DAY_OF_MONTH:
        return plain(spec, _split_dom(text)[0] or "*")
    if spec is DAY_OF_WEEK:
        return plain(spec, _split_dow(text)[0] or "*")
    if text == "?":
        raise bad(spec, text, "? is for the day fields")
    return plain(spec, text)


def _day_rule(dom_text: str, dow_text: str) -> DayRule:
    dom_plain, from_last, nearest_from_last, nearest = _split_dom(dom_text)
    dow_plain, nth, last_dow = _split_dow(dow_text)
    # A day field is restricted when it leaves some day out: "*", "?", "1-31", "*/1" and "0-7" are not.
    dom_special = bool(from_last or nearest_from_last or nearest)
    dom = plain(DAY_OF_MONTH, dom_plain) if dom_plain else frozenset(() if dom_special else range(1, 32))
    dow = plain(DAY_OF_WEEK, dow_plain) if dow_plain else frozenset(() if nth or last_dow else range(7))
    return DayRule(
        dom=dom,
        from_last=frozenset(from_last),
        nearest_from_last=frozenset(nearest_from_last),
        nearest=frozenset(nearest),
        dom_restricted=dom_special or len(dom) < 31,
        dow=dow,
        nth=frozenset(nth),
        last_dow=frozenset(last_dow),
        dow_restricted=bool(nth or last_dow or len(dow) < 7),
    )


def _split_dom(text: str) -> tuple[str, set[int], set[int], set[int]]:
    """Day-of-month: the plain part, and L / L-n, LW / L-nW, nW days."""
    plain: list[str] = []
    from_last: set[int] = set()
    nearest_from_last: set[int] = set()
    nearest: set[int] = set()
    if text == "?":
        return "", from_last, nearest_from_last, nearest
    for original in text.split(","):
        token = original.lower()
        if m := _FROM_LAST.match(token):
            n = int(m.group(1) or 0)
            if n > 30:
                raise bad(DAY_OF_MONTH, text, f"in {token.upper()} the days before the last must be 0 to 30")
            (nearest_from_last if m.group(2) else from_last).add(n)
        elif m := _NEAREST.match(token):
            n = int(m.group(1) or m.group(2))
            if not 1 <= n <= 31:
                raise CronSyntaxError(f"day-of-month field {text!r}: {token.upper()} needs a day from 1 to 31")
            nearest.add(n)
        else:
            plain.append(original)
    return ",".join(plain), from_last, nearest_from_last, nearest


def _split_dow(text: str) -> tuple[str, set[tuple[int, int]], set[int]]:
    """Day-of-week: the plain part, and n#k and nL days."""
    plain: list[str] = []
    nth: set[tuple[int, int]] = set()
    last: set[int] = set()
    if text == "?":
        return "", nth, last
    for original in text.split(","):
        token = original.lower()
        if m := _NTH.match(token):
            n = int(m.group(2))
            if not 1 <= n <= 5:
                raise CronSyntaxError(f"day-of-week field {text!r}: in {token.upper()} the week must be 1 to 5")
            nth.add((_weekday(m.group(1), text), n))
        elif token == "l":
            raise CronSyntaxError(f"day-of-week field {text!r}: L needs a weekday, for example 5L (last Friday)")
        elif m := _LAST_DOW.match(token):
            last.add(_weekday(m.group(1) or m.group(2), text))
        else:
            plain.append(original)
    return ",".join(plain), nth, last


def _weekday(token: str, text: str) -> int:
    if token in DAY_NAMES:
        return DAY_NAMES.index(token)
    if token.isascii() and token.isdigit() and int(token) <= 7:
        return int(token) % 7
    raise CronSyntaxError(f"day-of-week field {text!r}: {token.upper()!r} is not a weekday (0-7 or SUN-SAT)")


_MONTH_LENGTHS = {2: (28, 29), 4: (30,), 6: (30,), 9: (30,), 11: (30,)}


def _months_that_can_match(day: DayRule, months: frozenset[int]) -> tuple[int, ...]:
    """The months in which some day matches, in some year: by month length, each looked at once."""
    lengths: dict[int, bool] = {}

    def some_day(ndays: int) -> bool:
        if ndays not in lengths:
            lengths[ndays] = any(day.days(ndays, w) for w in range(7))
        return lengths[ndays]

    return tuple(m for m in sorted(months) if any(some_day(n) for n in _MONTH_LENGTHS.get(m, (31,))))


# ---------------------------------------------------------------------------------------- validation


def cron_error(expression: str) -> str | None:
    """The reason an expression is unusable, or None when it is valid. An expression with ``H``
    must fire whatever the job it belongs to: every combination of its hashed days is checked."""
    try:
        fields, hashed = hashed_tokens(expression)
        parse_cron(expression)
        day_hashed = [h for h in hashed if h.field in (DAY_OF_MONTH, MONTH, DAY_OF_WEEK)]
        if not day_hashed:
            return _never_fires(parse_cron(expression))
        return _never_fires_hashed(fields, hashed, day_hashed)
    except CronSyntaxError as exc:
        return str(exc)


def _never_fires(expr: CronExpr) -> str | None:
    if expr.never_fires:
        return "this cron expression never fires: no month it names has a day it names"
    return None


def _never_fires_hashed(fields: tuple[str, ...], hashed: tuple[Hashed, ...], day_hashed: list[Hashed]) -> str | None:
    """Whether some job's outcome of the hashed days never fires: each combination of hashed
    day-of-month and day-of-week values gives the months its days can fall in, each combination of
    hashed months the months named; every pair must meet."""
    days = [h for h in day_hashed if h.field is not MONTH]
    months = [h for h in day_hashed if h.field is MONTH]
    for group in (days, months):
        total = prod(h.size for h in group)
        if total > MAX_HASHED_OUTCOMES:
            raise CronSyntaxError(
                f"hashed (H) values in the day fields have {total} combinations, more than {MAX_HASHED_OUTCOMES} "
                "can be checked; use fewer or narrower ones"
            )
    fixed = {(h.field_index, h.token_index): h.outcome(0) for h in hashed if h not in day_hashed}
    month_index = len(fields) - 2
    named: set[frozenset[int]] = set()
    for combination in product(*(range(h.size) for h in months)):
        outcomes = {(h.field_index, h.token_index): h.outcome(k) for h, k in zip(months, combination, strict=True)}
        named.add(plain(MONTH, with_outcomes(fields, outcomes).split()[month_index]))
    for combination in product(*(range(h.size) for h in days)):
        outcomes = dict(fixed)
        outcomes.update({(h.field_index, h.token_index): h.outcome(k) for h, k in zip(days, combination, strict=True)})
        resolved = with_outcomes(fields, outcomes).split()
        resolved[month_index] = "*"
        can = set(_parse(" ".join(resolved)).months)
        for wanted in named:
            if not can & wanted:
                resolved[month_index] = ",".join(map(str, sorted(wanted)))
                return (
                    "this cron expression never fires for some jobs: with its hashed (H) values as in "
                    f"{' '.join(resolved)!r}, no month it names has a day it names"
                )
    return None


__all__ = [
    "ALIASES",
    "CronExpr",
    "CronSyntaxError",
    "DayRule",
    "Hashed",
    "cron_error",
    "has_hashed",
    "hashed_as_any",
    "hashed_tokens",
    "job_identity",
    "nearest_weekday",
    "parse_cron",
    "resolve_hashed",
    "time_outcomes",
]
