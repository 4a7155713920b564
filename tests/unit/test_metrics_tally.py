"""The firing path's observations handed to Prometheus in bulk read exactly as one observe per value."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from scheduler_node.metrics import _LAG_BUCKETS, Tally, observe_many

# Values on the bounds themselves, between them, below the first and past the last.
VALUES = st.one_of(
    st.sampled_from([0.0, *_LAG_BUCKETS]),
    st.floats(min_value=-1.0, max_value=1e6, allow_nan=False, allow_infinity=False),
)


def _series(registry: CollectorRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _pair() -> tuple[CollectorRegistry, Any, Any, CollectorRegistry, Any, Any]:
    one, bulk = CollectorRegistry(), CollectorRegistry()
    return (
        one,
        Histogram("lag", "", buckets=_LAG_BUCKETS, registry=one),
        Counter("done", "", ["status"], registry=one),
        bulk,
        Histogram("lag", "", buckets=_LAG_BUCKETS, registry=bulk),
        Counter("done", "", ["status"], registry=bulk),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(VALUES, max_size=200))
def test_observe_many_reads_as_one_observe_per_value(values: list[float]) -> None:
    one, h1, _, bulk, h2, _ = _pair()
    for v in values:
        h1.observe(v)
    observe_many(h2, values)
    a, b = _series(one), _series(bulk)
    assert a.keys() == b.keys()
    for name in a:
        assert abs(a[name] - b[name]) <= 1e-9 * max(1.0, abs(a[name])), name


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["succeeded", "failed"]), VALUES), max_size=100), st.integers(1, 5))
def test_a_tally_flushed_in_parts_reads_as_every_observation_made_at_once(
    observations: list[tuple[str, float]], parts: int
) -> None:
    one, h1, c1, bulk, h2, c2 = _pair()
    tally = Tally()
    for i, (status, v) in enumerate(observations):
        h1.observe(v)
        c1.labels(status).inc()
        tally.observe(h2, v)
        tally.inc(c2.labels(status))
        if i % parts == 0:
            tally.flush()
    tally.flush()
    tally.flush()  # nothing left: a second flush adds nothing
    a, b = _series(one), _series(bulk)
    assert a.keys() == b.keys()
    for name in a:
        assert abs(a[name] - b[name]) <= 1e-9 * max(1.0, abs(a[name])), name


def test_a_histogram_without_the_usual_parts_gets_one_observe_per_value() -> None:
    seen: list[float] = []

    class Plain:
        def observe(self, v: float) -> None:
            seen.append(v)

    observe_many(Plain(), [0.5, 2.0, 0.5])
    assert seen == [0.5, 2.0, 0.5]
