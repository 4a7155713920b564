"""What a node reads from and writes to PostgreSQL besides history: the jobs of the slots it owns,
the change feed, throttle policies, signing secrets and the cluster's fired-through watermark.

Jobs and the feed are read in one REPEATABLE READ snapshot together with that snapshot's xmin.
Every transaction whose changes the snapshot could not see has an id >= xmin, so polling
``change_xid >= xmin`` next time cannot skip a transaction that committed late. Rows seen twice
are told apart by version.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from scheduler_node.jobs import JOB_COLUMNS, Decoder, JobRow, OwnedJob

log = logging.getLogger("cronman.node.feed")

_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
_MS = "floor(extract(epoch from {}) * 1000)::bigint"


@dataclass(frozen=True, slots=True)
class TriggerRow:
    id: int
    job_id: str
    requested_ms: int
    kind: str = "trigger"  # or "redeliver"
    scheduled_ms: int | None = None
    event_index: int | None = None
    attempt: int | None = None
    execution_id: str | None = None
    trigger: str | None = None


def load_slots(
    engine: Engine, slots: Sequence[int], decoder: Decoder, batch: int = 20_000
) -> tuple[int, list[tuple[OwnedJob, int]]]:
    """Every live job in ``slots`` as (job, updated ms), and the snapshot's xmin to poll changes
    from. Rows are decoded as they stream in (a server-side cursor), so a million jobs never sit
    in memory as rows."""
    out: list[tuple[OwnedJob, int]] = []
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        xmin = int(conn.execute(_XMIN).scalar_one())
        if slots:
            cur: Any = conn.connection.dbapi_connection.cursor(name="cronman_load_slots")  # type: ignore[union-attr]
            cur.itersize = batch
            try:
                cur.execute(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE deleted_at IS NULL AND slot = ANY(%s)", (list(slots),)
                )
                job_from = decoder.job_from
                # Hundreds of thousands of new long-lived objects would set off the cycle collector
                # over and over, scanning them all each time: it is paused while they are built.
                collecting = gc.isenabled()
                gc.disable()
                for r in cur:
                    try:
                        job = job_from(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[9], r[10])
                    except (ValueError, KeyError, TypeError) as exc:
                        log.error("cannot schedule job: %s", exc, extra={"job_id": r[0]})
                        continue
                    out.append((job, r[8]))
            finally:
                if collecting:
                    gc.enable()
                cur.close()
    return xmin, out


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
                    f"SELECT id, job_id, {_MS.format('requested_at')}, kind, {_MS.format('scheduled_for')}, "
                    "event_index, attempt, execution_id::text, trigger FROM job_triggers WHERE change_xid >= :c"
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
                f"SELECT s.job_id, {_MS.format('s.scheduled_for')}, s.event_index "
                "FROM scheduled_jobs s JOIN unnest(CAST(:j AS text[]), CAST(:t AS bigint[]), CAST(:e AS int[])) "
                "AS w(job_id, ms, ev) ON s.job_id = w.job_id "
                "AND s.scheduled_for = timestamptz 'epoch' + w.ms * interval '1 millisecond' "
                "AND s.event_index = w.ev WHERE s.status IN ('succeeded', 'permanently_failed', 'skipped')"
            ),
            {"j": [i[0] for i in items], "t": [i[1] for i in items], "e": [i[2] for i in items]},
        )
        return {(r[0], int(r[1]), int(r[2])) for r in rows}


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Small tables every node keeps whole: throttle policies and signing secrets."""

    throttles: dict[tuple[str, str], tuple[int, float | None]]
    secrets: dict[str, tuple[str, ...]]  # newest first; the previous one for a day after a rotation


def load_cluster_config(engine: Engine) -> ClusterConfig:
    with engine.connect() as conn:
        throttles = {
            (r[0], r[1]): (int(r[2]), None if r[3] is None else float(r[3]))
            for r in conn.execute(text("SELECT namespace, name, max_in_flight, max_per_second FROM throttle_policies"))
        }
        secrets: dict[str, list[str]] = {}
        rows = conn.execute(
            text(
                "SELECT namespace, secret, created_at > now() - interval '1 day' FROM signing_secrets "
                "ORDER BY namespace, created_at DESC, id DESC"
            )
        )
        newest_recent: dict[str, bool] = {}
        for namespace, secret, recent in rows:
            have = secrets.setdefault(namespace, [])
            if not have:
                have.append(secret)
                newest_recent[namespace] = bool(recent)
            elif len(have) == 1 and newest_recent[namespace]:
                have.append(secret)  # still within a day of the rotation
    return ClusterConfig(throttles, {k: tuple(v) for k, v in secrets.items()})


def read_watermark(engine: Engine) -> int | None:
    """The last time (epoch ms) any node reported it was running, or None on a new cluster."""
    with engine.connect() as conn:
        value = conn.execute(
            text(f"SELECT {_MS.format('value')} FROM scheduler_state WHERE key = 'fired_through'")
        ).scalar()
    return None if value is None else int(value)


def advance_watermark(engine: Engine, now_ms: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduler_state (key, value) VALUES "
                "('fired_through', timestamptz 'epoch' + :ms * interval '1 millisecond') "
                "ON CONFLICT (key) DO UPDATE SET value = GREATEST(scheduler_state.value, EXCLUDED.value)"
            ),
            {"ms": now_ms},
        )


def delete_completed(engine: Engine, job_id: str, version: int) -> bool:
    """Delete a job that has nothing left to fire (delete_after_completion), unless it changed."""
    with engine.begin() as conn:
        row = conn.execute(
            text(
                "UPDATE jobs SET deleted_at = now(), updated_at = now(), version = nextval('jobs_version_seq'), "
                "change_xid = pg_current_xact_id()::text::bigint "
                "WHERE id = :id AND version = :v AND deleted_at IS NULL RETURNING namespace"
            ),
            {"id": job_id, "v": version},
        ).first()
        if row is None:
            return False
        conn.execute(
            text(
                "INSERT INTO job_events (job_id, namespace, action, actor, detail) "
                "VALUES (:id, :ns, 'delete', 'scheduler', '{\"reason\": \"completed\"}'::jsonb)"
            ),
            {"id": job_id, "ns": row[0]},
        )
    return True
