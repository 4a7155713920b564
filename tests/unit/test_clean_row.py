"""clean_row's shortcut for the usual row gives what the full cleaning gives, for any row: text
with NULs, lone surrogates or too long; numbers past their columns, floats and bools; nodes named
anything (a name is remembered as clean only when it is)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node import history
from scheduler_node.history import HistoryRow, _clean, clean_row

TEXT = st.one_of(st.none(), st.text(max_size=30), st.sampled_from(["a\x00b", "\ud800x", "é" * 1500]))
NODE = st.one_of(st.sampled_from(["node-1", "node-2", "", "n\x00", "\udfff", "x" * 300]), st.text(max_size=8))
BIG = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**63 - 1, 2**63, True, False, 1.5]),
)


@st.composite
def rows(draw: st.DrawFn) -> HistoryRow:
    return HistoryRow(
        job_id="j",
        scheduled_ms=1,
        event_index=draw(st.one_of(st.integers(-5, 5), st.sampled_from([2**31, 2**40, True]))),
        attempt=draw(st.one_of(st.integers(-5, 5), st.sampled_from([2**31 - 1, 2**31, 2**40, True]))),
        execution_id="x",
        trigger="schedule",
        status="succeeded",
        node=draw(NODE),
        fired_ms=None,
        finished_ms=None,
        lag_ms=draw(BIG),
        http_status=draw(BIG),
        error=draw(TEXT),
        throttle_wait_ms=draw(BIG),
        response=draw(TEXT),
    )


@settings(max_examples=600, deadline=None)
@given(batch=st.lists(rows(), min_size=1, max_size=6))
def test_the_shortcut_is_the_cleaning(batch: list[HistoryRow]) -> None:
    history._CLEAN_NODES.clear()
    for row in batch:  # in a sequence: names remembered from earlier rows take the shortcut
        got = clean_row(row)
        want = _clean(row)
        assert got == want and [type(v) for v in got] == [type(v) for v in want], (row, got, want)
