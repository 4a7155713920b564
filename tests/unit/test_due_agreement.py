"""The watchdog and the nodes agree on what was due, over random calendars, zones and schedules.

The node's side is the timing a node's decoder gives a job that names calendars (what its timer
fires) and the screen that skips what a calendar excludes; the watchdog's side is the row its pass
writes for a stall of the job's slot, pass after pass. Both are checked against a slow oracle that
reads every base occurrence's local date from scratch in each calendar's zone:

* the occurrences a node delivers are exactly the oracle's included ones;
* the watchdog, finding every node down from the start of the window to its end, records one row
  whose first and last occurrences and count are the oracle's included ones (none: no row);
* every excluded occurrence is covered by exactly one skipped row of the node (a span's first
  occurrence, standing for the span), whose count is the number of occurrences in its span.

Windows are drawn around the midnights that do not exist in America/Santiago, America/Havana,
Africa/Cairo and Asia/Beirut as well as anywhere in 2025-2027.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronman.model.calendars import Calendar, CalendarTiming, skip_summary
from cronman.model.schedule import timing_from_dict
from cronman.settings import Settings
from cronman.store.store import make_engine
from scheduler_node.jobs import CalendarBook, Decoder, WithCalendars
from scheduler_node.senders import Senders
from scheduler_node.watch import Watch, _Job

ZONES = [
    "UTC",
    "America/Santiago",
    "America/Havana",
    "Africa/Cairo",
    "Asia/Beirut",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Asia/Kolkata",
]
# days whose midnight is in a gap, in their zones (the day before is the one to exclude)
GAP_DAYS = [
    (date(2026, 3, 8), "America/Havana"),
    (date(2026, 9, 6), "America/Santiago"),
    (date(2026, 4, 24), "Africa/Cairo"),
    (date(2026, 3, 29), "Asia/Beirut"),
    (date(2025, 9, 7), "America/Santiago"),
]
DAY_MS = 86_400_000
LATE_AFTER_MS = 60_000
PASS_MS = 97 * 60_000  # the watchdog's passes, as far apart as makes a few of them in a window


@st.composite
def windows(draw: st.DrawFn) -> tuple[int, int, date, str | None]:
    """A window (start, end), the day it is drawn around, and the zone of a gap at midnight there."""
    gap: str | None = None
    if draw(st.booleans()):
        around, gap = draw(st.sampled_from(GAP_DAYS))
        start = int(datetime(around.year, around.month, around.day, tzinfo=UTC).timestamp() * 1000)
        start -= draw(st.integers(0, 2 * DAY_MS))
        return start, start + draw(st.integers(3 * 3600_000, 3 * DAY_MS)), around, gap
    around = draw(st.dates(date(2025, 1, 1), date(2027, 12, 31)))
    start = int(datetime(around.year, around.month, around.day, tzinfo=UTC).timestamp() * 1000)
    start += draw(st.integers(-DAY_MS, DAY_MS))
    return start, start + draw(st.integers(3600_000, 3 * DAY_MS)), around, gap


@st.composite
def calendars(draw: st.DrawFn, around: date, gap: str | None) -> Calendar:
    day = st.integers(-3, 4).map(lambda k: around + timedelta(days=k))
    ranges = [(d, d + timedelta(days=draw(st.integers(0, 2)))) for d in draw(st.lists(day, max_size=2))]
    dates = draw(st.lists(day, max_size=4))
    if gap is not None and draw(st.booleans()):  # the day before the gap, in the gap's zone
        return Calendar(gap, dates=[*dates, around - timedelta(days=1)], ranges=ranges)
    return Calendar(
        draw(st.sampled_from(ZONES)),
        dates=dates,
        ranges=ranges,
        annual=[(d.month, d.day) for d in draw(st.lists(day, max_size=1))],
        weekdays=draw(st.lists(st.integers(0, 6), max_size=2)),
    )


schedules = st.one_of(
    st.builds(
        lambda every, phase: {"type": "interval", "every_seconds": every, "start_at": f"2025-01-01T00:{phase:02d}:00Z"},
        st.sampled_from([60, 300, 600, 1800, 3600, 5400, 7200]),
        st.integers(0, 59),
    ),
    st.builds(
        lambda expression, tz: {"type": "cron", "expression": expression, "timezone": tz},
        st.sampled_from(["*/10 * * * *", "0 * * * *", "30 0 * * *", "0 0 * * *", "15 */3 * * *", "0 9 * * 1-5"]),
        st.sampled_from(ZONES),
    ),
)


def excluded_slowly(cal: Calendar, t: int) -> bool:
    d = datetime.fromtimestamp(t / 1000, ZoneInfo(cal.timezone)).date()
    return (
        d.weekday() in cal.weekdays
        or d in cal.dates
        or (d.month, d.day) in cal.annual
        or any(a <= d <= b for a, b in cal.ranges)
    )


def base_occurrences(schedule: dict[str, Any], lo: int, hi: int) -> list[int]:
    """Every occurrence of the schedule in (lo, hi], without calendars."""
    base = timing_from_dict(schedule, "job", "default")
    out, t = [], base.next_after(lo)
    while t is not None and t <= hi:
        out.append(t)
        t = base.next_after(t)
    return out


def the_watch() -> Watch:
    """A watchdog whose database is never reached: the calendars it would read are given to it."""
    s = Settings(database_url="postgresql://nobody@127.0.0.1:1/none")
    return Watch(s, make_engine(s.database_url), ThreadPoolExecutor(1), Senders([]), holder="test")


WATCH = the_watch()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), schedule=schedules)
def test_the_watchdog_and_the_nodes_agree_on_what_was_due(data: st.DataObject, schedule: dict[str, Any]) -> None:
    a, b, around, gap = data.draw(windows())
    cals = data.draw(st.lists(calendars(around, gap), min_size=1, max_size=2))
    names = tuple(f"c{i}" for i in range(len(cals)))
    found = {("team", n): c for n, c in zip(names, cals, strict=True)}
    options = json.dumps({"calendars": list(names)})

    every = base_occurrences(schedule, a, b)
    included = [t for t in every if not any(excluded_slowly(c, t) for c in cals)]
    excluded = [t for t in every if any(excluded_slowly(c, t) for c in cals)]

    # the node: the job made at ``a``, its timer firing through ``b``; the screen skips what a
    # calendar excludes, one row for the rest of its span
    book = CalendarBook()
    book.take(found)
    decoder = Decoder(lambda doc: doc, book=book)  # type: ignore[arg-type,return-value]
    job = decoder.job_from("job", 1, 1, json.dumps(schedule), "{}", "{}", "{}", False, "team", options, 1, a + 1)
    timing = job.timing
    assert isinstance(timing, WithCalendars)
    due = timing.due()
    assert isinstance(due, CalendarTiming)
    delivered, skipped = [], []
    t = timing.next_after(a)
    while t is not None and t <= b:
        if any(c.excludes(t) for c in cals):
            summary = skip_summary(due, t)
            assert summary is not None
            skipped.append((t, summary))
        else:
            delivered.append(t)
        nxt = timing.next_after(t)
        assert nxt is None or nxt > t
        t = nxt
    assert delivered == included

    # each excluded occurrence is in exactly one skipped row's span, which counts its occurrences
    for x in excluded:
        covering = [m for m, s in skipped if m <= x and (s.until_ms is None or x < s.until_ms)]
        assert len(covering) == 1, (x, skipped)
    for m, s in skipped:
        assert m in excluded
        if s.until_ms is not None and s.until_ms - m <= 6 * DAY_MS:
            in_span = base_occurrences(schedule, m - 1, s.until_ms - 1)
            assert s.complete and s.occurrences == len(in_span) and s.last_ms == in_span[-1]
            assert all(any(excluded_slowly(c, y) for c in cals) for y in in_span)

    # the watchdog: no node fired from ``a`` on; its passes until every occurrence up to ``b`` is late
    WATCH._calendars, WATCH._calendars_read = found, time.monotonic() + 10**9
    watched = _Job("job", 1, 1, "team", json.dumps(schedule), LATE_AFTER_MS, a + 1, names)
    rows, previous = [], None
    now = a + LATE_AFTER_MS
    while True:
        now = min(now + PASS_MS, b + LATE_AFTER_MS)
        written, previous = WATCH._late_rows(watched, a, now, previous)
        rows += written
        if now == b + LATE_AFTER_MS:
            break
    if not included:
        assert rows == [] and previous is None
        return
    assert {r.scheduled_ms for r in rows} == {included[0]}  # one row for the stall, written as it grows
    final = rows[-1]
    assert (final.occurrences, final.last_ms) == (len(included), included[-1])
    assert all(r.status == "late" and r.attempt == 0 for r in rows)
