"""Slots and rendezvous ownership: properties that make membership changes cheap and safe."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.execution import backoff_ms, execution_id
from cronman.model.hashing import SLOTS, Ownership, owned_slots, owners, score, slot_of, slot_table

node_names = st.lists(st.text("abcdefgh123-", min_size=1, max_size=8), min_size=1, max_size=6, unique=True)
# Unicode and NUL included: a node id is whatever the operator (or the host name) made it.
any_names = st.lists(st.text(min_size=1, max_size=12), min_size=0, max_size=12, unique=True)

SMALL = 256  # slots for the property tests: the rules do not depend on the count


def reference_owners(slot: int, nodes: Iterable[str], replicas: int) -> list[str]:
    """The definition, computed from scratch: the ``replicas`` best scores, best first."""
    return sorted(set(nodes), key=lambda n: (score(n, slot), n), reverse=True)[:replicas]


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


def test_ownership_agrees_with_the_definition_on_every_slot() -> None:
    nodes = [f"node-{i}" for i in range(7)]
    ownership = Ownership(2)
    for s in range(SLOTS):
        assert list(ownership.owners(s, nodes)) == reference_owners(s, nodes, 2)
    table = ownership.table(nodes)
    for n in nodes:
        assert ownership.owned(n, nodes) == {s for s in range(SLOTS) if n in reference_owners(s, nodes, 2)}
        assert table[n] == len(ownership.owned(n, nodes))
    assert slot_table(nodes, 2) == table and owned_slots("node-3", nodes, 2) == ownership.owned("node-3", nodes)


def test_owned_counts_the_asking_node_as_a_member() -> None:
    ownership = Ownership(2, SMALL)
    assert ownership.owned("me", []) == frozenset(range(SMALL))
    assert ownership.owned("me", ["other"]) == frozenset(range(SMALL))
    assert ownership.owners(0, []) == () and ownership.table([]) == {}


@settings(max_examples=60, deadline=None)
@given(pool=any_names.filter(bool), replicas=st.integers(1, 3), data=st.data())
def test_ownership_follows_any_sequence_of_memberships(pool: list[str], replicas: int, data: st.DataObject) -> None:
    """One instance moved through memberships drawn from one pool of nodes (joins, leaves, both at
    once, back again) answers as a fresh computation of each membership would."""
    steps = data.draw(st.lists(st.sets(st.sampled_from(pool)), min_size=1, max_size=8))
    ownership = Ownership(replicas, SMALL, spare_rows=1)
    for members in steps:
        nodes = sorted(members)
        assignment = ownership.assignment(nodes)
        assert [list(a) for a in assignment] == [reference_owners(s, nodes, replicas) for s in range(SMALL)]
        table = ownership.table(nodes)
        assert sum(table.values()) == SMALL * min(replicas, len(nodes))
        for n in nodes:
            assert ownership.owned(n, nodes) == {s for s in range(SMALL) if n in assignment[s]}


@settings(max_examples=40, deadline=None)
@given(nodes=any_names, joiner=st.text(min_size=1, max_size=12))
def test_a_join_moves_only_the_slots_the_joiner_takes_incrementally(nodes: list[str], joiner: str) -> None:
    if joiner in nodes:
        return
    ownership = Ownership(2, SMALL)
    before = ownership.assignment(nodes)
    after = ownership.assignment([*nodes, joiner])
    moved = {s for s in range(SMALL) if set(before[s]) != set(after[s])}
    assert moved == ownership.owned(joiner, [*nodes, joiner])
    for s in moved:
        assert set(after[s]) - set(before[s]) == {joiner}
        assert len(set(before[s]) - set(after[s])) <= 1


@settings(max_examples=40, deadline=None)
@given(nodes=any_names.filter(lambda n: len(n) >= 1), data=st.data())
def test_a_leave_moves_only_the_leavers_slots_incrementally(nodes: list[str], data: st.DataObject) -> None:
    leaver = data.draw(st.sampled_from(nodes))
    rest = [n for n in nodes if n != leaver]
    ownership = Ownership(2, SMALL)
    theirs = ownership.owned(leaver, nodes)
    before = ownership.assignment(nodes)
    after = ownership.assignment(rest)
    moved = {s for s in range(SMALL) if set(before[s]) != set(after[s])}
    assert moved <= theirs
    for s in moved:
        assert set(before[s]) - set(after[s]) == {leaver}


@settings(max_examples=40, deadline=None)
@given(nodes=any_names)
def test_each_slot_has_exactly_min_r_n_distinct_owners(nodes: list[str]) -> None:
    ownership = Ownership(2, SMALL)
    for s in range(SMALL):
        found = ownership.owners(s, nodes)
        assert len(found) == len(set(found)) == min(2, len(nodes))


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


def test_the_cluster_view_counts_slots_once_per_membership() -> None:
    from cronman.redis.cluster import slot_counts

    members = frozenset(f"view-{i}" for i in range(50))
    first = slot_counts(members, 2)
    assert slot_counts(frozenset(sorted(members)), 2) is first  # the same set of live nodes: no work
    assert sum(first.values()) == 2 * SLOTS and set(first) == members
    fewer = slot_counts(members - {"view-0"}, 2)
    assert "view-0" not in fewer and sum(fewer.values()) == 2 * SLOTS
