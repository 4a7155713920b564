"""What a node reads from PostgreSQL: the jobs of the slots it owns and the change feed.

Both read in one REPEATABLE READ snapshot together with that snapshot's xmin. Every transaction
whose changes the snapshot could not see has an id >= xmin, so polling ``change_xid >= xmin`` next
time cannot skip a transaction that committed late. Rows seen twice are told apart by version.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, text

from scheduler_node.jobs import JOB_COLUMNS, JobRow

_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")


@dataclass(frozen=True, slots=True)
class TriggerRow:
    id: int
    job_id: str
    requested_ms: int


def load_slots(engine: Engine, slots: Sequence[int], batch: int = 20_000) -> tuple[int, list[JobRow]]:
    """Every live job in ``slots``, and the snapshot's xmin to poll changes from."""
    rows: list[JobRow] = []
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        xmin = int(conn.execute(_XMIN).scalar_one())
        if slots:
            result = conn.execution_options(yield_per=batch).execute(
                text(f"SELECT {JOB_COLUMNS} FROM jobs WHERE deleted_at IS NULL AND slot = ANY(:slots)"),
                {"slots": list(slots)},
            )
            rows.extend(JobRow(*r) for r in result)
    return xmin, rows


def poll_changes(engine: Engine, cursor: int) -> tuple[int, list[JobRow], list[TriggerRow]]:
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        xmin = int(conn.execute(_XMIN).scalar_one())
        jobs = [
            JobRow(*r)
            for r in conn.execute(
                text(f"SELECT {JOB_COLUMNS}, deleted_at IS NOT NULL FROM jobs WHERE change_xid >= :c"), {"c": cursor}
            )
        ]
        triggers = [
            TriggerRow(*r)
            for r in conn.execute(
                text(
                    "SELECT id, job_id, floor(extract(epoch from requested_at) * 1000)::bigint "
                    "FROM job_triggers WHERE change_xid >= :c"
                ),
                {"c": cursor},
            )
        ]
    return xmin, jobs, triggers


def finished_executions(engine: Engine, executions: Iterable[tuple[str, int, int]]) -> set[tuple[str, int, int]]:
    """Which of (job id, scheduled ms, event index) already have a final history row."""
    items = list(executions)
    if not items:
        return set()
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.job_id, floor(extract(epoch from s.scheduled_for) * 1000)::bigint, s.event_index "
                "FROM scheduled_jobs s JOIN unnest(CAST(:j AS text[]), CAST(:t AS bigint[]), CAST(:e AS int[])) "
                "AS w(job_id, ms, ev) ON s.job_id = w.job_id "
                "AND s.scheduled_for = timestamptz 'epoch' + w.ms * interval '1 millisecond' "
                "AND s.event_index = w.ev WHERE s.status IN ('succeeded', 'permanently_failed', 'skipped')"
            ),
            {"j": [i[0] for i in items], "t": [i[1] for i in items], "e": [i[2] for i in items]},
        )
        return {(r[0], int(r[1]), int(r[2])) for r in rows}
