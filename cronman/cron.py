"""Cron expressions on the wall clock: parsing, and the first matching wall time after another.

Wall times are whole seconds counted from 1970-01-01T00:00 on a local calendar with no time zone
("local seconds"); `cronman.schedule` maps them to instants with the daylight-saving policies.

Syntax: 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds field,
or one alias: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly. croniter parses
the standard part of every field (numbers, names, ``*``, ranges, steps, lists, ``?``), so a plain
expression means exactly what it meant before; cronman evaluates the day rules itself:

* day-of-month: ``L`` (last day), ``LW`` (last weekday, Monday-Friday), ``15W`` or ``W15`` (the
  weekday nearest the 15th within its month; a day past the month's end counts as its last day);
* day-of-week: ``6#3`` (third Saturday; ``n`` is 1-5), ``5L`` or ``L5`` (last Friday); names work
  too (``FRI#2``, ``FRIL``); 0 and 7 are Sunday;
* these mix freely with plain values in a list (``1,15,L``; ``MON,5L``);
* when both day fields are restricted (neither ``*`` nor ``?``), a day matches when either does
  (the classic cron OR); when one is restricted, it alone decides.

Random (``R``) and hashed (``H``) values are refused: every node must compute the same times.
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

from croniter import CroniterError, croniter

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS_5 = ("minute", "hour", "day-of-month", "month", "day-of-week")
_FIELDS_6 = ("second", *_FIELDS_5)
_RANGES = {
    "second": "0-59",
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31, L, LW, 15W",
    "month": "1-12 or JAN-DEC",
    "day-of-week": "0-7 or SUN-SAT (0 and 7 are Sunday), 6#3, 5L",
}
_WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_HASHED = re.compile(r"^[hr](\([0-9]+-[0-9]+\))?(/[0-9]+)?$", re.ASCII | re.IGNORECASE)
_NEAREST = re.compile(r"^(?:([0-9]{1,2})w|w([0-9]{1,2}))$", re.ASCII)
_NTH = re.compile(r"^([a-z0-9]+)#([0-9]+)$", re.ASCII)
_LAST_DOW = re.compile(r"^(?:([a-z0-9]+)l|l([a-z0-9]+))$", re.ASCII)

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
MAX_YEAR = 9998  # walls past this are never produced (datetime stops at 9999)
_DAY = 86_400


class CronSyntaxError(ValueError):
    """An expression cronman cannot use; the message names the field and what is wrong."""


@dataclass(frozen=True, slots=True)
class DayRule:
    """Which days of a month match; depends only on the month's length and its first weekday."""

    dom: frozenset[int] = frozenset()  # plain days of the month
    last_day: bool = False  # L
    last_weekday: bool = False  # LW
    nearest: frozenset[int] = frozenset()  # 15W
    dom_restricted: bool = False
    dow: frozenset[int] = frozenset()  # plain weekdays, 0 = Sunday
    nth: frozenset[tuple[int, int]] = frozenset()  # (weekday, n): 6#3
    last_dow: frozenset[int] = frozenset()  # 5L
    dow_restricted: bool = False

    def days(self, ndays: int, first_weekday: int) -> tuple[int, ...]:
        """The matching days of a month of ``ndays`` days whose 1st is ``first_weekday`` (0 = Monday)."""
        return tuple(d for d in range(1, ndays + 1) if self._matches(d, ndays, first_weekday))

    def _matches(self, d: int, ndays: int, first_weekday: int) -> bool:
        if self.dom_restricted and self.dow_restricted:
            return self._dom(d, ndays, first_weekday) or self._dow(d, ndays, first_weekday)
        if self.dom_restricted:
            return self._dom(d, ndays, first_weekday)
        if self.dow_restricted:
            return self._dow(d, ndays, first_weekday)
        return True

    def _dom(self, d: int, ndays: int, first_weekday: int) -> bool:
        return (
            d in self.dom
            or (self.last_day and d == ndays)
            or (self.last_weekday and d == nearest_weekday(ndays, ndays, first_weekday))
            or any(d == nearest_weekday(n, ndays, first_weekday) for n in self.nearest)
        )

    def _dow(self, d: int, ndays: int, first_weekday: int) -> bool:
        weekday = (first_weekday + d) % 7  # cron numbering: (Monday=0 based + 1) % 7, 0 = Sunday
        return (
            weekday in self.dow
            or (weekday, (d - 1) // 7 + 1) in self.nth
            or (weekday in self.last_dow and d + 7 > ndays)
        )


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


# ---------------------------------------------------------------------------------------- parsing
@lru_cache(maxsize=4096)
def parse_cron(expression: str, *, stored: bool = False) -> CronExpr:
    """Parse an expression; raise CronSyntaxError with a message naming the field at fault.

    ``stored=True`` is for documents stored before H and R were refused: they get one value
    derived from the expression's text (the same on every node) instead of an error."""
    text = expression.strip()
    if text.startswith("@"):
        alias = ALIASES.get(text.lower())
        if alias is None:
            raise CronSyntaxError(
                f"unknown cron alias {text[:20]!r}; use @yearly, @annually, @monthly, @weekly, @daily, "
                "@midnight or @hourly"
            )
        text = alias
    fields = text.split()
    if len(fields) not in (5, 6):
        raise CronSyntaxError(
            "a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 with a "
            f"leading seconds field; got {len(fields)}"
        )
    names = _FIELDS_6 if len(fields) == 6 else _FIELDS_5
    hash_id = None
    if stored:
        fields, hash_id = [_rehash(value) for value in fields], " ".join(fields).encode()
    else:
        for name, value in zip(names, fields, strict=True):
            _refuse_hashed(name, value)
    six = len(fields) == 6
    dom_plain, last_day, last_weekday, nearest = _split_dom(fields[-3])
    dow_plain, nth, last_dow = _split_dow(fields[-1])
    plain = [*fields[:-3], dom_plain or "*", fields[-2], dow_plain or "*"]
    expanded = _expand(plain, names, six, hash_id)
    values = dict(zip(names, expanded, strict=True))
    # A day field is restricted when it leaves some day out: "*", "?", "1-31", "*/1" and "0-7" are not.
    dom = frozenset(_ints(values["day-of-month"], 1, 31) if dom_plain else ())
    dow = frozenset(_ints(values["day-of-week"], 0, 6) if dow_plain else ())
    if not dom_plain and not (last_day or last_weekday or nearest):
        dom = frozenset(range(1, 32))
    if not dow_plain and not (nth or last_dow):
        dow = frozenset(range(7))
    day = DayRule(
        dom=dom,
        last_day=last_day,
        last_weekday=last_weekday,
        nearest=frozenset(nearest),
        dom_restricted=bool(last_day or last_weekday or nearest or len(dom) < 31),
        dow=dow,
        nth=frozenset(nth),
        last_dow=frozenset(last_dow),
        dow_restricted=bool(nth or last_dow or len(dow) < 7),
    )
    months = tuple(m for m in _ints(values["month"], 1, 12) if _month_can_match(day, m))
    return CronExpr(
        text=" ".join(fields),
        seconds=tuple(_ints(values["second"], 0, 59)) if six else (0,),
        minutes=tuple(_ints(values["minute"], 0, 59)),
        hours=tuple(_ints(values["hour"], 0, 23)),
        months=months,
        day=day,
    )


def cron_error(expression: str) -> str | None:
    """The reason an expression is unusable, or None when it is valid."""
    try:
        expr = parse_cron(expression)
    except CronSyntaxError as exc:
        return str(exc)
    if expr.never_fires:
        return "this cron expression never fires: no month it names has a day it names"
    return None


def _refuse_hashed(name: str, value: str) -> None:
    for token in value.split(","):
        if _HASHED.match(token):
            raise CronSyntaxError(
                f"{name} field {value[:40]!r}: random (R) and hashed (H) values are not supported; "
                "every node must compute the same times"
            )


def _rehash(value: str) -> str:
    return ",".join("h" + token[1:] if _HASHED.match(token) else token for token in value.split(","))


def _split_dom(text: str) -> tuple[str, bool, bool, list[int]]:
    if text == "?":
        return "", False, False, []
    plain: list[str] = []
    last_day = last_weekday = False
    nearest: list[int] = []
    for original in text.split(","):
        token = original.lower()
        if token == "l":
            last_day = True
        elif token == "lw":
            last_weekday = True
        elif m := _NEAREST.match(token):
            n = int(m.group(1) or m.group(2))
            if not 1 <= n <= 31:
                raise CronSyntaxError(f"day-of-month field {text!r}: {token.upper()} needs a day from 1 to 31")
            nearest.append(n)
        else:
            plain.append(original)
    return ",".join(plain), last_day, last_weekday, nearest


def _split_dow(text: str) -> tuple[str, list[tuple[int, int]], list[int]]:
    if text == "?":
        return "", [], []
    plain: list[str] = []
    nth: list[tuple[int, int]] = []
    last: list[int] = []
    for original in text.split(","):
        token = original.lower()
        if m := _NTH.match(token):
            n = int(m.group(2))
            if not 1 <= n <= 5:
                raise CronSyntaxError(f"day-of-week field {text!r}: in {token.upper()} the week must be 1 to 5")
            nth.append((_weekday(m.group(1), text), n))
        elif token == "l":
            raise CronSyntaxError(f"day-of-week field {text!r}: L needs a weekday, for example 5L (last Friday)")
        elif m := _LAST_DOW.match(token):
            last.append(_weekday(m.group(1) or m.group(2), text))
        else:
            plain.append(original)
    return ",".join(plain), nth, last


def _weekday(token: str, text: str) -> int:
    if token in _WEEKDAYS:
        return _WEEKDAYS[token]
    if token.isascii() and token.isdigit() and int(token) <= 7:
        return int(token) % 7
    raise CronSyntaxError(f"day-of-week field {text!r}: {token.upper()!r} is not a weekday (0-7 or SUN-SAT)")


def _expand(plain: list[str], names: tuple[str, ...], six: bool, hash_id: bytes | None) -> list[list[int | str]]:
    try:
        expanded, _ = croniter.expand(" ".join(plain), hash_id=hash_id, second_at_beginning=six)
    except (CroniterError, ValueError, KeyError, TypeError, IndexError):
        raise CronSyntaxError(_field_error(plain, names, six)) from None
    if six:  # croniter puts the seconds last
        expanded = [expanded[5], *expanded[:5]]
    return expanded


def _field_error(plain: list[str], names: tuple[str, ...], six: bool) -> str:
    """Find the field croniter refuses, so the message can name it."""
    for i, name in enumerate(names):
        alone = ["*"] * len(plain)
        alone[i] = plain[i]
        try:
            croniter.expand(" ".join(alone), second_at_beginning=six)
        except (CroniterError, ValueError, KeyError, TypeError, IndexError):
            return f"{name} field {plain[i][:40]!r} is not valid (allowed: {_RANGES[name]}, lists, ranges, steps, *)"
    return "invalid cron expression"


def _ints(values: list[int | str], low: int, high: int) -> list[int]:
    if values == ["*"]:
        return list(range(low, high + 1))
    return sorted({int(v) for v in values if isinstance(v, int) and low <= v <= high})


_MONTH_LENGTHS = {2: (28, 29), 4: (30,), 6: (30,), 9: (30,), 11: (30,)}


def _month_can_match(day: DayRule, month: int) -> bool:
    return any(day.days(n, w) for n in _MONTH_LENGTHS.get(month, (31,)) for w in range(7))


__all__ = ["ALIASES", "CronExpr", "CronSyntaxError", "DayRule", "cron_error", "nearest_weekday", "parse_cron"]
