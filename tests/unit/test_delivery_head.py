"""A delivery's HTTP header lines are its metadata, whichever way they are written: the usual
execution's written straight out, the rest (extra headers, a notification's own) through the dict."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.parts import Delivery

WORD = st.text("abcXYZ-_.:/ 019", max_size=12)
PAIRS = st.lists(
    st.tuples(st.sampled_from(["Cronman-Attempt", "X-Dead-Letter", "traceparent", "X-A"]), WORD), max_size=3
)


@settings(max_examples=300, deadline=None)
@given(
    delivery=st.builds(
        Delivery,
        job_id=WORD,
        execution_id=WORD,
        scheduled_for=WORD,
        attempt=st.integers(0, 10**6),
        body=st.just(b"{}"),
        event_index=st.integers(0, 10**6),
        signature=st.one_of(st.none(), st.just(""), WORD),
        extra=st.one_of(st.just(()), PAIRS.map(tuple)),
        traceparent=st.one_of(st.none(), st.just(""), WORD),
        meta=st.one_of(st.none(), st.none(), PAIRS.map(tuple)),
    )
)
def test_the_head_is_the_metadata(delivery: Delivery) -> None:
    assert delivery.http_head() == "".join(f"{k}: {v}\r\n" for k, v in delivery.metadata().items())
