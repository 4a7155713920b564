"""Every timing is total: from any instant in (and well beyond) the accepted range it returns an
int after that instant or None, and never raises; misfire planning stays bounded there too."""

from __future__ import annotations

import time

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cronman.model.calendars import Calendar, CalendarTiming
from cronman.model.misfire import MAX_COUNTED, MAX_RECORDED, MisfirePlan, MisfirePolicy, between, plan
from cronman.model.schedule import (
    CronTiming,
    EarliestOf,
    FoldPolicy,
    GapPolicy,
    IntervalTiming,
    JitteredTiming,
    OnceTiming,
    Timing,
    cron_rule,
    timing_from_dict,
)
from cronman.model.timeutil import MAX_INSTANT_MS, MIN_INSTANT_MS, parse_iso
from tests.unit.cron_reference import expressions

YEAR_MS = 365 * 86_400_000
accepted = st.integers(MIN_INSTANT_MS, MAX_INSTANT_MS - 1)
instants = (
    st.integers(MIN_INSTANT_MS - 1, MAX_INSTANT_MS + 2 * YEAR_MS)
    | st.sampled_from([MIN_INSTANT_MS - 1, MIN_INSTANT_MS, MAX_INSTANT_MS, MAX_INSTANT_MS + 2 * YEAR_MS])
    | st.integers(-(10**20), 10**20)
)
zones = st.sampled_from(
    ["UTC", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia", "Asia/Kolkata", "Pacific/Chatham"]
)


@st.composite
def base_timings(draw: st.DrawFn) -> Timing:
    kind = draw(st.sampled_from(["interval", "once", "cron", "earliest"]))
    if kind == "interval":
        start = draw(st.none() | accepted)
        return IntervalTiming(
            draw(st.integers(1, 366 * 86_400)) * 1000, draw(accepted), start, draw(st.none() | accepted)
        )
    if kind == "once":
        return OnceTiming(draw(accepted))
    rules = [  # cron, or the earliest of several
        cron_rule(
            draw(expressions()).text,
            draw(zones),
            draw(st.sampled_from(list(GapPolicy))),
            draw(st.sampled_from(list(FoldPolicy))),
        )
        for _ in range(1 if kind == "cron" else draw(st.integers(2, 3)))
    ]
    rule: Timing = rules[0] if kind == "cron" else EarliestOf(tuple(rules))
    return CronTiming(rule, draw(st.none() | accepted), draw(st.none() | accepted))


@st.composite
def timings(draw: st.DrawFn) -> Timing:
    """What a node builds for a job: a schedule's timing, jittered or not, under calendars or not
    (the order of ``timing_maker`` and ``timing_with``). Nothing nests a jitter in a jitter or a
    calendar in a calendar: each wraps a search in another, so a drawn tower of them took
    minutes for one example without saying anything of a timing a job can have."""
    timing = draw(base_timings())
    if draw(st.booleans()):
        timing = JitteredTiming(timing, draw(st.integers(1, 3_600_000)), draw(st.text(max_size=5)))
    if draw(st.booleans()):
        cal = Calendar(draw(zones), weekdays=frozenset(draw(st.lists(st.integers(0, 6), max_size=6))))
        timing = CalendarTiming(timing, (("c", cal),))
    return timing


@settings(max_examples=400, deadline=None)
@given(timing=timings(), after=instants)
def test_every_timing_is_total(timing: Timing, after: int) -> None:
    got = timing.next_after(after)
    assert got is None or (type(got) is int and got > after)


@settings(max_examples=100, deadline=None)
@given(
    schedule=st.sampled_from(
        [
            {"type": "cron", "expression": "* * * * * *", "timezone": "America/New_York", "dst_fold": "both"},
            {"type": "cron", "expressions": ["0 12 L * *", "0 9 ? * 6#3"], "timezone": "Australia/Sydney"},
            {"type": "cron", "expression": "0 0 29 2 *", "jitter_seconds": 3600},
            {"type": "interval", "every_seconds": 1},
            {"type": "interval", "every_seconds": 86_400 * 366, "start_at": "8999-12-31T00:00:00Z"},
            {"type": "once", "at": "8999-12-31T23:59:59Z", "jitter_seconds": 3600},
        ]
    ),
    since=instants,
    width=st.integers(0, 10**16),
    policy=st.sampled_from(list(MisfirePolicy)),
    catchup=st.integers(0, 10**13),
)
def test_misfire_plans_are_bounded_anywhere(
    schedule: dict, since: int, width: int, policy: MisfirePolicy, catchup: int
) -> None:
    started = time.perf_counter()
    p = plan(timing_from_dict(schedule, "job", "default"), since, since + width, policy, catchup)
    assert time.perf_counter() - started < 60  # bounded, not fast: a per-second job counts 10,000
    assert len(p.fire) <= MAX_COUNTED and len(p.skip) <= MAX_RECORDED and p.skipped_total <= MAX_COUNTED
    assert all(since < t <= since + width for t in p.fire + p.skip)
    assert p.skip == sorted(set(p.skip)) and not set(p.skip) & set(p.fire)


def test_misfire_finds_the_latest_of_an_uneven_schedule() -> None:
    # every second from 03:00 to 05:59 each day: a day-long outage holds 10,800 occurrences, all in
    # one stretch; the plan still names the latest and the 100 before it
    timing = timing_from_dict({"type": "cron", "expression": "* * 3-5 * * *"}, "j", "default")
    since, until = parse_iso("2026-01-01T12:00:00Z"), parse_iso("2026-01-02T12:00:00Z")
    p = plan(timing, since, until, MisfirePolicy.FIRE_ONCE, 3_600_000)
    assert p.fire == [parse_iso("2026-01-02T05:59:59Z")]
    assert p.skip == [parse_iso("2026-01-02T05:58:19Z") + 1000 * k for k in range(MAX_RECORDED)]
    assert p.skipped_total == MAX_COUNTED  # counted up to the cap
    assert p.first_missed == parse_iso("2026-01-02T03:00:00Z")


def test_misfire_fire_all_skips_what_is_older_than_the_catch_up_window() -> None:
    timing = IntervalTiming(60_000, 0)
    p = plan(timing, 0, 600_000, MisfirePolicy.FIRE_ALL, 180_000)
    assert p.fire == [480_000, 540_000, 600_000]
    assert p.skip == [60_000 * k for k in range(1, 8)] and p.skipped_total == 7


@settings(max_examples=300, deadline=None)
@given(
    timing=timings(), since=accepted, width=st.integers(0, 40 * 86_400_000), policy=st.sampled_from(list(MisfirePolicy))
)
def test_a_misfire_plan_names_the_latest_occurrence_of_its_window_and_none_without_one(
    timing: Timing, since: int, width: int, policy: MisfirePolicy
) -> None:
    """Against the window's occurrences listed one by one (where there are few enough to list)."""
    listed = between(timing, since, since + width, 2_000)
    assume(len(listed) < 2_000)
    p = plan(timing, since, since + width, policy, 3_600_000)
    assert p.last_missed == (listed[-1] if listed else None)
    assert p.first_missed == (listed[0] if listed else None)
    assert p == MisfirePlan() or listed
