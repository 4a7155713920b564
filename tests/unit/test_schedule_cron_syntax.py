"""Cron beyond five fields: L, W, LW, #, nL, ?, aliases, several expressions in one schedule, and
the validator's messages. Tables are checked against the `calendar` module."""

from __future__ import annotations

import calendar
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.cron import ALIASES, _parse_cached, parse_cron
from cronman.model.schedule import cron_rule, next_times, timing_from_dict, validate_cron
from cronman.model.timeutil import iso, parse_iso, to_ms
from tests.unit.cron_reference import Model, expressions

ZONES = ["UTC", "America/New_York", "Australia/Sydney"]


def year_of(expression: str, tz: str, year: int = 2026) -> list[int]:
    start = to_ms(datetime(year, 1, 1, tzinfo=ZoneInfo(tz))) - 1
    end = to_ms(datetime(year + 1, 1, 1, tzinfo=ZoneInfo(tz)))
    return [t for t in next_times(cron_rule(expression, tz), start, 40) if t < end]


def local(tz: str, year: int, month: int, day: int, hour: int) -> int:
    return to_ms(datetime(year, month, day, hour, tzinfo=ZoneInfo(tz)))


def last_day(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]


def third_saturday(year: int, month: int) -> int:
    return [week[calendar.SATURDAY] for week in calendar.monthcalendar(year, month) if week[calendar.SATURDAY]][2]


def last_weekday(year: int, month: int) -> int:
    return max(d for d in range(1, last_day(year, month) + 1) if calendar.weekday(year, month, d) < calendar.SATURDAY)


# The days of 2026, written out (and checked against the functions above).
TABLE_2026 = {
    "0 12 L * *": (12, [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], last_day),
    "0 9 ? * 6#3": (9, [17, 21, 21, 18, 16, 20, 18, 15, 19, 17, 21, 19], third_saturday),
    "0 0 LW * *": (0, [30, 27, 31, 30, 29, 30, 31, 31, 30, 30, 30, 31], last_weekday),
}


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("expression", list(TABLE_2026))
def test_last_day_third_saturday_and_last_weekday_over_a_year(expression: str, tz: str) -> None:
    hour, days, computed = TABLE_2026[expression]
    assert days == [computed(2026, m) for m in range(1, 13)]
    assert year_of(expression, tz) == [local(tz, 2026, m, d, hour) for m, d in zip(range(1, 13), days, strict=True)]


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("expression", list(TABLE_2026))
@pytest.mark.parametrize("year", [2024, 2027, 2100])  # a leap year, another year, a century that is not leap
def test_the_same_rules_in_other_years(expression: str, tz: str, year: int) -> None:
    hour, _, computed = TABLE_2026[expression]
    assert year_of(expression, tz, year) == [local(tz, year, m, computed(year, m), hour) for m in range(1, 13)]


def test_utc_times_of_the_table_in_sydney() -> None:
    # Sydney is +11 in summer and +10 in winter: 2026-04-05 leaves daylight saving, 2026-10-04 enters it.
    got = [iso(t) for t in year_of("0 12 L * *", "Australia/Sydney")]
    assert got[2:5] == ["2026-03-31T01:00:00Z", "2026-04-30T02:00:00Z", "2026-05-31T02:00:00Z"]
    assert got[9] == "2026-10-31T01:00:00Z"


@pytest.mark.parametrize(
    ("expression", "same_as"),
    [
        ("0 0 * * 5L", "0 0 * * L5"),
        ("0 0 * * FRIL", "0 0 * * L5"),
        ("0 0 * * lfri", "0 0 * * L5"),
        ("0 0 * * 7L", "0 0 * * 0L"),
        ("0 0 * * SUN#2", "0 0 * * 0#2"),
        ("0 0 * * 7#2", "0 0 * * 0#2"),
        ("0 0 ? * MON", "0 0 * * MON"),
        ("0 0 1 * ?", "0 0 1 * *"),
        ("0 0 W15 * *", "0 0 15W * *"),
        ("0 0 31W * *", "0 0 LW * *"),  # a day past the month's end counts as its last
    ],
)
def test_spellings_that_mean_the_same(expression: str, same_as: str) -> None:
    start = parse_iso("2025-06-01T00:00:00Z")
    assert next_times(cron_rule(expression), start, 30) == next_times(cron_rule(same_as), start, 30)


