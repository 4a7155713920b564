"""Burst smoothing (phase spread, jitter), misfire planning, signatures and backoff: pure functions."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model import signing
from cronman.model.execution import backoff_ms
from cronman.model.misfire import MAX_RECORDED, MisfirePolicy, plan
from cronman.model.schedule import IntervalTiming, JitteredTiming, next_times, timing_from_dict


def test_ten_thousand_minutely_jobs_do_not_fire_in_one_second() -> None:
    per_second: Counter[int] = Counter()
    for i in range(10_000):
        t = timing_from_dict({"type": "interval", "every_seconds": 60}, f"tenant-{i % 37}-job-{i}", "default")
        first = t.next_after(1_790_000_000_000)
        assert first is not None
        per_second[(first // 1000) % 60] += 1
    assert len(per_second) == 60  # every second of the minute gets some
    assert max(per_second.values()) < 3 * 10_000 / 60  # no second gets a pile-up (mean 167)
    print("\nfirings per second of the minute (10,000 jobs every 60 s):", [per_second[s] for s in range(60)])


def test_jitter_spreads_jobs_due_at_the_same_instant() -> None:
    schedule = {"type": "cron", "expression": "0 * * * *", "jitter_seconds": 60}
    firsts = [timing_from_dict(schedule, f"job-{i}", "default").next_after(-1) for i in range(5000)]  # all due at 0
    assert all(f is not None and 0 <= f < 60_000 for f in firsts)
    per_second = Counter((f or 0) // 1000 for f in firsts)
    assert len(per_second) == 60 and max(per_second.values()) < 3 * 5000 / 60


@settings(max_examples=200, deadline=None)
@given(
    every=st.integers(2, 3600),
    jitter_frac=st.floats(0.01, 1.0),
    after=st.integers(0, 10**12),
    job=st.text(min_size=1, max_size=10),
)
def test_jittered_occurrences_are_stable_ordered_and_within_the_window(
    every: int, jitter_frac: float, after: int, job: str
) -> None:
    base = IntervalTiming(every * 1000, 0)
    jitter_ms = max(1, int(every * 1000 * jitter_frac))
    t = JitteredTiming(base, jitter_ms, job)
    a = t.next_after(after)
    assert a is not None and a > after
    b = t.next_after(a)
    assert b is not None and b > a
    nominal = a - a % (every * 1000) if a % (every * 1000) < jitter_ms else None
    assert nominal is None or 0 <= a - nominal < jitter_ms
    assert JitteredTiming(base, jitter_ms, job).next_after(after) == a  # the same on every node


def minutely() -> IntervalTiming:
    return IntervalTiming(60_000, 0)


def test_misfire_fire_once_fires_the_latest_and_skips_the_rest() -> None:
    p = plan(minutely(), 0, 10 * 60_000, MisfirePolicy.FIRE_ONCE, 3_600_000)
    assert p.fire == [600_000]
    assert p.skip == [60_000 * k for k in range(1, 10)] and p.skipped_total == 9
    assert p.first_missed == 60_000 and p.last_missed == 600_000
    assert p.reason == "misfire: no scheduler was running; 9 occurrence(s) skipped"


def test_misfire_skip_and_fire_all() -> None:
    skip = plan(minutely(), 0, 5 * 60_000, MisfirePolicy.SKIP, 3_600_000)
    assert skip.fire == [] and skip.skipped_total == 5 and skip.last_missed == 300_000
    catchup = plan(minutely(), 0, 5 * 60_000, MisfirePolicy.FIRE_ALL, 150_000)
    assert catchup.fire == [180_000, 240_000, 300_000] and catchup.skip == [60_000, 120_000]


def test_misfire_records_a_bounded_number_of_rows_for_a_long_outage() -> None:
    p = plan(IntervalTiming(1000, 0), 0, 86_400_000, MisfirePolicy.FIRE_ONCE, 3_600_000)
    assert p.fire == [86_400_000]
    assert len(p.skip) == MAX_RECORDED and p.skip[-1] == 86_399_000
    assert p.reason.endswith("10000+ occurrence(s) skipped")


def test_misfire_with_nothing_missed() -> None:
    assert plan(minutely(), 0, 59_000, MisfirePolicy.FIRE_ONCE, 1).last_missed is None
    once = timing_from_dict({"type": "once", "at": "2026-01-01T00:00:00Z"}, "j", "default")
    assert next_times(once, 0, 2) and plan(once, 0, 10**13, MisfirePolicy.SKIP, 1).skipped_total == 1


def test_signatures_verify_only_the_exact_body_secret_and_time() -> None:
    header = signing.sign(["s1", "s0"], b'{"a":1}', 1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert signing.verify("s1", header, b'{"a":1}', 1_700_000_100)
    assert signing.verify("s0", header, b'{"a":1}', 1_700_000_100)  # the previous secret, during rotation
    assert not signing.verify("s1", header, b'{"a":2}', 1_700_000_100)
    assert not signing.verify("s1", header, b'{"a":1}', 1_700_001_000)  # too old: a replay
    assert not signing.verify("s1", "v1=abc", b'{"a":1}', 1_700_000_100)


def test_backoff_jitter_stays_between_half_and_all_of_the_delay() -> None:
    assert backoff_ms(3, 1, 60, 0.5) == 2000 and backoff_ms(3, 1, 60, 1.0) == 4000
    assert backoff_ms(100, 1, 60) == 60_000
