"""Checking executions against history before they are sent: what history holds of them, with what
this node did itself and has not written yet, or wrote and then found taken over."""

from __future__ import annotations

from collections.abc import Iterable

from cronman.execution import Status
from scheduler_node.history import HistoryRow
from scheduler_node.store import Attempts, Ident, ends, one_row_per_attempt

FINAL = frozenset(
    {Status.SUCCEEDED.value, Status.PERMANENTLY_FAILED.value, Status.SKIPPED.value, Status.CANCELLED.value}
)


def fold(found: dict[Ident, Attempts], rows: Iterable[HistoryRow]) -> None:
    """Add history rows not written yet to what history says of their executions, as
    ``NodeStore.attempts`` would once they are written (one row per attempt, as the store keeps
    it: ``one_row_per_attempt``)."""
    for r in one_row_per_attempt(rows):
        ident = (r.job_id, r.scheduled_ms, r.event_index, r.trigger)
        old = found.get(ident, Attempts(0, False))
        final = old.final or r.status in FINAL
        ended = (old.final and not old.only_skipped) or ends(r.status, r.error)
        found[ident] = Attempts(max(old.last_attempt, r.attempt), final, final and not ended)
