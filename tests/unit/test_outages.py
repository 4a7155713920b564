"""Outages of the whole cluster as a node keeps them: recorded once per stop (``decide_outage``),
read again and again, merged (``scheduler_node.node._merged``), and caught up by a node."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.node import _merged
from scheduler_node.store import decide_outage

OUTAGE_AFTER_MS = 5_000


def test_an_outage_read_again_is_one() -> None:
    assert _merged([(6_000, 15_357), (6_000, 15_357)]) == [(6_000, 15_357)]


def test_overlapping_records_end_when_the_first_node_was_back() -> None:
    assert _merged([(6_000, 15_500), (6_000, 15_357)]) == [(6_000, 15_357)]


def test_a_second_stop_before_any_progress_is_an_outage_of_its_own() -> None:
    """The cluster came back at 15.357 s and stopped again before a node marked any progress: the
    second outage, recorded when the nodes came back at 23.13 s, starts where the first ended
    (seed 401891, every fault: merged, it was lost, and its occurrences delivered late instead of
    getting their misfire policy)."""
    first = decide_outage(5_999, None, 15_357, OUTAGE_AFTER_MS)
    assert first == (5_999, 15_357)
    second = decide_outage(5_999, first[1], 23_130, OUTAGE_AFTER_MS)
    assert second == (15_357, 23_130)
    assert _merged([second, first]) == [first, second]


@settings(max_examples=300, database=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 50)), max_size=8))
def test_outages_recorded_one_after_another_stay_apart_and_lose_no_instant(
    spans: list[tuple[int, int]],
) -> None:
    """Stops recorded one after the other, each from the end of the one before or later, as
    ``decide_outage`` records them, each read any number of times: every instant inside a recorded
    outage is inside a merged one."""
    outages: list[tuple[int, int]] = []
    last = 0
    for gap, length in spans:
        a = last + gap
        outages.append((a, a + length))
        last = a + length
    merged = _merged(outages + outages[::2])
    assert merged == sorted(set(outages))
    for a, b in outages:
        for t in range(a + 1, b + 1):
            assert any(x < t <= y for x, y in merged)


def test_a_schedule_that_cannot_say_its_next_occurrence_stops_no_other_jobs_catch_up() -> None:
    """One job's schedule never stops the others: a node becoming ready after an outage catches
    every job up, the broken one installed without an occurrence."""
    from cronman.bench.footprint import _installer
    from cronman.settings import Settings
    from scheduler_node.jobs import OwnedJob
    from scheduler_node.node import Node, _Tally

    class Broken:
        def next_after(self, after_ms: int) -> int | None:
            raise ArithmeticError("no next occurrence")

    now = 1_790_000_000_000
    firer, decoder = _installer(now)
    node = Node(Settings(node_id="n", database_url="postgresql://x/x", redis_url="redis://x", dev_mode=True))
    node.firer = firer
    node._outages = [(now - 60_000, now)]
    good = decoder.job_from(
        "good", 1, 1, '{"type": "interval", "every_seconds": 1}', '{"type": "http", "url": "https://h.example/c"}',
        "{}", "{}", False, "default", "{}", 1,
    )  # fmt: skip
    broken = OwnedJob("broken", 2, 1, 1, "default", Broken(), good.target, b"{}", good.retry, good.opts, False)
    tally = _Tally()
    node._catch_up(broken, now - 70_000, now, tally)
    node._catch_up(good, now - 70_000, now, tally)
    assert set(firer.jobs) == {"good", "broken"}
    assert firer.jobs["broken"].key is not None and firer.jobs["broken"].key < 1 << 32  # no timer entry
    assert firer.due  # the good job's occurrences of the window were dealt with