def test_last_friday() -> None:
    got = [iso(t)[:10] for t in next_times(cron_rule("0 0 * * 5L"), parse_iso("2026-01-01T00:00:00Z"), 4)]
    assert got == ["2026-01-30", "2026-02-27", "2026-03-27", "2026-04-24"]


def test_nearest_weekday_stays_in_its_month() -> None:
    # 2026-08-01 is a Saturday: 1W is Monday the 3rd, not Friday 31 July. 2026-05-31 is a Sunday:
    # 31W is Friday the 29th, not Monday 1 June.
    assert iso(cron_rule("0 0 1W 8 *").next_after(parse_iso("2026-07-01T00:00:00Z")) or 0) == "2026-08-03T00:00:00Z"
    assert iso(cron_rule("0 0 31W 5 *").next_after(parse_iso("2026-05-01T00:00:00Z")) or 0) == "2026-05-29T00:00:00Z"
    # 15W: 2026-02-15 is a Sunday (the 16th), 2026-03-15 a Sunday (16th), 2026-08-15 a Saturday (14th)
    got = [iso(t)[:10] for t in next_times(cron_rule("0 0 15W * *"), parse_iso("2026-02-01T00:00:00Z"), 7)]
    assert got == ["2026-02-16", "2026-03-16", "2026-04-15", "2026-05-15", "2026-06-15", "2026-07-15", "2026-08-14"]


def test_both_day_fields_restricted_means_either() -> None:
    # the 1st of the month, or the third Saturday (the classic cron OR, whatever the syntax)
    got = [iso(t)[:10] for t in next_times(cron_rule("0 9 1 * 6#3"), parse_iso("2026-01-01T12:00:00Z"), 4)]
    assert got == ["2026-01-17", "2026-02-01", "2026-02-21", "2026-03-01"]
    got = [iso(t)[:10] for t in next_times(cron_rule("0 0 L * MON"), parse_iso("2026-01-20T12:00:00Z"), 3)]
    assert got == ["2026-01-26", "2026-01-31", "2026-02-02"]


def test_nth_weekday_mixes_with_plain_weekdays() -> None:
    got = [iso(t)[:10] for t in next_times(cron_rule("0 0 * * 6#3,1"), parse_iso("2026-01-01T00:00:00Z"), 5)]
    assert got == ["2026-01-05", "2026-01-12", "2026-01-17", "2026-01-19", "2026-01-26"]


def test_a_fifth_sunday_in_february_comes_every_few_decades() -> None:
    got = [iso(t)[:10] for t in next_times(cron_rule("0 0 ? 2 0#5"), parse_iso("2000-01-01T00:00:00Z"), 5)]
    assert got == ["2004-02-29", "2032-02-29", "2060-02-29", "2088-02-29", "2128-02-29"]


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_aliases(alias: str) -> None:
    start = parse_iso("2026-03-01T00:00:00Z")
    expected = next_times(cron_rule(ALIASES[alias], "America/New_York"), start, 20)
    assert next_times(cron_rule(alias, "America/New_York"), start, 20) == expected
    assert next_times(cron_rule(alias.upper(), "America/New_York"), start, 20) == expected


def test_the_aliases_mean_what_they_say() -> None:
    assert ALIASES == {
        "@yearly": "0 0 1 1 *",
        "@annually": "0 0 1 1 *",
        "@monthly": "0 0 1 * *",
        "@weekly": "0 0 * * 0",
        "@daily": "0 0 * * *",
        "@midnight": "0 0 * * *",
        "@hourly": "0 * * * *",
    }


