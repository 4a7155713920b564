"""Schedule maths: table tests (cron, interval, once, bounds, DST in several zones) and properties."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.schedule import (
    FoldPolicy,
    GapPolicy,
    IntervalTiming,
    OnceTiming,
    cron_rule,
    next_times,
    phase_for,
    timing_from_dict,
    validate_cron,
    validate_timezone,
)
from cronman.model.timeutil import iso, parse_iso


def times(schedule: dict, after: str, count: int, job_id: str = "job") -> list[str]:
    return [iso(t) for t in next_times(timing_from_dict(schedule, job_id, "default"), parse_iso(after), count)]


def cron(expression: str, tz: str = "UTC", **extra: str) -> dict:
    return {"type": "cron", "expression": expression, "timezone": tz, **extra}


# ---------------------------------------------------------------------------------------- cron
@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("0 7 * * *", "2026-11-21T06:00:00Z", ["2026-11-21T07:00:00Z", "2026-11-22T07:00:00Z"]),
        ("0 7 * * *", "2026-11-21T07:00:00Z", ["2026-11-22T07:00:00Z", "2026-11-23T07:00:00Z"]),
        ("*/15 * * * *", "2026-11-21T06:07:30Z", ["2026-11-21T06:15:00Z", "2026-11-21T06:30:00Z"]),
        ("30 */5 * * * *", "2026-11-21T06:00:00Z", ["2026-11-21T06:00:30Z", "2026-11-21T06:05:30Z"]),
        ("0 0 1 * *", "2026-11-21T00:00:00Z", ["2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"]),
        ("0 9 * * MON-FRI", "2026-11-20T10:00:00Z", ["2026-11-23T09:00:00Z", "2026-11-24T09:00:00Z"]),
        ("@daily", "2026-11-21T06:00:00Z", ["2026-11-22T00:00:00Z", "2026-11-23T00:00:00Z"]),
        ("0 0 29 2 *", "2026-01-01T00:00:00Z", ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]),
    ],
)
def test_cron_utc(expression: str, after: str, expected: list[str]) -> None:
    assert times(cron(expression), after, len(expected)) == expected


def test_after_is_exclusive_even_within_a_second() -> None:
    assert times(cron("0 7 * * *"), "2026-11-21T07:00:00.500Z", 1) == ["2026-11-22T07:00:00Z"]
    assert times(cron("0 7 * * *"), "2026-11-21T06:59:59.999Z", 1) == ["2026-11-21T07:00:00Z"]


def test_new_york_spring_forward_shifts_to_the_end_of_the_gap() -> None:
    # 02:30 does not exist on 2026-03-08: fire at 03:00 EDT (07:00Z), the first instant after the gap.
    assert times(cron("30 2 * * *", "America/New_York"), "2026-03-07T00:00:00Z", 4) == [
        "2026-03-07T07:30:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
        "2026-03-10T06:30:00Z",
    ]


def test_new_york_spring_forward_skip_policy() -> None:
    assert times(cron("30 2 * * *", "America/New_York", dst_gap="skip"), "2026-03-07T00:00:00Z", 3) == [
        "2026-03-07T07:30:00Z",
        "2026-03-09T06:30:00Z",
        "2026-03-10T06:30:00Z",
    ]


def test_new_york_fall_back_fires_once_for_an_unambiguous_time() -> None:
    # On 2026-11-01 01:00-02:00 repeats; 02:30 happens once (EST).
    assert times(cron("30 2 * * *", "America/New_York"), "2026-10-31T00:00:00Z", 3) == [
        "2026-10-31T06:30:00Z",
        "2026-11-01T07:30:00Z",
        "2026-11-02T07:30:00Z",
    ]


def test_repeated_hour_first_and_both() -> None:
    first = times(cron("30 1 * * *", "America/New_York"), "2026-10-31T12:00:00Z", 2)
    both = times(cron("30 1 * * *", "America/New_York", dst_fold="both"), "2026-10-31T12:00:00Z", 3)
    assert first == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    assert both == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]


def test_gap_minutes_collapse_to_one_fire() -> None:
    # Every 20 minutes of the non-existent 02:xx hour map to 03:00 EDT: fire once there.
    got = times(cron("*/20 2 * * *", "America/New_York"), "2026-03-08T00:00:00Z", 2)
    assert got == ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"]


@pytest.mark.parametrize(
    ("tz", "expression", "after", "expected"),
    [
        # Southern hemisphere: Sydney leaves DST on 2026-04-05 (03:00 -> 02:00) and enters it on 2026-10-04.
        (
            "Australia/Sydney",
            "30 2 * * *",
            "2026-10-02T00:00:00Z",
            ["2026-10-02T16:30:00Z", "2026-10-03T16:00:00Z", "2026-10-04T15:30:00Z"],
        ),
        (
            "Australia/Sydney",
            "30 2 * * *",
            "2026-04-03T00:00:00Z",
            ["2026-04-03T15:30:00Z", "2026-04-04T15:30:00Z", "2026-04-05T16:30:00Z"],
        ),
        # Lord Howe moves by 30 minutes (02:00 -> 02:30 on 2026-10-04).
        (
            "Australia/Lord_Howe",
            "15 2 * * *",
            "2026-10-02T00:00:00Z",
            ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
        ),
        # A 30-minute offset with no DST.
        ("Asia/Kolkata", "0 9 * * *", "2026-03-07T00:00:00Z", ["2026-03-07T03:30:00Z", "2026-03-08T03:30:00Z"]),
        # London springs forward at 01:00 on 2026-03-29.
        (
            "Europe/London",
            "30 1 * * *",
            "2026-03-28T00:00:00Z",
            ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        ),
        # Adelaide: +9:30 / +10:30.
        ("Australia/Adelaide", "0 12 * * *", "2026-10-03T00:00:00Z", ["2026-10-03T02:30:00Z", "2026-10-04T01:30:00Z"]),
    ],
)
def test_zones_and_transitions(tz: str, expression: str, after: str, expected: list[str]) -> None:
    assert times(cron(expression, tz), after, len(expected)) == expected


@pytest.mark.parametrize(
    "tz",
    [
        "America/New_York",
        "Europe/London",
        "Australia/Sydney",
        "Australia/Lord_Howe",
        "Asia/Kolkata",
        "America/Santiago",
    ],
)
@pytest.mark.parametrize("local", ["02:30", "01:30", "00:00", "12:00"])
def test_a_daily_job_fires_exactly_once_each_local_day_for_a_year(tz: str, local: str) -> None:
    hh, mm = (int(x) for x in local.split(":"))
    zone = ZoneInfo(tz)
    start = datetime(2026, 1, 1, tzinfo=zone).astimezone(UTC)
    fired = next_times(
        timing_from_dict(cron(f"{mm} {hh} * * *", tz), "j", "default"), int(start.timestamp() * 1000) - 1, 365
    )
    walls = [datetime.fromtimestamp(t / 1000, UTC).astimezone(zone) for t in fired]
    assert [w.date() for w in walls] == [date(2026, 1, 1) + timedelta(days=i) for i in range(365)]
    for w in walls:
        naive = w.replace(tzinfo=None)
        intended = naive.replace(hour=hh, minute=mm)
        if naive != intended:  # only on the day the intended time does not exist: fired at the end of the gap
            assert (
                datetime.combine(naive.date(), intended.time())
                .replace(tzinfo=zone)
                .astimezone(UTC)
                .astimezone(zone)
                .replace(tzinfo=None)
                != intended
            )
            assert naive > intended


# ---------------------------------------------------------------------------------------- interval and once
def test_interval_with_start_at_anchors_the_phase() -> None:
    schedule = {"type": "interval", "every_seconds": 2, "start_at": "2026-11-21T00:00:01Z"}
    assert times(schedule, "2026-11-20T00:00:00Z", 3) == [
        "2026-11-21T00:00:01Z",
        "2026-11-21T00:00:03Z",
        "2026-11-21T00:00:05Z",
    ]
    assert times(schedule, "2026-11-21T00:00:03Z", 1) == ["2026-11-21T00:00:05Z"]


def test_interval_without_start_at_is_spread_by_the_id() -> None:
    phases = {phase_for(f"job-{i}", 60_000) for i in range(1000)}
    assert len(phases) > 900  # spread over the minute, not all at :00
    t = timing_from_dict({"type": "interval", "every_seconds": 60}, "job-7", "default")
    a = t.next_after(0)
    assert a is not None and a % 60_000 == phase_for("job-7", 60_000)


def test_end_at_stops_occurrences() -> None:
    schedule = {
        "type": "interval",
        "every_seconds": 10,
        "start_at": "2026-01-01T00:00:00Z",
        "end_at": "2026-01-01T00:00:25Z",
    }
    assert times(schedule, "2025-12-31T00:00:00Z", 10) == [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:10Z",
        "2026-01-01T00:00:20Z",
    ]
    bounded = cron("0 * * * *", start_at="2026-01-01T05:30:00Z", end_at="2026-01-01T08:00:00Z")
    assert times(bounded, "2025-01-01T00:00:00Z", 10) == [
        "2026-01-01T06:00:00Z",
        "2026-01-01T07:00:00Z",
        "2026-01-01T08:00:00Z",
    ]


def test_once() -> None:
    assert times({"type": "once", "at": "2026-11-13T04:13:22Z"}, "2026-11-01T00:00:00Z", 3) == ["2026-11-13T04:13:22Z"]
    assert OnceTiming(5).next_after(5) is None


# ---------------------------------------------------------------------------------------- validation helpers
@pytest.mark.parametrize("expression", ["61 * * * *", "* * * *", "0 0 7 * * * 2027", "@sometimes", "a b c d e", ""])
def test_invalid_cron(expression: str) -> None:
    assert validate_cron(expression) is not None


@pytest.mark.parametrize("tz", ["Mars/Base", "", "../etc/passwd", "America/New York"])
def test_invalid_timezone(tz: str) -> None:
    assert validate_timezone(tz) is not None


# ---------------------------------------------------------------------------------------- properties
_EXPRESSIONS = [
    "*/7 * * * *",
    "0 2 * * *",
    "30 1 * * *",
    "15 3 1 * *",
    "0 */3 * * SAT,SUN",
    "*/20 2 * * *",
    "10 */10 * * * *",
]
_ZONES = ["UTC", "America/New_York", "Europe/London", "Australia/Sydney", "Australia/Lord_Howe", "Asia/Kolkata"]


@settings(max_examples=300, deadline=None)
@given(
    expression=st.sampled_from(_EXPRESSIONS),
    tz=st.sampled_from(_ZONES),
    gap=st.sampled_from(list(GapPolicy)),
    fold=st.sampled_from(list(FoldPolicy)),
    after=st.integers(min_value=parse_iso("2020-01-01T00:00:00Z"), max_value=parse_iso("2035-01-01T00:00:00Z")),
)
def test_next_is_strictly_after_and_increasing(
    expression: str, tz: str, gap: GapPolicy, fold: FoldPolicy, after: int
) -> None:
    rule = cron_rule(expression, tz, gap, fold)
    a = rule.next_after(after)
    assert a is not None and a > after
    b = rule.next_after(a)
    assert b is not None and b > a
    # nothing fires in between: asking from any instant between gives `a` again
    assert rule.next_after((after + a) // 2) in (a, None) or (after + a) // 2 >= a


@given(
    every=st.integers(min_value=1, max_value=86_400),
    anchor=st.integers(min_value=0, max_value=10**13),
    after=st.integers(min_value=0, max_value=10**13),
)
def test_interval_next_is_the_first_grid_point_after(every: int, anchor: int, after: int) -> None:
    t = IntervalTiming(every * 1000, anchor).next_after(after)
    assert t is not None
    assert after < t <= after + every * 1000
    assert (t - anchor) % (every * 1000) == 0
