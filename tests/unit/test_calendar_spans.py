"""Excluded spans: the first instant of a day whose midnight does not exist, timings that jump over a
span at once (never running out of skips), the one row a node records for a span, and what a
calendar costs in memory and to load.

The four zones below spring forward at midnight (00:00 becomes 01:00): the day after the gap starts
at the transition, not at the earlier reading of midnight an hour before it (which is still the day
before). Computed an hour early, a job firing every 2 s stepped through that hour one skip at a
time, ran out of skips, and had no next occurrence: `/next` was empty, the job showed completed, and
a backfill across the gap was cut short.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cronman.model.calendars import (
    MAX_SKIP_DAYS,
    Calendar,
    CalendarTiming,
    FiringTiming,
    calendar_from_dict,
    calendar_from_stored,
    excluded_span,
    skip_summary,
)
from cronman.model.misfire import between
from cronman.model.schedule import IntervalTiming, count_between, timing_from_dict
from cronman.model.timeutil import iso, parse_iso

# zone, the day whose midnight is in a gap, the transition (its first instant)
MIDNIGHT_GAPS = [
    ("America/Havana", date(2026, 3, 8), "2026-03-08T05:00:00Z"),
    ("America/Santiago", date(2026, 9, 6), "2026-09-06T04:00:00Z"),
    ("Africa/Cairo", date(2026, 4, 24), "2026-04-23T22:00:00Z"),
    ("Asia/Beirut", date(2026, 3, 29), "2026-03-28T22:00:00Z"),
]


def every(seconds: int) -> IntervalTiming:
    return IntervalTiming(seconds * 1000, parse_iso("2026-01-01T00:00:00Z"))


def the_day_before_off(tz: str, day: date) -> Calendar:
    return calendar_from_dict({"timezone": tz, "exclude": {"dates": [(day - timedelta(days=1)).isoformat()]}})


def local_noon(tz: str, day: date) -> int:
    return int(datetime(day.year, day.month, day.day, 12, tzinfo=ZoneInfo(tz)).timestamp() * 1000)


@pytest.mark.parametrize(("tz", "day", "first"), MIDNIGHT_GAPS)
def test_a_day_whose_midnight_is_in_a_gap_starts_at_the_transition(tz: str, day: date, first: str) -> None:
    cal = Calendar(tz)
    start = cal.start_of(day)
    assert iso(start) == first
    assert cal.local_date(start) == day and cal.local_date(start - 1) == day - timedelta(days=1)
    assert datetime.fromtimestamp(start / 1000, ZoneInfo(tz)).strftime("%H:%M") == "01:00"
    # the days around it start at their midnight
    for d in (day - timedelta(days=1), day + timedelta(days=1)):
        s = cal.start_of(d)
        assert cal.local_date(s) == d and cal.local_date(s - 1) == d - timedelta(days=1)


@pytest.mark.parametrize(("tz", "day", "first"), MIDNIGHT_GAPS)
def test_a_job_every_two_seconds_resumes_at_the_first_instant_of_the_included_day(
    tz: str, day: date, first: str
) -> None:
    cal = the_day_before_off(tz, day)
    due = CalendarTiming(every(2), (("off", cal),))
    # from noon of the excluded day: the next occurrence is the included day's first instant
    assert iso(due.next_after(local_noon(tz, day - timedelta(days=1))) or 0) == first
    # the same through cron, every second
    cron = timing_from_dict({"type": "cron", "expression": "* * * * * *", "timezone": tz}, "j", "default")
    assert iso(CalendarTiming(cron, (("off", cal),)).next_after(local_noon(tz, day - timedelta(days=1))) or 0) == first
    # what a node fires: the excluded day's first occurrence (its one skipped row), then the included day
    fired = FiringTiming(due)
    day_before = cal.start_of(day - timedelta(days=1))
    marker = fired.next_after(day_before - 1)
    assert marker == day_before
    assert iso(fired.next_after(marker) or 0) == first
    summary = skip_summary(due, marker)
    assert summary is not None and summary.until_ms == parse_iso(first)
    assert summary.occurrences == (parse_iso(first) - day_before) // 2000 and summary.complete
    assert summary.last_ms == parse_iso(first) - 2000


@pytest.mark.parametrize(("tz", "day", "first"), MIDNIGHT_GAPS)
def test_occurrences_across_the_gap_are_all_there(tz: str, day: date, first: str) -> None:
    """A backfill of three hours from noon of the excluded day (every 2 s) has 5,400 occurrences,
    the first at the transition (it had 1,800: the timing ran out of skips an hour in)."""
    due = CalendarTiming(every(2), (("off", the_day_before_off(tz, day)),))
    start = parse_iso(first)
    got = between(due, local_noon(tz, day - timedelta(days=1)), start + 3 * 3600_000 - 1, 100_000)
    assert len(got) == 5400 and got[0] == start and got[-1] == start + 3 * 3600_000 - 2000


def test_a_span_is_jumped_over_in_one_step_whatever_the_frequency() -> None:
    calls = 0

    class Counting(IntervalTiming):
        def next_after(self, after_ms: int) -> int | None:
            nonlocal calls
            calls += 1
            return IntervalTiming.next_after(self, after_ms)

    cal = calendar_from_dict(
        {"timezone": "Europe/Berlin", "exclude": {"ranges": [{"from": "2026-12-24", "to": "2027-01-06"}]}}
    )
    base = Counting(1000, 0)
    fired = FiringTiming(CalendarTiming(base, (("c", cal),)))
    start = cal.start_of(date(2026, 12, 24))
    assert fired.next_after(start - 1) == start  # the span's first occurrence (1.2 million in the span)
    calls = 0
    assert fired.next_after(start) == cal.start_of(date(2027, 1, 7))
    assert calls <= 3
    summary = skip_summary(CalendarTiming(base, (("c", cal),)), start)
    assert summary is not None and summary.occurrences == 14 * 86_400 and summary.complete


def test_a_job_made_during_a_span_has_its_row_for_the_rest_of_it() -> None:
    cal = calendar_from_dict({"exclude": {"dates": ["2026-12-25"]}})
    due = CalendarTiming(every(60), (("c", cal),))
    made = parse_iso("2026-12-25T10:00:30Z")
    assert FiringTiming(due, since_ms=made).next_after(made) == parse_iso("2026-12-25T10:01:00Z")
    # without a job made then, the span's row is its first occurrence's, long past: jumped over
    assert FiringTiming(due).next_after(made) == parse_iso("2026-12-26T00:00:00Z")


def test_spans_join_across_calendars_and_zones() -> None:
    # Friday off in Tokyo (Thu 15:00Z - Fri 15:00Z) and Friday off in New York (Fri 05:00Z - Sat 05:00Z)
    tokyo = Calendar("Asia/Tokyo", dates=[date(2026, 12, 18)])
    new_york = Calendar("America/New_York", dates=[date(2026, 12, 18)])
    span = excluded_span([tokyo, new_york], parse_iso("2026-12-18T12:00:00Z"))
    assert span is not None and (iso(span[0] or 0), iso(span[1] or 0)) == (
        "2026-12-17T15:00:00Z",
        "2026-12-19T05:00:00Z",
    )
    assert excluded_span([tokyo, new_york], parse_iso("2026-12-19T05:00:00Z")) is None


def test_weekdays_and_dates_make_one_span() -> None:
    cal = calendar_from_dict({"exclude": {"weekdays": ["sat", "sun"], "dates": ["2026-12-21", "2026-12-18"]}})
    span = excluded_span([cal], parse_iso("2026-12-20T09:00:00Z"))
    assert span is not None and (iso(span[0] or 0), iso(span[1] or 0)) == (
        "2026-12-18T00:00:00Z",
        "2026-12-22T00:00:00Z",
    )
    assert cal.run(date(2026, 12, 20)) == (date(2026, 12, 18), date(2026, 12, 21))


def test_a_fold_across_midnight_does_not_stall() -> None:
    """America/Goose_Bay until 2011 went back from 00:01 to 23:01 the day before: the day before
    comes back for an hour after the next day began. A job every minute with that day before off
    is due again once the repeated hour is over, in one step."""
    cal = Calendar("America/Goose_Bay", dates=[date(2009, 10, 31)])
    due = CalendarTiming(every(60), (("c", cal),))
    got = between(due, parse_iso("2009-10-31T12:00:00Z"), parse_iso("2009-11-01T06:00:00Z"), 1000)
    assert got and all(not cal.excludes(t) for t in got)
    repeated = [t for t in range(parse_iso("2009-11-01T02:00:00Z"), parse_iso("2009-11-01T06:00:00Z"), 60_000)]
    assert [t for t in repeated if not cal.excludes(t)] == [t for t in got if t in set(repeated)]


def test_counting_is_arithmetic_for_intervals_and_bounded_otherwise() -> None:
    assert count_between(every(1), 0, 365 * 86_400_000, 10) == (365 * 86_400, 365 * 86_400_000, True)
    n, last, complete = count_between(
        every(1), parse_iso("2026-01-01T00:00:00Z"), parse_iso("2026-01-02T00:00:00Z"), 10
    )
    assert (n, iso(last or 0), complete) == (86_400, "2026-01-02T00:00:00Z", True)
    cron = timing_from_dict({"type": "cron", "expression": "* * * * * *"}, "j", "default")
    n, last, complete = count_between(cron, parse_iso("2026-01-01T00:00:00Z"), parse_iso("2026-01-02T00:00:00Z"), 1000)
    assert (n, iso(last or 0), complete) == (1000, "2026-01-01T00:16:40Z", False)
    assert count_between(cron, 0, 0, 10) == (0, None, True)


def test_giving_up_is_only_for_jobs_that_fire_on_excluded_days_alone() -> None:
    weekends = calendar_from_dict({"exclude": {"weekdays": ["sat", "sun"]}})
    saturdays = timing_from_dict({"type": "cron", "expression": "0 9 * * SAT"}, "j", "default")
    started = time.perf_counter()
    assert CalendarTiming(saturdays, (("w", weekends),)).next_after(0) is None
    assert time.perf_counter() - started < 1.0
    assert FiringTiming(CalendarTiming(saturdays, (("w", weekends),))).next_after(0) is not None  # its rows
    assert MAX_SKIP_DAYS >= 366


def test_a_ten_thousand_date_calendar_is_small_and_quick_to_load() -> None:
    """10,000 dates: 140 KB of document. Sets of date objects took about 1.6 MB and 0.115 s to parse;
    kept as arrays of day ordinals they take about 40 KB, and a node loads a stored one in a few
    milliseconds without checking each entry again."""
    first = date(2026, 1, 1)
    doc = {
        "timezone": "Europe/Berlin",
        "exclude": {"dates": [(first + timedelta(days=2 * i)).isoformat() for i in range(10_000)]},
    }
    text = json.dumps(doc)
    assert 130_000 < len(text) < 150_000
    tracemalloc.start()
    try:
        cal = calendar_from_stored(json.loads(text))
        del doc
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size < 200_000, size  # the calendar (and what little json.loads left behind)
    assert cal.nbytes < 60_000, cal.nbytes
    loads = []
    for _ in range(3):
        started = time.perf_counter()
        assert calendar_from_stored(json.loads(text)) == cal
        loads.append(time.perf_counter() - started)
    assert min(loads) < 0.05, loads
    assert calendar_from_dict(json.loads(text)) == cal
    assert cal.excludes(parse_iso("2026-01-01T12:00:00Z")) and not cal.excludes(parse_iso("2026-01-02T12:00:00Z"))
