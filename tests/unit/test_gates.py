"""The node's delivery gate (scheduler_node/gates.py) through any mix of namespaces starting and
finishing attempts: never more than twice ``max_in_flight`` out, no namespace over its share, nothing
left waiting that could start, and a namespace with nothing out is never kept waiting by the
others (however many of them fill the node), while there is room under the bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.gates import InFlight

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
        assert not gate._fits(ns), (ns, gate.out, {k: len(v) for k, v in gate.waiting.items()})


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
