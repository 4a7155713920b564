"""Leading and standing by (scheduler_node.standby): which owner of a slot claims on time, and the
evidence on which the other leaves an occurrence alone. Whatever the standings say, malformed,
stale, missing or behind, an occurrence is either covered by evidence or claimed here."""

from __future__ import annotations

import base64
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.hashing import score
from scheduler_node.standby import BUSY_PATIENCE_S, MAX_HELD, UNREAD_S, Held, Standby, Standing, Verdict

SLOTS = 64
ALL = frozenset(range(SLOTS))
GRACE = 2000


def bits(slots: set[int] | frozenset[int]) -> bytes:
    out = bytearray((SLOTS + 7) // 8)
    for s in slots:
        out[s >> 3] |= 1 << (s & 7)
    return bytes(out)


def standby(me: str, peer: str, standing: Standing, now: float = 100.0, cursor: int = 0) -> Standby:
    sb = Standby(me, GRACE, stale_s=1.0)
    sb.set_owned(ALL)
    sb.feed_read(cursor, [])
    sb.standings({peer: standing.encode()}, frozenset({me, peer}), now)
    return sb


def held(when: int, slot: int, at: int | None = None) -> Held:
    """An occurrence held at ``at`` (its own time if not given)."""
    return Held(when, "j", 1, slot, max(when, when if at is None else at) + GRACE)


def led_by_peer(sb: Standby, peer: str) -> int:
    slot = next(s for s in range(SLOTS) if sb.leader_of.get(s) == peer)
    return slot


def test_a_standing_survives_its_encoding() -> None:
    s = Standing(1_700_000_000_123, 987654321, bits({0, 5, 63}), passes=12, busy=True, epoch="9f3a")
    back = Standing.decode(s.encode())
    assert back == s
    assert back is not None and back.leads(5) and not back.leads(6) and not back.leads(10_000)


def test_a_standing_of_a_node_from_before_epochs_reads_as_of_no_epoch() -> None:
    """A rolling deploy: the six fields an older node publishes read as a standing of no epoch,
    which covers nothing for a node that knows its Redis data's epoch (both claim)."""
    old = "5000|100|3|0|7|" + base64.b64encode(bits(ALL)).decode()
    assert Standing.decode(old) == Standing(5_000, 100, bits(ALL), passes=3, beat=7, epoch="")
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    sb.epoch = "e1"
    sb.standings({"a": old}, frozenset({"a", "b"}), 100.0)
    slot = led_by_peer(sb, "a")
    assert sb.verdict("a", held(5_000, slot), 5_100, 100.2) is Verdict.WAIT
    assert sb.verdict("a", held(5_000, slot), 5_000 + GRACE, 100.2) is Verdict.CLAIM


def test_a_standing_made_in_data_redis_lost_covers_nothing() -> None:
    """The leader claimed past the occurrence in data a loss then took (seed 940685): until its
    standing says it claims in the data this node knows, the occurrence is waited for through the
    grace and then claimed here, whichever of the two noticed the loss first."""
    sb = standby("b", "a", Standing(9_000, 100, bits(ALL), epoch="e0"))
    sb.epoch = "e0"
    slot = led_by_peer(sb, "a")
    assert sb.verdict("a", held(5_000, slot), 5_100, 100.2) is Verdict.COVERED
    sb.epoch = "e1"  # this node noticed the loss; the leader has not yet
    item = held(5_000, slot, at=8_000)
    assert sb.verdict("a", item, 8_100, 100.2) is Verdict.WAIT
    assert sb.verdict("a", item, 8_000 + GRACE, 100.2) is Verdict.CLAIM
    assert sb.claimed_because == {"other data": 1}
    sb.standings({"a": Standing(9_000, 100, bits(ALL), epoch="e1").encode()}, frozenset({"a", "b"}), 100.3)
    assert sb.verdict("a", item, 8_000 + GRACE, 100.3) is Verdict.COVERED  # it claimed it again in e1
    sb.standings({"a": Standing(9_000, 100, bits(ALL), epoch="e2").encode()}, frozenset({"a", "b"}), 100.4)
    assert sb.verdict("a", item, 8_100, 100.4) is Verdict.WAIT  # the leader saw a loss this node has not


@given(st.text(max_size=80))
def test_anything_unreadable_is_no_standing(text: str) -> None:
    got = Standing.decode(text)
    if got is not None:  # only what parses as the three fields
        assert Standing.decode(got.encode()) == got


@settings(max_examples=200, deadline=None)
@given(
    st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=12),
    st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=12),
)
def test_of_two_owners_exactly_one_leads_each_slot(a: str, b: str) -> None:
    if a == b:
        return
    both = frozenset({a, b})
    everything = Standing(10, 10, bits(ALL)).encode()
    sa, sb = Standby(a, GRACE, 1.0), Standby(b, GRACE, 1.0)
    for x in (sa, sb):
        x.set_owned(ALL)
        x.standings({a: everything, b: everything}, both, 0.0)
    for s in range(SLOTS):
        defers = (s in sa.leader_of, s in sb.leader_of)
        assert defers in ((True, False), (False, True)), s
        leader = a if defers[1] else b
        assert (score(leader, s), leader) > (score(a if leader == b else b, s), a if leader == b else b)
    # what each publishes it leads is what the other stands by for
    assert Standing(0, 0, sa.led()).leads(0) == (0 not in sa.leader_of)


