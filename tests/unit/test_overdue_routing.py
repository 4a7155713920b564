"""Routing around a node whose heartbeat is overdue (scheduler_node.membership.overdue): a dead
node's heartbeat lives on for its TTL (30 s by default), and a slot whose other owner is gone too
would wait that long; the live nodes take its slots after two heartbeat intervals and a margin."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cronman.model.hashing import shared_ownership
from cronman.redis.cluster import OVERDUE_MARGIN_SECONDS, overdue_after
from scheduler_node.membership import overdue
from scheduler_node.parts import Member

SLOTS = 256
ages = st.dictionaries(
    st.sampled_from([f"node-{i}" for i in range(8)]),
    st.floats(min_value=0, max_value=60, allow_nan=False),
    min_size=1,
)


def members(of: dict[str, float]) -> list[Member]:
    return [Member(n, age, True, {}) for n, age in sorted(of.items())]


def test_overdue_after_two_intervals_and_a_margin() -> None:
    assert overdue_after(3.0) == 6.0 + OVERDUE_MARGIN_SECONDS  # the shipped interval: 7 s, whatever the TTL
    assert overdue_after(0.5) == 2.0


@given(ages, st.floats(min_value=0.5, max_value=10), st.floats(min_value=0, max_value=100))
def test_only_a_heartbeat_older_than_the_limit_is_overdue(
    of: dict[str, float], interval: float, reached: float
) -> None:
    after = overdue_after(interval)
    late = overdue(members(of), "node-0", after, reached)
    if reached < after:
        assert late == frozenset()  # just back from a Redis outage (or just started): not judged yet
    else:
        assert late == {n for n, age in of.items() if age > after and n != "node-0"}
    assert "node-0" not in late  # never overdue to itself


@given(ages, st.floats(min_value=0.5, max_value=10))
def test_every_slot_is_routed_to_nodes_that_beat_and_moves_only_from_overdue_ones(
    of: dict[str, float], interval: float
) -> None:
    """The ownership a node computes from what it sees: every slot owned by nodes whose heartbeat
    is fresh (while one is); a slot moves only if one of its owners was overdue."""
    after = overdue_after(interval)
    me = min(of)
    of = {**of, me: 0.0}  # this node beats
    late = overdue(members(of), me, after, reached_for_s=after)
    live = frozenset(of) - late
    ownership = shared_ownership(2, SLOTS)
    before = {n: ownership.owned(n, frozenset(of)) for n in of}
    now = {n: ownership.owned(n, live) for n in live}
    owners = {s: {n for n, slots in now.items() if s in slots} for s in range(SLOTS)}
    assert all(owners[s] and owners[s] <= live for s in range(SLOTS))
    for s in range(SLOTS):
        was = {n for n, slots in before.items() if s in slots}
        if not was & late:
            assert owners[s] == was  # a slot of nodes that beat stays where it was
