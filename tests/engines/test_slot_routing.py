"""Slot ranges (cronman.routing): the routing a store past one PostgreSQL uses, as a pure value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronman.errors import ConfigError
from cronman.hashing import SLOTS, slot_of
from cronman.routing import FeedCursors, SlotRanges


def test_one_database_holds_every_slot_today() -> None:
    r = SlotRanges.single()
    assert {r.database_of(s) for s in range(SLOTS)} == {"main"} and r.home == "main"
    assert r.split([5, 1, 5]) == {"main": [1, 5]}


def test_ranges_route_each_slot_to_its_database() -> None:
    r = SlotRanges.parse("2048-4095=db-b, 0-1023=db-a, 1024-2047=db-c")
    assert [r.database_of(s) for s in (0, 1023, 1024, 2047, 2048, 4095)] == ["db-a", "db-a", "db-c", "db-c"] + [
        "db-b"
    ] * 2
    assert r.home == "db-a"
    assert r.split([4000, 3, 1500, 2]) == {"db-a": [2, 3], "db-c": [1500], "db-b": [4000]}
    with pytest.raises(ValueError):
        r.database_of(SLOTS)


@pytest.mark.parametrize(
    "bad",
    ["", "0-4095", "0-100=a,102-4095=b", "0-2047=a,2000-4095=b", "0-4094=a", "1-4095=a", "x-4095=a", "0-4095="],
)
def test_ranges_that_leave_a_slot_without_a_database_or_give_it_two_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        SlotRanges.parse(bad)


@given(st.lists(st.integers(1, SLOTS - 1), unique=True, max_size=8), st.text(min_size=1, max_size=12))
def test_every_job_has_exactly_one_database_and_keeps_it(cuts: list[int], job_id: str) -> None:
    starts = [0, *sorted(cuts)]
    text = ",".join(f"{a}-{b - 1}=db{i}" for i, (a, b) in enumerate(zip(starts, [*starts[1:], SLOTS], strict=True)))
    r = SlotRanges.parse(text)
    slot = slot_of(job_id)
    assert r.database_of(slot) == f"db{starts.index(max(s for s in starts if s <= slot))}"
    assert sum(len(v) for v in r.split(range(SLOTS)).values()) == SLOTS


def test_feed_cursors_move_per_database() -> None:
    c = FeedCursors().advanced("db-a", 100).advanced("db-b", 7)
    assert c.lowered("db-a", 90).at("db-a") == 90 and c.lowered("db-a", 120).at("db-a") == 100
    assert c.lowered("db-c", 5).at("db-c") == 5 and c.at("db-b") == 7