# ---------------------------------------------------------------------------------------- several expressions
def test_several_expressions_fire_at_the_earliest_and_once_per_instant() -> None:
    schedule = {
        "type": "cron",
        "expressions": ["0 9 * * MON-FRI", "0 12 * * SAT,SUN", "0 9 * * 1"],  # Monday 09:00 twice
        "timezone": "Europe/Berlin",
    }
    got = [iso(t) for t in next_times(timing_from_dict(schedule, "j", "default"), parse_iso("2026-06-05T12:00:00Z"), 5)]
    assert got == [
        "2026-06-06T10:00:00Z",
        "2026-06-07T10:00:00Z",
        "2026-06-08T07:00:00Z",
        "2026-06-09T07:00:00Z",
        "2026-06-10T07:00:00Z",
    ]


def test_dst_policies_apply_to_each_expression() -> None:
    # 2026-03-08 in New York: 02:30 does not exist. Under shift it fires at 03:00 EDT, the same
    # instant as the other expression's 03:00: once. Under skip, only 03:00.
    for gap, expected in [
        ("shift", ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
        ("skip", ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    ]:
        schedule = {
            "type": "cron",
            "expressions": ["30 2 * * *", "0 3 8 3 *"],
            "timezone": "America/New_York",
            "dst_gap": gap,
        }
        got = [
            iso(t) for t in next_times(timing_from_dict(schedule, "j", "default"), parse_iso("2026-03-08T05:00:00Z"), 2)
        ]
        assert got == expected
    schedule = {
        "type": "cron",
        "expressions": ["30 1 * * *", "0 12 * * *"],
        "timezone": "America/New_York",
        "dst_fold": "both",
    }
    got = [iso(t) for t in next_times(timing_from_dict(schedule, "j", "default"), parse_iso("2026-11-01T04:00:00Z"), 3)]
    assert got == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-01T17:00:00Z"]


def test_several_expressions_with_bounds() -> None:
    schedule = {
        "type": "cron",
        "expressions": ["0 * * * *", "30 * * * *"],
        "start_at": "2026-01-01T05:15:00Z",
        "end_at": "2026-01-01T07:00:00Z",
    }
    got = [
        iso(t) for t in next_times(timing_from_dict(schedule, "j", "default"), parse_iso("2025-01-01T00:00:00Z"), 10)
    ]
    assert got == ["2026-01-01T05:30:00Z", "2026-01-01T06:00:00Z", "2026-01-01T06:30:00Z", "2026-01-01T07:00:00Z"]


def test_an_empty_list_of_expressions_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        timing_from_dict({"type": "cron", "expressions": []}, "j", "default")


# ---------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("61 * * * *", "minute field '61'"),
        ("* 24 * * *", "hour field '24'"),
        ("60 * * * * *", "second field '60'"),
        ("0 0 32 * *", "day-of-month field '32'"),
        ("0 0 * 13 *", "month field '13'"),
        ("0 0 * * 8", "day-of-week field '8'"),
        ("0 0 0W * *", "0W needs a day from 1 to 31"),
        ("0 0 * * 1#6", "the week must be 1 to 5"),
        ("0 0 * * 9#2", "'9' is not a weekday"),
        ("0 0 * * L", "L needs a weekday"),
        ("0 0 L-31 * *", "day-of-month field 'L-31'"),
        ("0 0 L-2-3 * *", "day-of-month field 'L-2-3'"),
        ("0 0 ? * ? ?", "hour field"),
        ("* * * *", "got 4"),
        ("0 0 7 * * * 2027", "got 7"),
        ("", "got 0"),
        ("@sometimes", "unknown cron alias"),
        ("@daily 5", "unknown cron alias"),
        ("R * * * *", "random (R) values are not supported"),
        ("0 H(20-30) * * *", "hour field 'H(20-30)'"),
        ("H(9-5) * * * *", "minute field 'H(9-5)'"),
        ("H/61 * * * *", "the step must be from 1 to 60"),
        ("0 0 H(5-9)/6 * *", "the step must be from 1 to 5"),
        ("0 0 H(29-31) 2 *", "never fires for some jobs"),
        ("0 0 31 H *", "never fires for some jobs"),
        ("20-20/0 * * * *", "the step '0'"),
        ("0 0 * * 8-9", "day-of-week field '8-9'"),
        ("0 0 * JAN-FOO *", "month field 'JAN-FOO'"),
        ("1,,2 * * * *", "minute field '1,,2'"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 ١ * *", "day-of-month field"),
        ("a b c d e", "minute field 'a'"),
    ],
)
def test_invalid_expressions_say_what_is_wrong(expression: str, says: str) -> None:
    message = validate_cron(expression)
    assert message is not None and says in message


@pytest.mark.parametrize(
    "expression",
    [
        "0 12 L * *",
        "0 9 ? * 6#3",
        "0 0 LW * *",
        "0 0 1,15,L * *",
        "0 0 LW,15W * *",
        "0 0 * * MON,5L",
        "@annually",
        "*/5 * * * * *",
        "0 0 L-2 * *",
        "0 0 L-3W,15 * *",
        "25 20-20 * * *",
        "11-58/55 * * * *",
        "0 22-2 * * FRI-MON",
        "H H * * *",
        "H/15 H(0-7) * * *",
        "H(0-29)/10 * * * 1-5",
        "0 0 H H *",
        "0 0 H(1-31) * *",
    ],
)
def test_valid_expressions(expression: str) -> None:
    assert validate_cron(expression) is None


def test_stored_random_values_are_read_as_hashed_ones() -> None:
    # refused at the door; one stored earlier is read as H: the same times on every node and run
    schedule = {"type": "cron", "expression": "R H * * *"}
    first = next_times(timing_from_dict(schedule, "a", "default"), 0, 5)
    _parse_cached.cache_clear()  # as a restarted node: parsed anew
    assert next_times(timing_from_dict(schedule, "a", "default"), 0, 5) == first
    hashed = {"type": "cron", "expression": "H H * * *"}
    assert next_times(timing_from_dict(hashed, "a", "default"), 0, 5) == first
    assert len({(t // 60_000) % 60 for t in first}) == 1  # one fixed minute


# ---------------------------------------------------------------------------------------- properties
@settings(max_examples=400, deadline=None)
@given(model=expressions(), wall=st.integers(0, 4_000_000_000))
def test_the_parser_means_what_the_grammar_says(model: Model, wall: int) -> None:
    expr = parse_cron(model.text)
    for k in range(60):
        w = wall + k * 86_400 * 3 + k * 611
        naive = datetime.fromtimestamp(w, UTC).replace(tzinfo=None)
        assert expr.matches(w) == model.wall_matches(naive), (model.text, naive)


@settings(max_examples=300, deadline=None)
@given(model=expressions(), wall=st.integers(0, 4_000_000_000))
def test_next_wall_is_the_first_match(model: Model, wall: int) -> None:
    expr = parse_cron(model.text)
    got = expr.next_wall(wall)
    assert got is not None and got > wall
    assert model.wall_matches(datetime.fromtimestamp(got, UTC).replace(tzinfo=None))
    # nothing matches in between: second by second for a while, then day by day (every day the
    # model matches has at least one matching time)
    assert not any(expr.matches(w) for w in range(wall + 1, min(got, wall + 3000)))
    first, last = datetime.fromtimestamp(wall, UTC).date(), datetime.fromtimestamp(got, UTC).date()
    for i in range(1, min((last - first).days, 20_000)):
        d = first + timedelta(days=i)
        assert not model.day_matches(d.year, d.month, d.day), (model.text, d)
