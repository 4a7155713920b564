"""Jobs that wait for other jobs: what an upstream's end does to the jobs downstream of it, decided
in the transaction that writes the upstream's history row (so exactly once, whoever writes it).

- Every success of a job others depend on becomes its latest success (``require`` reads it).
- An ``after`` job keeps its upstreams' successes since it last fired; when every one of its
  upstreams has one, no older than its window, it fires (a trigger of kind ``after``, whose
  execution carries those runs' ids) and starts over.
- An upstream that failed (permanently_failed, or skipped because its own upstream failed or was
  missing) makes the ``after`` job record a skipped execution with the reason, which passes on down
  the chain; that upstream's earlier success no longer counts.
- Each upstream execution's success counts once per ``after`` job, whatever rows say it ended: a
  success written over the row of a failure of the same attempt (a takeover's), a second success
  of one execution (sent again after a loss of Redis's data), a row written again; its failure
  counts once, and not after its success. The ``after`` job keeps the upstream executions' ends it
  has counted (the last APPLIED_KEPT of each upstream).

Pure: the PostgreSQL store (scheduler_node.store.dependencies) and the simulation's both apply it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cronman.model.execution import UPSTREAM_REASON
from scheduler_node.history import HistoryRow
from scheduler_node.store.port import Upstreams

MAX_REASON = 500  # a skip's reason, passed down a chain, is cut to this many characters
APPLIED_KEPT = 50  # upstream executions remembered as counted, per upstream of an after job


def counts_upstream(row: HistoryRow) -> bool:
    """Whether a row ends its execution in a way downstream jobs hear of."""
    return row.status in ("succeeded", "permanently_failed") or (
        row.status == "skipped" and (row.error or "").startswith(UPSTREAM_REASON)
    )


@dataclass(slots=True)
class Wait:
    """An ``after`` job's upstream successes since it last fired (upstream -> (execution id, ms)),
    and the upstream executions it has counted (upstream -> their ids, oldest first)."""

    pending: dict[str, tuple[str, int]] = field(default_factory=dict)
    last_fired_ms: int | None = None
    applied: dict[str, list[str]] = field(default_factory=dict)

    def counted(self, upstream: str, row: HistoryRow) -> bool:
        """Whether this end of an upstream execution was counted already: its success, once; its
        failure, once, and not after its success (a success counts after its failure did: history
        keeps the success, sim seed 9000250)."""
        seen = self.applied.get(upstream, ())
        if f"s:{row.execution_id}" in seen:
            return True
        return row.status != "succeeded" and f"f:{row.execution_id}" in seen

    def first_time(self, upstream: str, row: HistoryRow) -> bool:
        """Whether this end is counted now for the first time (and remember it)."""
        if self.counted(upstream, row):
            return False
        seen = self.applied.setdefault(upstream, [])
        seen.append(("s:" if row.status == "succeeded" else "f:") + row.execution_id)
        del seen[:-APPLIED_KEPT]
        return True


@dataclass(frozen=True, slots=True)
class Fire:
    """An ``after`` job's execution to make: at ``requested_ms``, following ``upstreams`` (or skipped)."""

    requested_ms: int
    upstreams: Upstreams


def advance(
    wait: Wait, upstreams: tuple[str, ...], within_ms: int, ends: Iterable[tuple[str, HistoryRow]], now_ms: int
) -> list[Fire]:
    """Apply upstream ends (upstream job id, its row), in order, to an ``after`` job's wait;
    returns the executions the job gets (each at a distinct time, after the last it got)."""
    fires: list[Fire] = []

    def at() -> int:
        t = now_ms if wait.last_fired_ms is None else max(now_ms, wait.last_fired_ms + 1)
        wait.last_fired_ms = t
        return t

    for upstream, row in ends:
        if not wait.first_time(upstream, row):
            continue
        if row.status == "succeeded":
            wait.pending[upstream] = (row.execution_id, row.finished_ms or now_ms)
            ready = [wait.pending.get(u) for u in upstreams]
            if all(r is not None and r[1] >= now_ms - within_ms for r in ready):
                ids = tuple(r[0] for r in ready if r is not None)
                fires.append(Fire(at(), Upstreams(upstreams, ids)))
                wait.pending = {}
            continue
        wait.pending.pop(upstream, None)
        if row.status == "skipped":
            reason = f"{UPSTREAM_REASON}{upstream} was skipped: {row.error}"
        else:
            reason = f"{UPSTREAM_REASON}{upstream} failed (execution {row.execution_id}, {row.status})"
        fires.append(Fire(at(), Upstreams((upstream,), (row.execution_id,), reason[:MAX_REASON])))
    return fires
