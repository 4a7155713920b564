"""Outages of the whole cluster as a node keeps them: recorded once per stop (``decide_outage``),
read again and again, merged (``scheduler_node.recovery.merged``), and caught up by a node."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.recovery import Tally, merged
from scheduler_node.store import decide_outage

OUTAGE_AFTER_MS = 5_000


def test_an_outage_read_again_is_one() -> None:
    assert merged([(6_000, 15_357), (6_000, 15_357)]) == [(6_000, 15_357)]


def test_overlapping_records_end_when_the_first_node_was_back() -> None:
    assert merged([(6_000, 15_500), (6_000, 15_357)]) == [(6_000, 15_357)]


def test_a_second_stop_before_any_progress_is_an_outage_of_its_own() -> None:
    """The cluster came back at 15.357 s and stopped again before a node marked any progress: the
    second outage, recorded when the nodes came back at 23.13 s, starts where the first ended
    (seed 401891, every fault: merged, it was lost, and its occurrences delivered late instead of
    getting their misfire policy)."""
    first = decide_outage(5_999, None, 15_357, OUTAGE_AFTER_MS)
    assert first == (5_999, 15_357)
    second = decide_outage(5_999, first[1], 23_130, OUTAGE_AFTER_MS)
    assert second == (15_357, 23_130)
    assert merged([second, first]) == [first, second]


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
    kept = merged(outages + outages[::2])
    assert kept == sorted(set(outages))
    for a, b in outages:
        for t in range(a + 1, b + 1):
            assert any(x < t <= y for x, y in kept)


def test_a_schedule_that_cannot_say_its_next_occurrence_stops_no_other_jobs_catch_up() -> None:
    """One job's schedule never stops the others: a node becoming ready after an outage catches
    every job up, the broken one installed without an occurrence."""
    from bench.footprint import _installer
    from cronman.settings import Settings
    from scheduler_node.jobs import OwnedJob
    from scheduler_node.node import Node

    class Broken:
        def next_after(self, after_ms: int) -> int | None:
            raise ArithmeticError("no next occurrence")

    now = 1_790_000_000_000
    firer, decoder = _installer(now)
    node = Node(Settings(node_id="n", database_url="postgresql://x/x", redis_url="redis://x", dev_mode=True))
    node.firer = firer
    node.recovery.know_outages([(now - 60_000, now)])
    good = decoder.job_from(
        "good", 1, 1, '{"type": "interval", "every_seconds": 1}', '{"type": "http", "url": "https://h.example/c"}',
        "{}", "{}", False, "default", "{}", 1,
    )  # fmt: skip
    broken = OwnedJob("broken", 2, 1, 1, "default", Broken(), good.target, b"{}", good.retry, good.opts, False)
    tally = Tally()
    node.recovery.catch_up(broken, now - 70_000, now, tally)
    node.recovery.catch_up(good, now - 70_000, now, tally)
    assert set(firer.jobs) == {"good", "broken"}
    assert firer.jobs["broken"].key is not None and firer.jobs["broken"].key < 1 << 32  # no timer entry
    assert firer.due  # the good job's occurrences of the window were dealt with


def _behind(ahead_ms: int) -> tuple[Any, Any, Any, int, int]:
    """A node whose clock is ``ahead_ms`` behind that of the node that recorded the outage, which
    ends after this node's now: (node, firer, decoder, now, the outage's end)."""
    from bench.footprint import _installer
    from cronman.settings import Settings
    from scheduler_node.node import Node

    now = 1_790_000_000_000
    firer, decoder = _installer(now)
    node = Node(Settings(node_id="n", database_url="postgresql://x/x", redis_url="redis://x", dev_mode=True))
    node.firer = firer
    node.recovery.know_outages([(now - 60_000, now + ahead_ms)])
    return node, firer, decoder, now, now + ahead_ms


def _every_second(decoder: Any, job_id: str, options: str) -> Any:
    return decoder.job_from(
        job_id, 1, 1, '{"type": "interval", "every_seconds": 1}', '{"type": "http", "url": "https://h.example/c"}',
        "{}", "{}", False, "default", options, 1,
    )  # fmt: skip


def test_an_outage_recorded_by_a_clock_ahead_is_caught_up_whole() -> None:
    """The first node back, its clock 2.2 s ahead of this node's, recorded an outage that ends
    after this node's now. Its misfire policy covers the whole outage here too: fire_once fires the
    outage's latest occurrence, the one the recorder fires, and the timer resumes after the outage
    (seed 923708, every fault: cut at this node's now, the latest occurrence before it was fired as
    the misfire, and the rest of the outage by the timer: five occurrences of one outage in all)."""
    node, firer, decoder, now, until = _behind(2_200)
    job = _every_second(decoder, "fire-once", "{}")
    node.recovery.catch_up(job, now - 70_000, now, Tally())
    latest = job.timing.next_after(until - 1_000)
    assert [e.scheduled_ms for e in firer.due if e.misfire is not None] == [latest]
    assert all(e.scheduled_ms <= now - 60_000 for e in firer.due if e.misfire is None)  # late, before it
    assert firer.jobs["fire-once"].key >> 32 == job.timing.next_after(until)


def test_a_first_occurrence_after_now_in_such_an_outage_gets_the_policy() -> None:
    """The same for a job created while the cluster was down whose first occurrence is due after
    this node's now, within the outage: its skip policy decides it, not the timer."""
    node, firer, decoder, now, until = _behind(2_900)
    job = _every_second(decoder, "skip", '{"misfire_policy": "skip"}')
    first = job.timing.next_after(now)
    assert first <= until
    node.recovery.catch_up(job, first - 1, now, Tally())
    assert [e.misfire is not None for e in firer.due] == [True]
    assert firer.jobs["skip"].key >> 32 == job.timing.next_after(until)
