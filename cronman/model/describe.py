"""A stored schedule in words, for people: "At 07:00, Monday through Friday (America/New_York)".

Pure: the schedule document in, a sentence out. Cron expressions are put into words by the
``cron-descriptor`` package; intervals, one-off instants, bounds and jitter are ours.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from cron_descriptor import CasingTypeEnum, ExpressionDescriptor, FormatException, Options

from cronman.model.schedule import cron_expressions, resolved_expressions

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _plural(n: int | float, unit: str) -> str:
    shown = f"{n:g}" if isinstance(n, float) else str(n)
    return f"{shown} {unit}" if n == 1 else f"{shown} {unit}s"


def duration_words(seconds: int) -> str:
    """``90`` -> "1 minute 30 seconds"; ``86400`` -> "1 day"."""
    if seconds <= 0:
        return _plural(seconds, "second")
    parts = []
    for unit, size in _UNITS:
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(_plural(n, unit))
    return " ".join(parts)


@lru_cache(maxsize=4096)
def cron_words(expression: str) -> str:
    """A 5-field or 6-field (leading seconds) expression in words, 24-hour clock; the expression
    itself when the describer cannot read it. Cached: the describer reads its locale files each
    time (about 1 ms), and many jobs share an expression."""
    options = Options()
    options.use_24hour_time_format = True
    options.casing_type = CasingTypeEnum.Sentence
    options.verbose = False
    try:
        return str(ExpressionDescriptor(_ALIASES.get(expression.lower(), expression), options).get_description())
    except (FormatException, ValueError, KeyError, IndexError):
        return f"cron {expression}"


def instant_words(value: str) -> str:
    """An ISO-8601 instant as ``2026-11-13 04:13:22 UTC`` (stored instants are UTC or carry an offset)."""
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    offset = dt.utcoffset()
    zone = "UTC" if offset is not None and not offset else dt.strftime("%z")
    return f"{dt:%Y-%m-%d %H:%M:%S} {zone}".strip()


def _interval(schedule: dict[str, Any]) -> str:
    every = int(schedule["every_seconds"])
    text = f"Every {duration_words(every)}" if every != 1 else "Every second"
    if schedule.get("start_at"):
        return f"{text}, counted from {instant_words(schedule['start_at'])}"
    return f"{text} (at a phase set by the job id)"


def _bounds(schedule: dict[str, Any]) -> list[str]:
    out = []
    if schedule.get("start_at") and schedule["type"] != "interval":
        out.append(f"not before {instant_words(schedule['start_at'])}")
    if schedule.get("end_at"):
        out.append(f"not after {instant_words(schedule['end_at'])}")
    jitter = schedule.get("jitter_seconds")
    if jitter:
        out.append(f"each occurrence moved up to {_plural(float(jitter), 'second')} later (jitter)")
    return out


def _hashed_words(written: str, resolved: str) -> str:
    """An expression with hashed (H) values as this job's times, saying what was written."""
    return cron_words(resolved) if resolved == written else f"{cron_words(resolved)} ({written} for this job)"


def describe_schedule(schedule: dict[str, Any], job_id: str | None = None, namespace: str = "") -> str:
    """The schedule of a stored job in one sentence; with the job's id and namespace, hashed (H)
    cron values are shown as the job's times."""
    kind = schedule.get("type")
    if kind == "cron":
        zone = schedule.get("timezone") or "UTC"
        expressions = cron_expressions(schedule)
        if job_id is not None:
            resolved = resolved_expressions(schedule, job_id, namespace)
            words = [_hashed_words(e, r) for e, r in zip(expressions, resolved, strict=True)]
        else:
            words = [cron_words(e) for e in expressions]
        head = f"{'; or '.join(words)} ({zone})"
    elif kind == "interval":
        head = _interval(schedule)
    elif kind == "once":
        head = f"Once, at {instant_words(schedule['at'])}"
    elif kind == "after":
        within = duration_words(int(schedule.get("within_seconds", 86400)))
        head = f"After {', '.join(schedule['jobs'])} succeeded (within {within})"
    else:
        return f"Unknown schedule type {kind!r}"
    rest = _bounds(schedule)
    return "; ".join([head, *rest])


def zone_of(schedule: dict[str, Any]) -> str:
    """The time zone a schedule is read in (cron has one; the others are instants, shown in UTC)."""
    return str(schedule.get("timezone") or "UTC") if schedule.get("type") == "cron" else "UTC"