def test_an_occurrence_the_leader_claimed_is_covered() -> None:
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    slot = led_by_peer(sb, "a")
    assert sb.defers(slot) == "a"
    assert sb.verdict("a", held(5_000, slot), 5_100, 100.2) is Verdict.COVERED
    assert sb.verdict("a", held(5_001, slot), 5_100, 100.2) is Verdict.WAIT  # not claimed yet
    assert sb.verdict("a", held(5_001, slot), 5_001 + GRACE, 100.2) is Verdict.CLAIM  # grace over


def test_the_grace_runs_from_when_a_late_standby_holds_the_occurrence() -> None:
    """A standby that comes to an occurrence late (a burst) gives the leader the whole grace from
    then: the leader, behind as well, could not have claimed it yet."""
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    slot = led_by_peer(sb, "a")
    late = held(6_000, slot, at=9_000)
    assert late.until == sb.until(6_000, 9_000) == 9_000 + GRACE
    assert sb.verdict("a", late, 9_100, 100.2) is Verdict.WAIT
    assert sb.verdict("a", late, 9_000 + GRACE, 100.2) is Verdict.CLAIM


def test_a_busy_leader_is_waited_for_past_the_grace_while_it_keeps_passing() -> None:
    """A leader working through a burst says so: its word comes later than any grace, and the
    standby waits for it as long as the leader's timer goes on (its standing changes)."""
    sb = standby("b", "a", Standing(4_999, 100, bits(ALL), passes=1, busy=True), now=100.0)
    slot = led_by_peer(sb, "a")
    item = held(5_000, slot)
    assert sb.verdict("a", item, 5_000 + 10 * GRACE, 100.5) is Verdict.WAIT
    sb.standings({"a": Standing(4_999, 100, bits(ALL), passes=2, busy=True).encode()}, frozenset({"a", "b"}), 100.9)
    assert sb.verdict("a", item, 5_000 + 10 * GRACE, 101.5) is Verdict.WAIT  # passes went on
    # this node read nothing since: it cannot tell the leader went silent
    assert sb.verdict("a", item, 5_000 + 10 * GRACE, 102.5) is Verdict.WAIT
    again = Standing(4_999, 100, bits(ALL), passes=2, busy=True).encode()
    sb.standings({"a": again}, frozenset({"a", "b"}), 102.0)  # read: unchanged since 100.9
    assert sb.verdict("a", item, 5_000 + 10 * GRACE, 102.0) is Verdict.CLAIM  # silent: stale
    sb.standings({"a": Standing(5_000, 100, bits(ALL), passes=3, busy=False).encode()}, frozenset({"a", "b"}), 102.1)
    assert sb.verdict("a", item, 5_000 + 10 * GRACE, 102.1) is Verdict.COVERED
    # its loop goes on (the standing changes) but its timer makes no pass: waited for a while only
    t = 103.0
    sb.standings({"a": Standing(4_999, 100, bits(ALL), passes=4, busy=True).encode()}, frozenset({"a", "b"}), t)
    for beat in range(1, 80):
        t += 0.1
        text = Standing(4_999, 100, bits(ALL), passes=4, busy=True, beat=beat).encode()
        sb.standings({"a": text}, frozenset({"a", "b"}), t)
        want = Verdict.WAIT if t - 103.0 <= BUSY_PATIENCE_S else Verdict.CLAIM
        assert sb.verdict("a", item, 5_000 + 10 * GRACE, t) is want, t


