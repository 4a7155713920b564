"""Slots and rendezvous ownership: properties that make membership changes cheap and safe."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.execution import backoff_ms, execution_id
from cronman.hashing import SLOTS, owned_slots, owners, slot_of

node_names = st.lists(st.text("abcdefgh123-", min_size=1, max_size=8), min_size=1, max_size=6, unique=True)


def test_slot_is_stable_and_in_range() -> None:
    assert slot_of("invoice-reminder-42") == slot_of("invoice-reminder-42")
    assert all(0 <= slot_of(f"job-{i}") < SLOTS for i in range(1000))


def test_every_slot_has_min_replicas_owners() -> None:
    nodes = ["n1", "n2", "n3"]
    for s in range(0, SLOTS, 7):
        assert len(set(owners(s, nodes, 2))) == 2
    assert owners(5, ["only"], 2) == ["only"]


def test_owned_slots_agrees_with_owners() -> None:
    nodes = ["n1", "n2", "n3", "n4"]
    for n in nodes:
        mine = owned_slots(n, nodes, 2)
        assert mine == {s for s in range(SLOTS) if n in owners(s, nodes, 2)}


def test_load_is_balanced() -> None:
    nodes = ["node-1", "node-2", "node-3"]
    counts = [len(owned_slots(n, nodes, 2)) for n in nodes]
    assert all(abs(c - SLOTS * 2 / 3) < SLOTS * 0.06 for c in counts), counts


@settings(max_examples=25, deadline=None)
@given(nodes=node_names, joiner=st.text("xyz", min_size=1, max_size=4))
def test_a_join_moves_only_the_slots_the_joiner_takes(nodes: list[str], joiner: str) -> None:
    if joiner in nodes:
        return
    after = [*nodes, joiner]
    for s in range(0, SLOTS, 13):
        before_owners = set(owners(s, nodes, 2))
        after_owners = set(owners(s, after, 2))
        # the joiner either takes the slot (displacing at most one owner) or nothing changes
        assert after_owners - before_owners <= {joiner}
        assert len(before_owners - after_owners) <= 1
        # at least one owner keeps the slot, so firing never stops during the move
        assert before_owners & after_owners or len(nodes) == 0


@settings(max_examples=25, deadline=None)
@given(nodes=node_names)
def test_a_leave_moves_only_the_leavers_slots(nodes: list[str]) -> None:
    if len(nodes) < 2:
        return
    leaver, rest = nodes[0], nodes[1:]
    for s in range(0, SLOTS, 13):
        before = set(owners(s, nodes, 2))
        after = set(owners(s, rest, 2))
        if leaver not in before:
            assert before == after
        else:
            assert before - {leaver} <= after


def test_execution_id_is_stable_and_distinct() -> None:
    a = execution_id("job", 1_000, 0)
    assert a == execution_id("job", 1_000, 0)
    assert (
        len(
            {
                a,
                execution_id("job", 2_000, 0),
                execution_id("job", 1_000, 1),
                execution_id("job2", 1_000, 0),
                execution_id("job", 1_000, 0, "manual"),
            }
        )
        == 5
    )


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_ms(n, 1, 10) for n in range(1, 7)] == [1000, 2000, 4000, 8000, 10000, 10000]
    assert backoff_ms(1, 0, 10) == 0
