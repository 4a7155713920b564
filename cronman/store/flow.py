"""A job's place among others and its work in flight, as the dashboard, ``GET
/v1/jobs/{id}/flow`` and ``cronman jobs get`` show it: the jobs it waits for and those that wait for
it (``job_dependencies``), its executions whose work is still running (``async_runs``), and the
occurrences that missed its deadline (``deadline_misses``).

Each read is by the job's namespace and id on an index of its table, bounded in rows; the caller
has checked the job is its to see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, TextClause, text

from cronman.model.describe import duration_words

EDGES_SHOWN = 50  # upstreams, and downstreams, shown at most
RUNNING_SHOWN = 20
MISSES_SHOWN = 10
MISSED_RECENTLY_MS = 86_400_000  # the jobs list marks a job whose deadline was missed this recently


@dataclass(frozen=True, slots=True)
class Edge:
    """Another job of the namespace this one waits for (upstream) or that waits for it."""

    job_id: str
    kind: str  # "after" (the downstream's schedule) or "require"
    within_ms: int
    live: bool  # False: no such job any more

    @property
    def within(self) -> str:
        return duration_words(self.within_ms // 1000)


@dataclass(frozen=True, slots=True)
class Running:
    """An execution whose work was accepted and has not reported its end."""

    execution_id: str
    scheduled_for: datetime
    attempt: int
    started_at: datetime
    deadline_at: datetime  # no report by then: the attempt fails
    last_heartbeat_at: datetime | None


@dataclass(frozen=True, slots=True)
class Miss:
    execution_id: str
    scheduled_for: datetime
    deadline_at: datetime
    status: str | None  # what history said of it by its deadline (None: nothing)


@dataclass(frozen=True, slots=True)
class Flow:
    upstreams: list[Edge]
    downstreams: list[Edge]
    running: list[Running]
    misses: list[Miss]

    @property
    def empty(self) -> bool:
        return not (self.upstreams or self.downstreams or self.running or self.misses)


_EDGES = text(
    """
SELECT d.{other}, d.kind, d.within_ms, j.id IS NOT NULL
FROM job_dependencies d
LEFT JOIN jobs j ON j.id = d.{other} AND j.namespace = d.namespace AND j.deleted_at IS NULL
WHERE d.namespace = :ns AND d.{this} = :job
ORDER BY d.{other} LIMIT :n
"""
)
_UPSTREAMS = text(_EDGES.text.format(this="downstream", other="upstream"))
_DOWNSTREAMS = text(_EDGES.text.format(this="upstream", other="downstream"))

_RUNNING = text(
    """
SELECT execution_id::text, scheduled_for, attempt, started_at, deadline_at, last_heartbeat_at FROM async_runs
WHERE namespace = :ns AND job_id = :job AND status = 'running' AND started_at >= :since
ORDER BY started_at DESC LIMIT :n
"""
)

_MISSES = text(
    """
SELECT execution_id::text, scheduled_for, deadline_at, status FROM deadline_misses
WHERE namespace = :ns AND job_id = :job AND scheduled_for >= :since
ORDER BY scheduled_for DESC, execution_id LIMIT :n
"""
)

# The latest recent miss of each job shown (of its current incarnation: since it was created).
_RECENT_MISSES = text(
    """
SELECT j.id, m.deadline_at
FROM jobs j
CROSS JOIN LATERAL (
    SELECT deadline_at FROM deadline_misses m
    WHERE m.namespace = j.namespace AND m.job_id = j.id AND m.scheduled_for >= GREATEST(j.created_at, :since)
    ORDER BY m.scheduled_for DESC LIMIT 1
) m
WHERE j.id = ANY(CAST(:ids AS text[])) AND j.deleted_at IS NULL
"""
)


def job_flow(engine: Engine, namespace: str, job_id: str, created_at: datetime) -> Flow:
    """The job's upstreams and downstreams, its running executions (newest first) and its missed
    deadlines (newest first), those of its current incarnation (``created_at`` on)."""
    args = {"ns": namespace, "job": job_id}
    with engine.connect() as conn:
        return Flow(
            _edges(conn, _UPSTREAMS, args),
            _edges(conn, _DOWNSTREAMS, args),
            [Running(*r) for r in conn.execute(_RUNNING, {**args, "since": created_at, "n": RUNNING_SHOWN})],
            [Miss(*r) for r in conn.execute(_MISSES, {**args, "since": created_at, "n": MISSES_SHOWN})],
        )


def _edges(conn: Connection, stmt: TextClause, args: dict[str, str]) -> list[Edge]:
    return [Edge(r[0], r[1], int(r[2]), bool(r[3])) for r in conn.execute(stmt, {**args, "n": EDGES_SHOWN})]


def recent_misses(engine: Engine, job_ids: Sequence[str], now: datetime) -> dict[str, datetime]:
    """The deadline of each listed job's latest miss, for those that missed one lately (one index
    probe per job)."""
    if not job_ids:
        return {}
    since = datetime.fromtimestamp(now.timestamp() - MISSED_RECENTLY_MS / 1000, now.tzinfo)
    with engine.connect() as conn:
        found = conn.execute(_RECENT_MISSES, {"ids": list(job_ids), "since": since})
        return {r[0]: r[1] for r in found}