def test_a_standby_that_cannot_read_waits_a_while_then_claims() -> None:
    """A standby too busy to read (or cut off) does not take that for the leader's silence, for
    a while: then it claims."""
    sb = standby("b", "a", Standing(4_000, 100, bits(ALL)), now=100.0)
    slot = led_by_peer(sb, "a")
    item = held(5_000, slot)
    assert sb.verdict("a", item, 5_000 + GRACE, 105.0) is Verdict.CLAIM  # grace over (not busy)
    sb = standby("b", "a", Standing(4_000, 100, bits(ALL), busy=True), now=100.0)
    assert sb.verdict("a", item, 5_000 + GRACE, 105.0) is Verdict.WAIT  # busy, no read since
    assert sb.verdict("a", item, 5_000 + GRACE, 100.0 + UNREAD_S + 0.1) is Verdict.CLAIM


def test_a_grace_is_over_only_once_a_read_after_it_found_no_word() -> None:
    sb = Standby("b", GRACE, stale_s=3.0)
    sb.set_owned(ALL)
    sb.standings({"a": Standing(4_000, 100, bits(ALL)).encode()}, frozenset({"a", "b"}), 100.0, 4_900)
    slot = led_by_peer(sb, "a")
    item = held(5_000, slot)
    assert sb.verdict("a", item, 5_000 + GRACE + 900, 100.9) is Verdict.WAIT  # last read before its end
    sb.standings({"a": Standing(4_500, 100, bits(ALL), beat=1).encode()}, frozenset({"a", "b"}), 101.0, 7_001)
    assert sb.verdict("a", item, 7_001, 101.0) is Verdict.CLAIM
    assert sb.claimed_because == {"grace over": 1}


def test_what_is_held_is_bounded() -> None:
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    slot = led_by_peer(sb, "a")
    sb._count = MAX_HELD - 1
    assert sb.defers(slot) == "a"
    sb.hold("a", held(6_000, slot))
    assert sb.defers(slot) is None  # claimed here as it comes
    assert len(sb) == MAX_HELD


def test_a_leader_behind_on_the_job_changes_covers_nothing_of_the_changed_slot() -> None:
    sb = standby("b", "a", Standing(9_000, 100, bits(ALL)), cursor=100)
    slot = led_by_peer(sb, "a")
    other = next(s for s in range(SLOTS) if sb.leader_of.get(s) == "a" and s != slot)
    sb.feed_read(120, [(slot, 110)])  # this node read a change (xid 110) the leader has not
    assert sb.verdict("a", held(5_000, slot), 5_100, 100.2) is Verdict.WAIT
    assert sb.verdict("a", held(5_000, other), 5_100, 100.2) is Verdict.COVERED
    sb.standings({"a": Standing(9_000, 111, bits(ALL)).encode()}, frozenset({"a", "b"}), 100.3)
    assert sb.verdict("a", held(5_000, slot), 5_100, 100.3) is Verdict.COVERED


