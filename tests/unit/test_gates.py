"""The node's delivery gate (scheduler_node/gates.py) through any mix of namespaces starting and
finishing attempts: never more than twice ``max_in_flight`` out, no namespace over its share, nothing
left waiting that could start, and a namespace with nothing out is never kept waiting by the
others (however many of them fill the node), while there is room under the bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.gates import InFlight, PerHost, Place

NAMESPACES = [f"ns{i}" for i in range(5)]
# more starts than ends: the node fills up, which is where the promises are tested
OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "admit", "admit", "release"]), st.sampled_from(NAMESPACES)), max_size=200
)


def _check(gate: InFlight[int]) -> None:
    assert gate.total == sum(gate.out.values())
    assert gate.total <= 2 * gate.max
    assert all(n <= gate.cap for n in gate.out.values())
    for ns in gate.waiting:  # work-conserving: whatever could start has started
        assert not gate.fits(ns), (ns, gate.out, {k: len(v) for k, v in gate.waiting.items()})


@settings(max_examples=300, deadline=None)
@given(max_in_flight=st.integers(1, 12), share=st.sampled_from([0.25, 0.5, 1.0]), ops=OPS)
def test_any_mix_of_namespaces_keeps_the_gates_promises(max_in_flight: int, share: float, ops: list) -> None:  # type: ignore[type-arg]
    gate: InFlight[int] = InFlight(max_in_flight, share)
    n = 0
    for op, ns in ops:
        if op == "admit":
            idle = gate.out.get(ns, 0) == 0 and ns not in gate.waiting
            room = gate.total < 2 * gate.max and gate.max // len(gate.out.keys() | gate.waiting.keys() | {ns}) >= 1
            n += 1
            if not gate.admit(ns, n):
                assert not (idle and room), ("an idle namespace was kept waiting", ns, dict(gate.out))
        elif gate.out.get(ns, 0) > 0:
            gate.release(ns)  # what it returns has started (counted by the gate)
        _check(gate)


def test_two_namespaces_that_fill_the_node_give_way_to_a_third() -> None:
    gate: InFlight[str] = InFlight(10, 0.5)
    for ns in ("a", "b"):
        for i in range(5):
            assert gate.admit(ns, f"{ns}{i}")
    assert not gate.admit("a", "a5")  # at its share
    # a third namespace gets its fair share (10 // 3) at once, past the ten
    assert [gate.admit("c", f"c{i}") for i in range(4)] == [True, True, True, False]
    assert gate.total == 13
    # the first two start nothing new until they are back within their fair shares
    assert gate.release("a") == []
    assert gate.release("a") == []
    assert gate.release("c") == ["c3"]
    assert gate.out == {"a": 3, "b": 5, "c": 3}


# ------------------------------------------------------------------------------- places per host
HOSTS = ["a", "b", "c"]
HOST_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "admit", "release", "withdraw", "grow", "shrink"]),
        st.sampled_from(HOSTS),
        st.sampled_from(NAMESPACES[:3]),
        st.integers(0, 50),  # due
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(ops=HOST_OPS)
def test_any_mix_of_hosts_keeps_the_places_promises(ops: list) -> None:  # type: ignore[type-arg]
    """Never more out to a host than it had places when they left; nothing waits for a host with
    a place free; what leaves a host's queue leaves it due first within its namespace, and a host's
    queue holds nothing of another's."""
    places = dict.fromkeys(HOSTS, 2)
    gate: PerHost[tuple[str, str, int, int]] = PerHost(lambda h: places[h])
    out: dict[str, list[tuple[str, str, int, int]]] = {h: [] for h in HOSTS}
    waiting: dict[tuple[str, str, int, int], Place[tuple[str, str, int, int]]] = {}
    n = 0
    for op, host, ns, due in ops:
        if op == "admit":
            n += 1
            item = (host, ns, due, n)
            place = gate.admit(host, ns, due, item)
            if place is None:
                out[host].append(item)
                assert len(out[host]) <= places[host]
            else:
                waiting[item] = place
        elif op == "release" and out[host]:
            out[host].pop(0)
            started = [p.item for p in gate.release(host)]
            for item in started:
                assert item[0] == host
                del waiting[item]
                # due first within its namespace: nothing left waiting there is due before it
                assert all(w[2] >= item[2] for w in waiting if w[0] == host and w[1] == item[1]), (item, waiting)
            out[host] += started
            if started:  # (the places may have shrunk below what is out: then none starts)
                assert len(out[host]) <= places[host]
        elif op == "withdraw" and any(w[0] == host for w in waiting):
            item = next(w for w in waiting if w[0] == host)
            assert gate.withdraw(waiting.pop(item))
        elif op == "grow":
            places[host] += 1
        elif op == "shrink" and places[host] > 1:
            places[host] -= 1
        for h in HOSTS:
            live = [w for w in waiting if w[0] == h]
            assert gate.live.get(h, 0) == len(live)
            assert gate.out.get(h, 0) == len(out[h])
            if live:  # work-conserving: whatever waits, waits for a host that is busy
                assert out[h], (h, live)


def test_a_host_serves_its_namespaces_in_turn_each_due_first() -> None:
    gate: PerHost[str] = PerHost(lambda h: 1)
    assert gate.admit("h", "x", 0, "first") is None
    for ns, due in (("x", 30), ("x", 10), ("x", 20), ("y", 50), ("y", 40)):
        assert gate.admit("h", ns, due, f"{ns}{due}") is not None
    order = []
    while True:
        started = gate.release("h")
        if not started:
            break
        order += [p.item for p in started]
    assert order == ["x10", "y40", "x20", "y50", "x30"]
    assert gate.out == {} and gate.waiting == {} and gate.queued == 0


def test_a_host_takes_more_at_once_as_its_places_grow() -> None:
    places = {"h": 1}
    gate: PerHost[int] = PerHost(lambda h: places[h])
    assert gate.admit("h", "x", 0, 0) is None
    for i in range(1, 6):
        assert gate.admit("h", "x", i, i) is not None
    places["h"] = 4  # its connection answered and is kept: it may open more
    assert [p.item for p in gate.release("h")] == [1, 2, 3, 4]
    assert gate.out == {"h": 4}


def test_an_item_withdrawn_leaves_no_trace_that_holds_up_its_host() -> None:
    gate: PerHost[int] = PerHost(lambda h: 1)
    assert gate.admit("h", "x", 0, 0) is None
    place = gate.admit("h", "x", 1, 1)
    assert place is not None and gate.withdraw(place) and not gate.withdraw(place)
    assert gate.release("h") == []
    assert gate.admit("h", "x", 2, 2) is None  # nothing waits: it goes at once
    kept = gate.admit("h", "x", 3, 3)
    gone = gate.admit("h", "y", 4, 4)
    assert kept is not None and gone is not None
    assert [p.item for p in gate.remove_waiting(lambda item: item != 4)] == [4]
    assert [p.item for p in gate.release("h")] == [3]
