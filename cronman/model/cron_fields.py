"""The fields of a cron expression and the plain part of their grammar: values and names, ranges
(``a-b``; equal ends are one value; ``a > b`` wraps around the field), steps (``*/n``, ``a/n``,
``a-b/n``; longer than their range: its first value) and lists. `cronman.model.cron` reads the day
fields' specials; `cronman.model.cron_hash` the hashed (``H``) values."""

from __future__ import annotations

import re
from dataclasses import dataclass


class CronSyntaxError(ValueError):
    """An expression cronman cannot use; the message names the field and what is wrong."""


ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] is the value low + i (or 0 + i for weekdays)
    step_end: int = -1  # where `*/n` and `a/n` stop (the field's end unless said)
    allowed: str = ""

    @property
    def end(self) -> int:
        return self.high if self.step_end < 0 else self.step_end


_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
SECOND = Field("second", 0, 59, allowed="0-59")
MINUTE = Field("minute", 0, 59, allowed="0-59")
HOUR = Field("hour", 0, 23, allowed="0-23")
DAY_OF_MONTH = Field("day-of-month", 1, 31, allowed="1-31, L, L-2, LW, L-2W, 15W")
MONTH = Field("month", 1, 12, _MONTH_NAMES, allowed="1-12 or JAN-DEC")
DAY_OF_WEEK = Field("day-of-week", 0, 7, DAY_NAMES, step_end=6, allowed="0-7 or SUN-SAT (0 and 7 are Sunday), 6#3, 5L")
FIELDS_5 = (MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK)
FIELDS_6 = (SECOND, *FIELDS_5)

_NUMBER = re.compile(r"[0-9]{1,4}", re.ASCII)


def bad(field: Field, text: str, why: str) -> CronSyntaxError:
    return CronSyntaxError(
        f"{field.name} field {text[:40]!r} is not valid: {why} (allowed: {field.allowed}, lists, ranges, steps, *)"
    )


def _value(field: Field, token: str, text: str) -> int:
    """A number or a name of the field, within its bounds."""
    if _NUMBER.fullmatch(token):
        v = int(token)
        if not field.low <= v <= field.high:
            raise bad(field, text, f"{token} is outside {field.low}-{field.high}")
        return v
    low = token.lower()
    if low in field.names:
        return field.names.index(low) + (0 if field is DAY_OF_WEEK else field.low)
    raise bad(field, text, f"{token!r} is not a value")


def _step(field: Field, token: str, text: str) -> int:
    if not _NUMBER.fullmatch(token) or int(token) < 1:
        raise bad(field, text, f"the step {token!r} must be a whole number from 1")
    return int(token)


def _cycle(field: Field) -> tuple[int, int]:
    """The values a wrapping range runs through: weekdays as 0-6 (7 is Sunday, 0)."""
    return (0, 6) if field is DAY_OF_WEEK else (field.low, field.high)


def _element(field: Field, token: str, text: str) -> set[int]:
    """The values of one list element: ``*``, ``v``, ``a-b`` (wrapping when a > b), each with an
    optional ``/step``; ``*/n`` and ``v/n`` run to the field's end (Saturday for weekdays)."""
    base, slash, step_text = token.partition("/")
    step = _step(field, step_text, text) if slash else 1
    if base == "*":
        return set(range(field.low, field.end + 1, step))
    first, dash, last = base.partition("-")
    a = _value(field, first, text)
    if not dash:
        return set(range(a, max(a, field.end) + 1, step)) if slash else {a}
    b = _value(field, last, text)
    if a <= b:
        return set(range(a, b + 1, step))
    low, high = _cycle(field)
    if field is DAY_OF_WEEK and a == 7:  # Sunday: 7-3 is Sunday to Wednesday
        a = 0
    if a <= b:
        return set(range(a, b + 1, step))
    size = high - low + 1
    return {low + (v - low) % size for v in range(a, b + size + 1, step)}


def plain(field: Field, text: str) -> frozenset[int]:
    """A field without day specials: its values (weekdays 0-6, Sunday 0)."""
    values: set[int] = set()
    for token in text.split(","):
        values |= _element(field, token, text)
    if field is DAY_OF_WEEK:
        values = {v % 7 for v in values}
    return frozenset(values)


def split_fields(expression: str) -> tuple[tuple[Field, ...], list[str]]:
    """The fields of an expression (an alias stands for its expression) and what each is."""
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
    return (FIELDS_6 if len(fields) == 6 else FIELDS_5), fields