def test_a_slot_just_loaded_is_not_deferred_until_its_changes_are_read() -> None:
    sb = standby("b", "a", Standing(9_000, 100, bits(ALL)), cursor=100)
    slot = led_by_peer(sb, "a")
    sb.loaded([slot])
    assert sb.defers(slot) is None
    sb.feed_read(130, [])
    assert sb.defers(slot) == "a"
    assert sb.verdict("a", held(5_000, slot), 5_100, 100.2) is Verdict.WAIT  # cursor 100 < 130


def test_a_stale_missing_or_withdrawn_leader_means_claim() -> None:
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)), now=100.0)
    slot = led_by_peer(sb, "a")
    item = held(4_000, slot)
    assert sb.verdict("a", item, 4_100, 100.5) is Verdict.COVERED
    # the same standing read again later: unchanged for longer than stale_s
    sb.standings({"a": Standing(5_000, 100, bits(ALL)).encode()}, frozenset({"a", "b"}), 101.5)
    assert sb.verdict("a", item, 4_100, 101.5) is Verdict.CLAIM
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    sb.standings({}, frozenset({"a", "b"}), 100.1)  # withdrawn
    assert sb.verdict("a", item, 4_100, 100.1) is Verdict.CLAIM
    assert sb.defers(slot) is None
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    sb.standings({"a": Standing(5_000, 100, bits(ALL)).encode()}, frozenset({"b"}), 100.1)  # gone from the view
    assert sb.verdict("a", item, 4_100, 100.1) is Verdict.CLAIM
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    sb.standings({"a": "garbage|x|!"}, frozenset({"a", "b"}), 100.1)
    assert sb.verdict("a", item, 4_100, 100.1) is Verdict.CLAIM


def test_a_slot_the_leader_stopped_leading_is_claimed_at_once() -> None:
    sb = standby("b", "a", Standing(5_000, 100, bits(ALL)))
    slot = led_by_peer(sb, "a")
    sb.hold("a", held(6_000, slot))
    assert sb.release(5_500, 100.1) == []
    sb.standings({"a": Standing(5_000, 100, bits(ALL - {slot})).encode()}, frozenset({"a", "b"}), 100.2)
    assert sb.release(5_500, 100.2) == [held(6_000, slot)]
    assert len(sb) == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, SLOTS - 1)), max_size=40),
    st.one_of(st.none(), st.text(max_size=30), st.builds(lambda c, k: f"{c}|{k}|", st.integers(), st.integers())),
    st.integers(0, 30_000),
    st.floats(100.0, 110.0),
)
def test_an_occurrence_is_never_dropped_without_the_leaders_word(
    items: list[tuple[int, int]], text: str | None, now_ms: int, now: float
) -> None:
    """Whatever the leader's standing says (or garbled, or none), each held occurrence is either
    claimed here or covered by a standing that leads its slot, claimed past it, and read every
    change this node has of it."""
    sb = standby("b", "a", Standing(20_000, 100, bits(ALL)))
    sb.feed_read(100, [(3, 150)])
    for when, slot in sorted(items):
        leader = sb.defers(slot)
        if leader is not None:
            sb.hold(leader, held(when, slot))
    holding = sorted(h for q in sb.held.values() for h in q)
    sb.standings({} if text is None else {"a": text}, frozenset({"a", "b"}), 100.0)
    released = sb.release(now_ms, now)
    waiting = sorted(h for q in sb.held.values() for h in q)
    covered = [h for h in holding if h not in released and h not in waiting]
    assert len(covered) == sb.covered
    st_ = Standing.decode(text) if text is not None else None
    for h in covered:
        assert st_ is not None and st_.claimed_ms >= h.when and st_.leads(h.slot)
        assert st_.cursor >= sb.required.get(h.slot, 0)
        assert st_.epoch == sb.epoch
