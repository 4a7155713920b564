"""Cron next-occurrence properties near daylight-saving transitions, against a brute force.

Random expressions (from the field grammars in `cron_reference`), every zone zoneinfo has, both
gap and both fold policies, instants within hours of a transition (and at the ends of the
accepted range): the answer equals the first firing instant found second by second, each call
makes a bounded number of wall-clock searches, and no call takes long.
"""

from __future__ import annotations

import os
import time
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cronman.model.cron import CronExpr
from cronman.model.schedule import MAX_GAP_SKIPS, CronRule, FoldPolicy, GapPolicy, cron_rule, next_times
from cronman.model.timeutil import MAX_INSTANT_MS, MIN_INSTANT_MS, iso, parse_iso
from tests.unit.cron_reference import Model, brute_next, expressions, fires_at, transitions

ZONES = sorted(available_timezones())
NAMED = [
    "Australia/Lord_Howe",
    "America/Santiago",
    "Australia/Adelaide",
    "Asia/Kolkata",
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "Pacific/Chatham",
    "Pacific/Apia",  # skipped 2011-12-30 entirely
    "Pacific/Kwajalein",  # a 24-hour gap in 1993
    "Africa/Casablanca",  # two transitions a year around Ramadan
    "Africa/Monrovia",  # an offset of -0:44:30 until 1972
]
WINDOW_S = 3 * 3600  # the brute force looks this far
YEAR_MS = 365 * 86_400_000
GUARD_S = 0.05  # a generous wall-clock guard per call; the real figure is ~10-40 us (schedule_timing)
EXAMPLES = int(os.environ.get("SCHEDULE_PROPERTY_EXAMPLES", "400"))  # more for a long run


class Counted:
    """Counts the wall-clock searches (`CronExpr.next_wall`) one `next_after` makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = CronExpr.next_wall

        def counting(expr: CronExpr, after: int) -> int | None:
            self.calls += 1
            return real(expr, after)

        monkeypatch.setattr(CronExpr, "next_wall", counting)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    return Counted(monkeypatch)  # once per test, not per example: wrappers must not pile up


def _bound(gap: GapPolicy) -> int:
    return MAX_GAP_SKIPS + 1 if gap is GapPolicy.SKIP else 2


def _timed(model: Model, tz: str, gap: GapPolicy, fold: FoldPolicy, after: int) -> tuple[int | None, float]:
    """The answer and the fastest of up to three timings (each on a fresh rule, so nothing is
    cached): a busy machine can pause any one call, but not a slow algorithm's every call."""
    best = float("inf")
    for _ in range(3):
        rule = CronRule(model.text, tz, gap, fold)
        started = time.perf_counter()
        got = rule.next_after(after)
        best = min(best, time.perf_counter() - started)
        if best < GUARD_S:
            break
    return got, best


def _check(model: Model, tz: str, gap: GapPolicy, fold: FoldPolicy, after: int, counted: Counted) -> None:
    counted.calls = 0
    CronRule(model.text, tz, gap, fold).next_after(after)
    assert counted.calls <= _bound(gap), f"{counted.calls} searches"
    got, elapsed = _timed(model, tz, gap, fold, after)
    assert elapsed < GUARD_S, f"{elapsed * 1000:.1f} ms"
    z = ZoneInfo(tz)
    shift, both = gap is GapPolicy.SHIFT, fold is FoldPolicy.BOTH
    expected = brute_next(model, z, after, WINDOW_S, shift, both)
    context = f"{model.text!r} {tz} {gap} {fold} after {iso(after)}: got {got and iso(got)}"
    if expected is not None:
        assert got == expected, f"{context}, expected {iso(expected)}"
    elif got is not None:
        assert got > after + WINDOW_S * 1000, f"{context}, nothing fires in the window"
        assert got % 1000 == 0 and fires_at(model, z, got // 1000, shift, both), context


def _transitions_near(tz: str, year: int) -> tuple[int, ...]:
    """The zone's transitions in ``year``, or else in some year of 1970-2045 that has them."""
    for y in [year] + [1970 + (year + 7 * k) % 76 for k in range(12)]:
        if found := transitions(tz, y):
            return found
    return ()


near_transition = st.tuples(
    st.sampled_from(NAMED) | st.sampled_from(ZONES),
    st.integers(1970, 2045) | st.integers(1970, 8999),
    st.integers(0, 7),
    st.integers(-2 * 3600, 2 * 3600),
    st.sampled_from([0, 0, 0, 1, 500, 999]),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=expressions() | expressions(star=0.8),
    where=near_transition,
    gap=st.sampled_from(list(GapPolicy)),
    fold=st.sampled_from(list(FoldPolicy)),
)
def test_next_near_a_transition_is_the_first_firing_instant(
    model: Model,
    where: tuple[str, int, int, int, int],
    gap: GapPolicy,
    fold: FoldPolicy,
    counted: Counted,
) -> None:
    tz, year, pick, delta, ms = where
    found = _transitions_near(tz, year)
    assume(found)
    _check(model, tz, gap, fold, (found[pick % len(found)] + delta) * 1000 + ms, counted)


@settings(max_examples=EXAMPLES // 4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=expressions(),
    tz=st.sampled_from(NAMED),
    gap=st.sampled_from(list(GapPolicy)),
    fold=st.sampled_from(list(FoldPolicy)),
    after=st.integers(MIN_INSTANT_MS - 1, MIN_INSTANT_MS + 2 * 86_400_000)
    | st.integers(MAX_INSTANT_MS - 2 * 86_400_000, MAX_INSTANT_MS + 2 * YEAR_MS),
)
def test_next_at_the_ends_of_the_accepted_range(
    model: Model, tz: str, gap: GapPolicy, fold: FoldPolicy, after: int, counted: Counted
) -> None:
    _check(model, tz, gap, fold, after, counted)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    model=expressions(),
    tz=st.sampled_from(ZONES),
    gap=st.sampled_from(list(GapPolicy)),
    fold=st.sampled_from(list(FoldPolicy)),
    after=st.integers(-(10**16), 10**16) | st.sampled_from([-(10**30), 10**30, -1, 0, MAX_INSTANT_MS]),
)
def test_next_is_total(model: Model, tz: str, gap: GapPolicy, fold: FoldPolicy, after: int) -> None:
    got = CronRule(model.text, tz, gap, fold).next_after(after)
    assert got is None or (isinstance(got, int) and got > after)


