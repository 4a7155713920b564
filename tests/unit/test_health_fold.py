"""fold (cronman.store.health) gives the same change per job as the rule it implements, written the
plain way (a new frozen delta for every row), for any batch: several jobs, any order, every
status, late marks, retries, lags and occurrences out of order."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.store.health import LATE, HealthDelta, fold
from scheduler_node.history import HistoryRow

STATUSES = st.sampled_from(["succeeded", "permanently_failed", "failed", LATE, "skipped", "cancelled"])
MS = st.integers(0, 50)


@st.composite
def rows(draw: Any) -> HistoryRow:
    scheduled = draw(MS) * 1000
    fired = draw(st.one_of(st.none(), st.just(scheduled + 5)))
    return HistoryRow(
        job_id=draw(st.sampled_from(["a", "b", "c"])),
        scheduled_ms=scheduled,
        event_index=0,
        attempt=draw(st.integers(1, 3)),
        execution_id="x",
        trigger="schedule",
        status=draw(STATUSES),
        node="n",
        fired_ms=fired,
        finished_ms=draw(st.one_of(st.none(), MS.map(lambda m: m * 1000 + 7))),
        lag_ms=draw(st.one_of(st.none(), st.integers(0, 900))),
        http_status=None,
        error=None,
        incarnation=draw(st.sampled_from([None, 1, 2])),
        namespace=draw(st.sampled_from([None, "team"])),
    )


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def reference(batch: list[HistoryRow]) -> list[HealthDelta]:
    by_job: dict[str, HealthDelta] = {}
    for r in sorted(batch, key=lambda r: (r.finished_ms or r.scheduled_ms, r.scheduled_ms, r.attempt)):
        d = by_job.get(r.job_id) or HealthDelta(r.job_id, r.incarnation or 0, r.namespace or "default")
        changes: dict[str, Any] = {}
        ended = r.finished_ms if r.finished_ms is not None else r.scheduled_ms
        if r.status == "succeeded":
            changes.update(last_success_ms=_max(d.last_success_ms, ended), failures=0)
        elif r.status == "permanently_failed":
            changes.update(last_failure_ms=_max(d.last_failure_ms, ended), failures=d.failures + 1)
        elif r.status == "failed":
            changes.update(last_failure_ms=_max(d.last_failure_ms, ended))
        elif r.status == LATE:
            changes.update(
                late_first_ms=_min(d.late_first_ms, r.scheduled_ms), late_last_ms=_max(d.late_last_ms, r.scheduled_ms)
            )
        if r.fired_ms is not None:
            changes["delivered_ms"] = _max(d.delivered_ms, r.scheduled_ms)
            if r.attempt == 1 and r.lag_ms is not None and (d.lag_for_ms is None or r.scheduled_ms >= d.lag_for_ms):
                changes.update(last_lag_ms=r.lag_ms, lag_for_ms=r.scheduled_ms)
        by_job[r.job_id] = d._replace(**changes)
    return list(by_job.values())


@settings(max_examples=400, deadline=None)
@given(batch=st.lists(rows(), max_size=25))
def test_fold_is_the_rule(batch: list[HistoryRow]) -> None:
    assert fold(batch) == reference(batch)


def test_fold_of_nothing_is_nothing() -> None:
    assert fold([]) == []
