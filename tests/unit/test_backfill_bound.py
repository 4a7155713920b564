"""The bound a backfill request is checked against before its occurrences are listed: never below
the true count (whatever the expression, zone, DST policy and range), close to it for ordinary
schedules, and cheap whatever the range."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cronman.model.backfills import most_occurrences, occurrences
from cronman.model.schedule import timing_from_dict
from cronman.model.timeutil import parse_iso
from tests.unit.cron_reference import expressions

DAY = 86_400_000
ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata"]
# instants near DST transitions of those zones in 2026, and an ordinary day
AROUND = [parse_iso(t) for t in ("2026-03-08T05:00:00Z", "2026-11-01T04:00:00Z", "2026-10-25T00:00:00Z",
                                 "2026-04-05T02:00:00Z", "2026-09-06T03:00:00Z", "2026-06-10T00:00:00Z")]  # fmt: skip


def _exact(schedule: dict[str, Any], lo: int, hi: int, limit: int) -> int:
    return len(occurrences(timing_from_dict(schedule, "job-1", "default"), lo, hi, limit))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(
    model=expressions(star=0.15),
    more=st.lists(expressions(star=0.1), max_size=2),
    tz=st.sampled_from(ZONES),
    fold=st.sampled_from(["first", "both"]),
    gap=st.sampled_from(["shift", "skip"]),
    around=st.sampled_from(AROUND),
    start=st.integers(-2 * DAY, DAY),
    span=st.integers(0, 3 * DAY),
)
def test_the_bound_is_never_below_the_count(
    model: Any, more: list[Any], tz: str, fold: str, gap: str, around: int, start: int, span: int
) -> None:
    texts = [model.text, *(m.text for m in more)]
    schedule: dict[str, Any] = {"type": "cron", "expressions": texts, "timezone": tz, "dst_fold": fold, "dst_gap": gap}
    lo = around + start
    hi = lo + span
    bound = most_occurrences(schedule, "job-1", "default", lo, hi)
    assume(bound <= 5_000)
    assert _exact(schedule, lo, hi, bound + 1) <= bound


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    every=st.integers(1, 600) | st.integers(1, 7 * 86_400),
    start_at=st.none() | st.integers(0, 10 * DAY),
    end_at=st.none() | st.integers(0, 10 * DAY),
    jitter=st.sampled_from([None, 0.5, 30.0]),
    lo=st.integers(0, 10 * DAY),
    span=st.integers(0, 2 * DAY),
)
# a jittered window can hold no occurrence where the bound counts three bases (a base just before
# the window moved later but not into it, none in it, the next moved past its end)
@example(every=32, start_at=None, end_at=None, jitter=30.0, lo=0, span=34_000)
def test_intervals_are_counted_exactly_or_one_over(
    every: int, start_at: int | None, end_at: int | None, jitter: float | None, lo: int, span: int
) -> None:
    assume(jitter is None or jitter < every)  # (as the API requires: jittered occurrences keep their order)
    base = 1_780_000_000_000
    schedule: dict[str, Any] = {"type": "interval", "every_seconds": every}
    if start_at is not None:
        schedule["start_at"] = base + start_at
    if end_at is not None:
        schedule["end_at"] = base + end_at
    if jitter is not None:
        schedule["jitter_seconds"] = jitter
    bound = most_occurrences(schedule, "job-1", "default", base + lo, base + lo + span)
    exact = _exact(schedule, base + lo, base + lo + span, bound + 2)
    # The bound counts the bases in the window widened by the jitter: at most one over the bases;
    # the jitter can move the bases of each edge's jitter-wide strip out of the window.
    edge = 0 if jitter is None else -(-int(jitter * 1000) // (every * 1000))
    assert exact <= bound <= exact + 1 + 2 * edge


BERLIN_9AM = {"type": "cron", "expression": "0 9 * * 1-5", "timezone": "Europe/Berlin"}
NY_EVERY_5 = {"type": "cron", "expression": "*/5 * * * *", "timezone": "America/New_York"}
NY_2_30 = {"type": "cron", "expression": "30 2 * * *", "timezone": "America/New_York"}


@pytest.mark.parametrize(
    ("schedule", "lo", "hi"),
    [
        ({"type": "cron", "expression": "* * * * * *"}, "2026-06-10T00:00:00Z", "2026-06-11T00:00:00Z"),
        (BERLIN_9AM, "2026-06-01T00:00:00Z", "2026-07-01T00:00:00Z"),
        (NY_EVERY_5, "2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z"),
        (NY_2_30, "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"),
        ({"type": "cron", "expression": "0 0 L * *"}, "2026-01-01T00:00:00Z", "2026-12-31T23:59:59Z"),
        ({"type": "once", "at": "2026-06-10T10:00:00Z"}, "2026-06-10T00:00:00Z", "2026-06-11T00:00:00Z"),
    ],
)
def test_ordinary_schedules_are_counted_nearly_exactly(schedule: dict[str, Any], lo: str, hi: str) -> None:
    bound = most_occurrences(schedule, "job-1", "default", parse_iso(lo), parse_iso(hi))
    exact = _exact(schedule, parse_iso(lo), parse_iso(hi), bound + 1)
    assert exact <= bound <= exact + 2, (exact, bound)


def test_the_bound_costs_little_whatever_the_range() -> None:
    """A per-second job over 45 days (3.9 million occurrences): the bound answers in a millisecond
    or so; listing them would take minutes (listing 100,001 took 2.25 s)."""
    schedule = {"type": "cron", "expression": "* * * * * *", "timezone": "America/New_York", "dst_fold": "both"}
    lo = parse_iso("2026-10-01T00:00:00Z")
    started = time.perf_counter()
    bound = most_occurrences(schedule, "job-1", "default", lo, lo + 45 * DAY)
    took = time.perf_counter() - started
    assert bound >= 45 * 86_400 and took < 0.05, (bound, took)
