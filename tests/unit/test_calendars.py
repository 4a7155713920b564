"""Business calendars: documents, exclusions in a time zone, and a timing that skips excluded days."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.calendars import (
    MAX_SKIP_DAYS,
    Calendar,
    CalendarError,
    CalendarTiming,
    calendar_from_dict,
    calendar_to_dict,
)
from cronman.model.schedule import IntervalTiming, Timing, cron_rule, next_times, timing_from_dict
from cronman.model.timeutil import MAX_INSTANT_MS, MIN_INSTANT_MS, iso, parse_iso

ISSUE_EXAMPLE = {
    "timezone": "Europe/Berlin",
    "exclude": {
        "dates": ["2026-12-25"],
        "ranges": [{"from": "2026-12-24", "to": "2026-12-31"}],
        "annual": ["01-01"],
        "weekdays": ["sat", "sun"],
    },
}


def daily(tz: str = "UTC", at: str = "0 9 * * *") -> Timing:
    return timing_from_dict({"type": "cron", "expression": at, "timezone": tz}, "job", "default")


def test_a_daily_job_skips_weekends_and_christmas() -> None:
    cal = calendar_from_dict({"timezone": "UTC", "exclude": {"dates": ["2026-12-25"], "weekdays": ["sat", "sun"]}})
    timing = CalendarTiming(daily(), (("holidays", cal),))
    got = [iso(t)[:10] for t in next_times(timing, parse_iso("2026-12-18T00:00:00Z"), 7)]
    assert got == ["2026-12-18", "2026-12-21", "2026-12-22", "2026-12-23", "2026-12-24", "2026-12-28", "2026-12-29"]
    for day in ["2026-12-19", "2026-12-20", "2026-12-25", "2026-12-26", "2026-12-27"]:
        assert timing.excluded_by(parse_iso(f"{day}T09:00:00Z")) == "holidays"
    assert timing.excluded_by(parse_iso("2026-12-24T09:00:00Z")) is None


def test_the_issue_example_document() -> None:
    cal = calendar_from_dict(ISSUE_EXAMPLE)
    assert cal.timezone == "Europe/Berlin"
    assert cal.dates == {date(2026, 12, 25)} and cal.annual == {(1, 1)} and cal.weekdays == {5, 6}
    assert cal.ranges == ((date(2026, 12, 24), date(2026, 12, 31)),)
    assert calendar_from_dict(calendar_to_dict(cal)) == cal
    timing = CalendarTiming(daily("Europe/Berlin"), (("holidays", cal),))
    got = [iso(t) for t in next_times(timing, parse_iso("2026-12-22T12:00:00Z"), 3)]
    # 23rd, then nothing until 2027-01-04 (1 Jan annual, 2-3 Jan a weekend)
    assert got == ["2026-12-23T08:00:00Z", "2027-01-04T08:00:00Z", "2027-01-05T08:00:00Z"]


def test_the_local_date_is_read_in_the_calendars_zone() -> None:
    # 2026-12-20T22:00Z is Sunday in London and Monday 09:00 in Sydney
    weekend = Calendar("Australia/Sydney", weekdays=frozenset({5, 6}))
    assert not weekend.excludes(parse_iso("2026-12-20T22:00:00Z"))
    assert Calendar("Europe/London", weekdays=frozenset({5, 6})).excludes(parse_iso("2026-12-20T22:00:00Z"))
    assert weekend.excludes(parse_iso("2026-12-20T12:00:00Z"))  # 23:00 Sunday in Sydney


def test_annual_dates_and_leap_days() -> None:
    cal = calendar_from_dict({"exclude": {"annual": ["02-29", "12-31"]}})
    timing = CalendarTiming(daily(at="0 0 * * *"), (("c", cal),))
    got = [iso(t)[:10] for t in next_times(timing, parse_iso("2027-02-27T12:00:00Z"), 3)]
    assert got == ["2027-02-28", "2027-03-01", "2027-03-02"]  # 2027 has no 29 February
    got = [iso(t)[:10] for t in next_times(timing, parse_iso("2028-02-27T12:00:00Z"), 3)]
    assert got == ["2028-02-28", "2028-03-01", "2028-03-02"]
    assert cal.excludes(parse_iso("2030-12-31T12:00:00Z"))


def test_several_calendars_are_named_in_order() -> None:
    weekends = Calendar(weekdays=frozenset({5, 6}))
    holidays = calendar_from_dict({"exclude": {"dates": ["2026-12-25", "2026-12-26"]}})
    timing = CalendarTiming(daily(), (("weekends", weekends), ("holidays", holidays)))
    assert timing.excluded_by(parse_iso("2026-12-25T09:00:00Z")) == "holidays"
    assert timing.excluded_by(parse_iso("2026-12-26T09:00:00Z")) == "weekends"  # a Saturday: the first named
    assert [iso(t)[:10] for t in next_times(timing, parse_iso("2026-12-24T12:00:00Z"), 1)] == ["2026-12-28"]


def test_an_excluded_day_is_jumped_over_not_walked() -> None:
    calls = 0

    class Counting:
        def next_after(self, after_ms: int) -> int | None:
            nonlocal calls
            calls += 1
            return cron_rule("* * * * * *", "Europe/Berlin").next_after(after_ms)

    cal = calendar_from_dict(
        {
            "timezone": "Europe/Berlin",
            "exclude": {"weekdays": ["sat", "sun"], "ranges": [{"from": "2027-01-01", "to": "2027-12-31"}]},
        }
    )
    timing = CalendarTiming(Counting(), (("c", cal),))
    friday_last_second = parse_iso("2026-12-18T22:59:58Z")  # 23:59:58 in Berlin
    got = [iso(t) for t in next_times(timing, friday_last_second, 2)]
    assert got == ["2026-12-18T22:59:59Z", "2026-12-20T23:00:00Z"]  # then Monday 00:00 in Berlin
    assert calls <= 6
    calls = 0
    assert iso(timing.next_after(parse_iso("2026-12-31T22:59:59Z")) or 0) == "2028-01-02T23:00:00Z"  # a year at once
    assert calls <= 4


def test_long_ranges_and_runs_of_excluded_years_are_not_given_up_on() -> None:
    decade = calendar_from_dict({"exclude": {"ranges": [{"from": "2027-01-01", "to": "2036-12-31"}]}})
    got = CalendarTiming(daily(), (("c", decade),)).next_after(parse_iso("2026-12-31T12:00:00Z"))
    assert iso(got or 0) == "2037-01-01T09:00:00Z"
    # Christmas fell on a weekend in 2021 and 2022
    weekends = Calendar(weekdays=frozenset({5, 6}))
    christmas = CalendarTiming(daily(at="0 9 25 12 *"), (("w", weekends),))
    assert iso(christmas.next_after(parse_iso("2021-01-01T00:00:00Z")) or 0) == "2023-12-25T09:00:00Z"


def test_a_calendar_that_excludes_everything_gives_up() -> None:
    every_day = Calendar(weekdays=frozenset(range(7)))
    assert CalendarTiming(daily(), (("all", every_day),)).next_after(0) is None
    # and one that excludes only what the job names (every Saturday job, weekends excluded)
    saturdays = CalendarTiming(daily(at="0 9 * * SAT"), (("w", Calendar(weekdays=frozenset({5, 6}))),))
    assert saturdays.next_after(parse_iso("2026-01-01T00:00:00Z")) is None
    assert MAX_SKIP_DAYS >= 366


def test_excluded_days_at_a_midnight_that_does_not_exist() -> None:
    # Santiago springs forward at 24:00 on 2026-09-05: 6 September starts at 01:00 local (04:00Z)
    cal = calendar_from_dict({"timezone": "America/Santiago", "exclude": {"dates": ["2026-09-05"]}})
    hourly = timing_from_dict(
        {"type": "cron", "expression": "0 * * * *", "timezone": "America/Santiago"}, "j", "default"
    )
    timing = CalendarTiming(hourly, (("c", cal),))
    assert iso(timing.next_after(parse_iso("2026-09-05T12:00:00Z")) or 0) == "2026-09-06T04:00:00Z"


@pytest.mark.parametrize(
    ("doc", "field", "says"),
    [
        ([], "", "an object"),
        ({"timezone": "Mars/Base"}, "timezone", "unknown time zone"),
        ({"timezone": 5}, "timezone", "must be a string"),
        ({"extra": 1}, "extra", "unknown field"),
        ({"exclude": []}, "exclude", "must be an object"),
        ({"exclude": {"holidays": []}}, "exclude.holidays", "unknown field"),
        ({"exclude": {"dates": "2026-12-25"}}, "exclude.dates", "must be a list"),
        ({"exclude": {"dates": ["2026-12-25", "25.12.2026"]}}, "exclude.dates[1]", "YYYY-MM-DD"),
        ({"exclude": {"dates": ["2026-02-30"]}}, "exclude.dates[0]", "is not a date"),
        ({"exclude": {"dates": ["2026-W52-5"]}}, "exclude.dates[0]", "YYYY-MM-DD"),
        ({"exclude": {"dates": ["1969-12-31"]}}, "exclude.dates[0]", "outside"),
        ({"exclude": {"dates": ["9000-01-01"]}}, "exclude.dates[0]", "outside"),
        ({"exclude": {"dates": [20261225]}}, "exclude.dates[0]", "YYYY-MM-DD"),
        ({"exclude": {"ranges": [{"from": "2026-12-24"}]}}, "exclude.ranges[0]", '"from"'),
        ({"exclude": {"ranges": [{"from": "2026-12-24", "to": "2026-12-01"}]}}, "exclude.ranges[0].to", "before"),
        ({"exclude": {"ranges": [{"from": "x", "to": "2026-12-01"}]}}, "exclude.ranges[0].from", "YYYY-MM-DD"),
        ({"exclude": {"annual": ["12-32"]}}, "exclude.annual[0]", "not a day of the year"),
        ({"exclude": {"annual": ["1-1"]}}, "exclude.annual[0]", "MM-DD"),
        ({"exclude": {"annual": ["٠١-٠١"]}}, "exclude.annual[0]", "MM-DD"),
        ({"exclude": {"weekdays": ["saturday"]}}, "exclude.weekdays[0]", "mon, tue"),
        ({"exclude": {"weekdays": [6]}}, "exclude.weekdays[0]", "mon, tue"),
        ({"exclude": {"dates": ["2026-01-01"] * 10_001}}, "exclude.dates", "at most"),
    ],
)
def test_bad_documents_name_the_field(doc: object, field: str, says: str) -> None:
    with pytest.raises(CalendarError) as caught:
        calendar_from_dict(doc)
    assert caught.value.field == field and says in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_defaults_and_case() -> None:
    cal = calendar_from_dict({"exclude": {"weekdays": ["SAT", "Sun"]}})
    assert cal.timezone == "UTC" and cal.weekdays == {5, 6}
    assert calendar_from_dict({}) == Calendar()


# ---------------------------------------------------------------------------------------- properties
_day = st.dates(date(2025, 1, 1), date(2028, 12, 31))


@st.composite
def calendars(draw: st.DrawFn) -> Calendar:
    ranges = []
    for start in draw(st.lists(_day, max_size=3)):
        ranges.append((start, start + timedelta(days=draw(st.integers(0, 40)))))
    return Calendar(
        timezone=draw(
            st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "Pacific/Chatham"])
        ),
        dates=frozenset(draw(st.lists(_day, max_size=20))),
        ranges=tuple(ranges),
        annual=frozenset(draw(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 28)), max_size=5))),
        weekdays=frozenset(draw(st.lists(st.integers(0, 6), max_size=3))),
    )


def _excluded_slowly(cal: Calendar, instant_ms: int) -> bool:
    d = datetime.fromtimestamp(instant_ms / 1000, ZoneInfo(cal.timezone)).date()
    return (
        d.weekday() in cal.weekdays
        or d in cal.dates
        or (d.month, d.day) in cal.annual
        or any(a <= d <= b for a, b in cal.ranges)
    )


@settings(max_examples=200, deadline=None)
@given(
    cals=st.lists(calendars(), min_size=1, max_size=2),
    expression=st.sampled_from(["0 9 * * *", "*/30 * * * *", "0 0 * * MON", "0 12 L * *", "0 */7 * * *"]),
    tz=st.sampled_from(["UTC", "Europe/Berlin", "Australia/Sydney"]),
    after=st.integers(parse_iso("2025-01-01T00:00:00Z"), parse_iso("2028-06-01T00:00:00Z")),
)
def test_the_next_occurrence_is_the_first_one_no_calendar_excludes(
    cals: list[Calendar], expression: str, tz: str, after: int
) -> None:
    base = timing_from_dict({"type": "cron", "expression": expression, "timezone": tz}, "j", "default")
    timing = CalendarTiming(base, tuple((f"c{i}", c) for i, c in enumerate(cals)))
    got = timing.next_after(after)
    t = base.next_after(after)
    for _ in range(5000):  # the slow way: every base occurrence in turn
        if t is None or not any(_excluded_slowly(c, t) for c in cals):
            break
        t = base.next_after(t)
    else:
        return  # further than the slow way looks
    assert got == t
    if got is not None:
        assert timing.excluded_by(got) is None


@settings(max_examples=200, deadline=None)
@given(
    cal=calendars(),
    every=st.integers(1, 86_400 * 40),
    after=st.integers(MIN_INSTANT_MS - 1, MAX_INSTANT_MS + 2 * 365 * 86_400_000) | st.integers(-(10**18), 10**18),
)
def test_calendar_timing_is_total(cal: Calendar, every: int, after: int) -> None:
    timing = CalendarTiming(IntervalTiming(every * 1000, 0), (("c", cal),))
    got = timing.next_after(after)
    assert got is None or got > after
    assert isinstance(cal.excludes(after), bool)