# ---------------------------------------------------------------------------------------- the reported case
def test_every_second_with_both_instances_of_the_repeated_hour_is_fast_and_complete(
    counted: Counted,
) -> None:
    # New York falls back at 2026-11-01T06:00Z (02:00 EDT -> 01:00 EST): 01:00-02:00 happens twice.
    rule = cron_rule("* * * * * *", "America/New_York", GapPolicy.SHIFT, FoldPolicy.BOTH)
    for start in ["2026-11-01T05:59:00Z", "2026-11-01T06:00:00Z", "2026-11-01T06:30:00Z", "2026-11-01T06:59:30Z"]:
        counted.calls = 0
        got = next_times(rule, parse_iso(start), 100)
        assert got == [parse_iso(start) + 1000 * k for k in range(1, 101)]  # every second, none skipped
        assert counted.calls <= 2 * 100


def test_both_instances_of_a_repeated_minute() -> None:
    rule = cron_rule("30 1 * * *", "America/New_York", GapPolicy.SHIFT, FoldPolicy.BOTH)
    got = [iso(t) for t in next_times(rule, parse_iso("2026-11-01T05:45:00Z"), 2)]  # in the first pass
    assert got == ["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]
    got = [iso(t) for t in next_times(rule, parse_iso("2026-11-01T06:10:00Z"), 2)]  # in the second pass
    assert got == ["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]
    first = cron_rule("30 1 * * *", "America/New_York", GapPolicy.SHIFT, FoldPolicy.FIRST)
    assert iso(first.next_after(parse_iso("2026-11-01T06:10:00Z")) or 0) == "2026-11-02T06:30:00Z"


def test_skip_gives_up_on_an_expression_that_only_names_gap_times(counted: Counted) -> None:
    # 02:30 on the second Sunday of March never exists in New York since 2007 (it did before).
    rule = cron_rule("30 2 ? 3 0#2", "America/New_York", GapPolicy.SKIP, FoldPolicy.FIRST)
    assert iso(rule.next_after(parse_iso("1990-01-01T00:00:00Z")) or 0) == "1990-03-11T07:30:00Z"
    counted.calls = 0
    assert rule.next_after(parse_iso("2010-01-01T00:00:00Z")) is None
    assert counted.calls == MAX_GAP_SKIPS
    shifted = cron_rule("30 2 ? 3 0#2", "America/New_York", GapPolicy.SHIFT, FoldPolicy.FIRST)
    assert iso(shifted.next_after(parse_iso("2010-01-01T00:00:00Z")) or 0) == "2010-03-14T07:00:00Z"
    # and one that fell in gaps for 20 years (1987-2006) is still found
    april = cron_rule("30 2 ? 4 0#1", "America/New_York", GapPolicy.SKIP, FoldPolicy.FIRST)
    assert iso(april.next_after(parse_iso("1987-01-01T00:00:00Z")) or 0) == "2007-04-01T06:30:00Z"


def test_a_whole_day_skipped_by_a_zone() -> None:
    # Samoa skipped 2011-12-30 (24:00 on the 29th at -10 became 00:00 on the 31st at +14, at
    # 10:00Z): a daily job fires on the 29th and the 31st; under gap=shift the 30th's run fires
    # when the gap ends.
    daily = cron_rule("0 12 * * *", "Pacific/Apia", GapPolicy.SKIP, FoldPolicy.FIRST)
    got = [iso(t) for t in next_times(daily, parse_iso("2011-12-28T00:00:00Z"), 3)]
    assert got == ["2011-12-28T22:00:00Z", "2011-12-29T22:00:00Z", "2011-12-30T22:00:00Z"]
    shifted = cron_rule("0 12 * * *", "Pacific/Apia", GapPolicy.SHIFT, FoldPolicy.FIRST)
    got = [iso(t) for t in next_times(shifted, parse_iso("2011-12-28T00:00:00Z"), 4)]
    assert got == ["2011-12-28T22:00:00Z", "2011-12-29T22:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T22:00:00Z"]
