"""Backfills: a job's occurrences in a past range, delivered again as executions of their own.

What is delivered is fixed when the backfill is asked for: the job's schedule and the calendars it
names are kept with it (its *timing document*), so the count given to the user and the occurrences
a node hands out agree whatever happens to the job afterwards. Each execution carries the trigger
``backfill:<id>``, so its execution id is stable per backfill and occurrence, its history rows are
its own, and receivers get a ``Cronman-Backfill-Id`` header (an SQS message attribute).

Pure: the request model, the timing document and the count (clock passed in).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from cronman.errors import InvalidInput
from cronman.model.calendars import Calendar, calendar_from_stored, calendar_to_dict, timing_with
from cronman.model.cron import CronExpr, parse_cron
from cronman.model.schedule import FoldPolicy, Timing, resolved_expressions, timing_from_dict, zone
from cronman.model.spec import invalid_input
from cronman.model.timeutil import parse_iso, to_ms

if TYPE_CHECKING:
    from cronman.settings import Settings

MAX_OCCURRENCES = 100_000  # executions one backfill may deliver (default of CRONMAN_BACKFILL_MAX_EXECUTIONS)
MAX_RATE = 1_000_000.0  # the most CRONMAN_BACKFILL_MAX_PER_SECOND may be
MAX_RUNNING_PER_JOB = 10
BACKFILL_ID_PATTERN = r"^bf-[0-9a-f]{20}$"


class BackfillSpec(BaseModel):
    """A backfill as asked for (POST /v1/jobs/{id}/backfill)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    from_: AwareDatetime = Field(alias="from", description="The first instant of the range (ISO-8601 with an offset).")
    to: AwareDatetime = Field(description="The last instant of the range, inclusive; not in the future.")
    max_per_second: float = Field(
        10.0,
        gt=0,
        le=MAX_RATE,
        allow_inf_nan=False,
        description="Executions handed out per second, across the whole cluster (retries come on top); "
        "between CRONMAN_BACKFILL_MIN_PER_SECOND (0.1) and CRONMAN_BACKFILL_MAX_PER_SECOND (1000).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> BackfillSpec:
        if self.to < self.from_:
            raise PydanticCustomError("invalid_value", "to must not be before from", {"field": "to"})
        return self


def parse_backfill(body: str | bytes) -> BackfillSpec:
    try:
        return BackfillSpec.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_input(exc) from None


def check_range(spec: BackfillSpec, now_ms: int, retention_days: int) -> tuple[int, int]:
    """The range as epoch ms: in the past, and within the history's retention (older history
    partitions are dropped, so the backfill's rows would be)."""
    lo, hi = to_ms(spec.from_), to_ms(spec.to)
    if hi > now_ms:
        raise InvalidInput("to must not be in the future: a backfill delivers past occurrences", field="to")
    oldest = now_ms - retention_days * 86_400_000
    if lo < oldest:
        raise InvalidInput(f"from must lie within the history's retention ({retention_days} days back)", field="from")
    return lo, hi


@dataclass(frozen=True, slots=True)
class BackfillLimits:
    """What one backfill, and a namespace's backfills together, may ask for (the settings)."""

    min_rate: float = 0.1
    max_rate: float = 1000.0
    max_executions: int = MAX_OCCURRENCES
    running: int = 20  # running backfills per namespace
    rate: float = 100.0  # their max_per_second together

    @classmethod
    def of(cls, settings: Settings) -> BackfillLimits:
        return cls(
            settings.backfill_min_per_second,
            settings.backfill_max_per_second,
            settings.backfill_max_executions,
            settings.quota_backfills_per_namespace,
            settings.quota_backfill_rate_per_namespace,
        )


def check_rate(spec: BackfillSpec, limits: BackfillLimits) -> None:
    """``max_per_second`` within the deployment's bounds: a backfill ends in a bounded time."""
    rate = spec.max_per_second
    if not limits.min_rate <= rate <= limits.max_rate:
        raise InvalidInput(
            f"max_per_second must be between {limits.min_rate:g} and {limits.max_rate:g} "
            "(CRONMAN_BACKFILL_MIN_PER_SECOND, CRONMAN_BACKFILL_MAX_PER_SECOND)",
            field="max_per_second",
            code="invalid_value",
        )


def new_backfill_id() -> str:
    return f"bf-{secrets.token_hex(10)}"


def timing_document(schedule: dict[str, Any], names: Sequence[str], found: Mapping[str, Calendar]) -> dict[str, Any]:
    """What a backfill keeps to compute its occurrences: the schedule and the calendars named."""
    return {"schedule": schedule, "calendars": [[n, calendar_to_dict(found[n])] for n in names if n in found]}


def timing_of(document: dict[str, Any] | str, job_id: str, namespace: str) -> Timing:
    doc = json.loads(document) if isinstance(document, str) else document
    # (written by timing_document from calendars the API validated: read without validating each
    # entry again, and whatever calendar_max_entries was then)
    found = {name: calendar_from_stored(cal) for name, cal in doc.get("calendars", [])}
    return timing_with(timing_from_dict(doc["schedule"], job_id, namespace), list(found), found)


def occurrences(timing: Timing, from_ms: int, to_ms: int, limit: int) -> list[int]:
    """The occurrences in [from, to], oldest first, at most ``limit`` (one more says "too many")."""
    out: list[int] = []
    t = timing.next_after(from_ms - 1)
    while t is not None and t <= to_ms and len(out) < limit:
        out.append(t)
        nxt = timing.next_after(t)
        t = nxt if nxt is None or nxt > t else None
    return out


def count(
    document: dict[str, Any], job_id: str, namespace: str, from_ms: int, to_ms: int, events: int, limit: int
) -> int:
    """How many executions a backfill delivers; InvalidInput when none or more than ``limit``.
    More than the limit by :func:`most_occurrences` is refused before any occurrence is computed,
    so a refusal costs the same whatever the range; what passes costs at most the limit's worth."""
    if most_occurrences(document["schedule"], job_id, namespace, from_ms, to_ms) * events > limit:
        raise _too_large(limit)
    found = len(occurrences(timing_of(document, job_id, namespace), from_ms, to_ms, limit // events + 1)) * events
    if found == 0:
        raise InvalidInput("the job has no occurrence in that range", field="from", code="no_occurrences")
    if found > limit:
        raise _too_large(limit)
    return found


def _too_large(limit: int) -> InvalidInput:
    return InvalidInput(
        f"the range may hold more than {limit} executions (CRONMAN_BACKFILL_MAX_EXECUTIONS); backfill a shorter range",
        field="to",
        code="too_large",
    )


# ------------------------------------------------------------------ the bound, without listing
_DAY_S = 86_400
_FOLD_S = 7_200  # the most a clock has gone back at once (a repeated interval is at most this long)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_ZONE_SPAN_S = 14 * 3600  # local days begin at most this far from UTC midnight


def _instant_ms(value: object) -> int | None:
    """An instant of a stored schedule (ISO-8601 text, or epoch ms)."""
    if value is None:
        return None
    return value if isinstance(value, int) else parse_iso(str(value))


def most_occurrences(schedule: dict[str, Any], job_id: str, namespace: str, from_ms: int, to_ms: int) -> int:
    """At least as many occurrences as the schedule has in [from, to] (calendars aside: they only
    take some away), computed from the range's length and the expression's fields, never by
    listing them: an interval's arithmetic; a cron expression's times of day on each day of the
    range its day fields allow (a bounded loop over days, microseconds each), plus a repeated
    hour's worth on a day the clock goes back under ``dst_fold: both``, and one for the instant a
    gap's times are shifted to."""
    jitter = int(float(schedule.get("jitter_seconds") or 0) * 1000)
    lo, hi = from_ms - jitter, to_ms  # (a jittered occurrence is its base moved later by < jitter)
    start, end = _instant_ms(schedule.get("start_at")), _instant_ms(schedule.get("end_at"))
    lo = lo if start is None else max(lo, start)
    hi = hi if end is None else min(hi, end)
    if hi < lo:
        return 0
    kind = schedule["type"]
    if kind == "after":
        return 0
    if kind == "once":
        return 1
    if kind == "interval":
        return (hi - lo) // (int(schedule["every_seconds"]) * 1000) + 1
    tz = zone(schedule.get("timezone") or "UTC")
    both = schedule.get("dst_fold") == FoldPolicy.BOTH
    lo_s, hi_s = lo // 1000, -(-hi // 1000)
    expressions = resolved_expressions(schedule, job_id, namespace)  # (a job's hashed values in place)
    return sum(_cron_most(parse_cron(e, stored=True), tz, both, lo_s, hi_s) for e in expressions)


def _offset(tz: ZoneInfo, s: int) -> int:
    delta = datetime.fromtimestamp(s, tz).utcoffset()
    return 0 if delta is None else delta.days * _DAY_S + delta.seconds


def _cron_most(e: CronExpr, tz: ZoneInfo, both: bool, lo_s: int, hi_s: int) -> int:
    if e.never_fires:
        return 0
    # The first instance of each wall time is non-decreasing in wall order, so the walls of the
    # occurrences in range lie from lo's wall to hi's, or to the wall hi would have had before a
    # repeated interval it lies in.
    lo_w = lo_s + _offset(tz, lo_s)
    hi_w = max(hi_s + _offset(tz, hi_s), hi_s + _offset(tz, hi_s - _FOLD_S))
    per_hour = len(e.minutes) * len(e.seconds)
    total = 1  # the instant a gap's walls are shifted to, when lo is that very instant
    for day in range(lo_w // _DAY_S, hi_w // _DAY_S + 1):
        d = date.fromordinal(_EPOCH_ORDINAL + day)
        if d.month not in e.months or d.day not in e.days_of(d.year, d.month):
            continue
        base = day * _DAY_S
        total += _times_between(e, max(lo_w, base) - base, min(hi_w, base + _DAY_S - 1) - base)
        if both:  # the clock goes back about then: a repeated interval's walls fire twice
            back = _offset(tz, base - _ZONE_SPAN_S) - _offset(tz, base + _DAY_S + _ZONE_SPAN_S)
            if back > 0:
                total += per_hour * -(-back // 3600)
    return total


def _times_between(e: CronExpr, a: int, b: int) -> int:
    """How many of the expression's times of day (seconds since midnight) lie in [a, b]."""
    seconds, per_minute = e.seconds, len(e.seconds)
    n = 0
    for h in e.hours:
        hs = h * 3600
        if hs + 3599 < a or hs > b:
            continue
        if a <= hs and hs + 3599 <= b:
            n += len(e.minutes) * per_minute
            continue
        for m in e.minutes:
            ms = hs + m * 60
            if ms + 59 < a or ms > b:
                continue
            n += per_minute if a <= ms and ms + 59 <= b else sum(1 for x in seconds if a <= ms + x <= b)
    return n


# ------------------------------------------------------------------ sharing the cluster's rate
def fair_rates(running: Iterable[tuple[str, str, float]], cluster: float, per_namespace: float) -> dict[str, float]:
    """The rate each running backfill ``(id, namespace, max_per_second)`` is handed out at: a
    namespace asks for its backfills' rates together, at most ``per_namespace``; ``cluster`` is
    shared between the namespaces max-min fairly (each gets what it asks for, or an equal share of
    what the smaller askers leave); a namespace's share is split between its backfills in
    proportion to their rates. Every node computes the same from the same rows."""
    by_namespace: dict[str, list[tuple[str, float]]] = {}
    for backfill_id, namespace, rate in running:
        by_namespace.setdefault(namespace, []).append((backfill_id, rate))
    asked = {ns: min(per_namespace, sum(r for _, r in items)) for ns, items in by_namespace.items()}
    share: dict[str, float] = {}
    left = cluster
    ordered = sorted(asked.items(), key=lambda kv: (kv[1], kv[0]))
    for i, (ns, wants) in enumerate(ordered):
        share[ns] = min(wants, left / (len(ordered) - i))
        left -= share[ns]
    out: dict[str, float] = {}
    for ns, items in by_namespace.items():
        total = sum(r for _, r in items)
        scale = min(1.0, share[ns] / total) if total > 0 else 0.0
        out.update((backfill_id, rate * scale) for backfill_id, rate in items)
    return out
