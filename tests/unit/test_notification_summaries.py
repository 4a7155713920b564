"""Summaries of events taken together, and a rule's share of a minute (pure): whatever the order
and grouping of events, the counts sent plus the counts waiting are the events, and a rule never
sends more than its share in a minute."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.store.notifications import RuleBudget, Summary, on_events, on_tick


def test_events_taken_together_go_out_as_one_after_a_quiet_interval() -> None:
    s, emit = on_events(Summary(), 5, 1000, 4000, {"n": 5}, now_ms=4500, interval_ms=60_000)
    assert emit is not None and (emit.count, emit.first_ms, emit.at_ms) == (5, 1000, 4000)
    s, emit = on_events(s, 3, 5000, 7000, {"n": 8}, now_ms=7500, interval_ms=60_000)
    assert emit is None and (s.pending, s.pending_first_ms) == (3, 5000)
    s, emit = on_tick(s, 64_500, 60_000)
    assert emit is not None and (emit.count, emit.first_ms, emit.at_ms) == (3, 5000, 7000)


def test_a_rule_past_its_share_counts_instead_of_sending() -> None:
    t = 1_790_000_000_000
    s, emit = on_events(Summary(), 2, t, t + 10, {}, now_ms=t + 100, interval_ms=60_000, may_send=False)
    assert emit is None and s.pending == 2
    # never sent: due as soon as the rule may send again, whatever the interval
    s2, emit = on_tick(s, t + 200, 60_000)
    assert emit is not None and (emit.count, emit.first_ms, emit.at_ms) == (2, t, t + 10) and s2.pending == 0
    s, emit = on_events(s, 1, t + 20, t + 30, {}, now_ms=t + 200, interval_ms=60_000)
    assert emit is not None and (emit.count, emit.first_ms, emit.at_ms) == (3, t, t + 30)


def test_a_budget_holds_over_any_minute_per_rule() -> None:
    b = RuleBudget(2)
    assert [b.take("ns", "r", t) for t in (0, 10, 20)] == [True, True, False]
    assert b.take("ns", "other", 20) and b.spent("ns", 30) == ["r"]
    # the send at 0 leaves the minute at 60,000, the one at 10 at 60,010
    assert [b.left("ns", "r", t) for t in (59_999, 60_000)] == [0, 1]
    assert b.spent("ns", 60_000) == [] and b.take("ns", "r", 60_000) and not b.take("ns", "r", 60_001)
    assert b.left("ns", "r", 60_010) == 1
    assert b.left("other-ns", "r", 0) == 2


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(0, 5000)), min_size=1, max_size=40),
    st.integers(0, 20_000),
    st.integers(1, 5),
)
def test_counts_add_up_and_the_share_holds(batches: list[tuple[int, int]], interval: int, share: int) -> None:
    """Batches of events (how many, ms after the previous) for one rule and job, passes between
    them; what is sent in any minute is at most the share; sent + waiting = events."""
    budget, s, now = RuleBudget(share), Summary(), 1_000_000
    sent: list[tuple[int, int]] = []  # (when, count)
    total = 0
    for n, gap in batches:
        now += gap
        total += n
        may = budget.left("ns", "r", now) > 0
        s, emit = on_events(s, n, now - 5, now, {}, now, interval, may_send=may)
        if emit is not None:
            assert budget.take("ns", "r", now)
            sent.append((now, emit.count))
        elif budget.left("ns", "r", now) > 0:
            s, emit = on_tick(s, now, interval)
            if emit is not None and budget.take("ns", "r", now):
                sent.append((now, emit.count))
    assert sum(c for _, c in sent) + s.pending == total
    for t, _ in sent:
        assert sum(1 for u, _ in sent if t <= u < t + 60_000) <= share
