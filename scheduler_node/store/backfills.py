"""Backfills as the nodes drive them: a lease (database time) says which owner of the job's slot
drives one (scheduler_node.backfill). Blocking: see PgNodeStore."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from cronman.model.spec import MAX_TIMEOUT_SECONDS, RETRY_DEFAULTS
from scheduler_node.store.port import BackfillRow
from scheduler_node.store.sql import _MS, _XMIN


class Backfills:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def backfills(self) -> list[BackfillRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(_BACKFILLS)
            return [BackfillRow(*r) for r in rows]

    def backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
        """Without a cursor: the running backfills, and the newest cancelled ones of each namespace
        (the nodes cancel their executions still to retry); then, what changed since (the same
        snapshot rule as the job feed: ``change_xid >= xmin``). Light rows: no timing document."""
        with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
            xmin = int(conn.execute(_XMIN).scalar_one())
            if cursor is None:
                rows = conn.execute(_BACKFILLS_KNOWN, {"kept": CANCELLED_KEPT_PER_NAMESPACE})
            else:
                rows = conn.execute(_BACKFILL_CHANGES, {"c": cursor})
            return xmin, [BackfillRow(*r) for r in rows], cursor is None

    def backfill_timing(self, backfill_id: str) -> str | None:
        with self.engine.connect() as conn:
            found = conn.execute(text("SELECT timing::text FROM backfills WHERE id = :id"), {"id": backfill_id})
            return found.scalar()

    def lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        with self.engine.begin() as conn:
            row = conn.execute(_LEASE_BACKFILL, {"id": backfill_id, "h": holder, "ms": lease_ms}).first()
        return None if row is None else (None if row[0] is None else int(row[0]), int(row[1]))

    def renew_backfill(self, params: dict[str, Any]) -> bool:
        with self.engine.begin() as conn:
            row = conn.execute(_RENEW_BACKFILL, params).first()
        return row is not None and bool(row[0])

    def end_backfill(self, backfill_id: str, reason: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE backfills SET state = 'cancelled', reason = :r, driver = NULL, updated_at = now(), "
                    "change_xid = pg_current_xact_id()::text::bigint "
                    "WHERE id = :id AND state = 'running'"
                ),
                {"id": backfill_id, "r": reason},
            )

    def end_orphaned_backfill(self, backfill_id: str) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(_END_ORPHANED_BACKFILL, {"id": backfill_id}).first() is not None


# A cancelled backfill is read for as long as its executions can still retry: a day, plus its
# job's retries (each wait at most max_backoff_seconds, each attempt at most 300 s). Only a running
# one's timing is needed.
_RETRY_SPAN = (
    f"(GREATEST(COALESCE((j.retry->>'max_attempts')::int, {RETRY_DEFAULTS.max_attempts:d}) - 1, 0) "
    f"* (COALESCE((j.retry->>'max_backoff_seconds')::float, {RETRY_DEFAULTS.max_backoff_seconds!r}) "
    f"+ {MAX_TIMEOUT_SECONDS:d})) * interval '1 second'"
)

_BACKFILLS = text(
    f"SELECT b.id, b.job_id, b.incarnation, {_MS.format('b.from_at')}, {_MS.format('b.to_at')}, b.max_per_second, "
    "b.events, CASE WHEN b.state = 'running' THEN b.timing::text ELSE '' END, b.state, "
    f"{_MS.format('b.cursor_at')}, b.dispatched, j.incarnation "
    "FROM backfills b LEFT JOIN jobs j ON j.id = b.job_id AND j.deleted_at IS NULL "
    "WHERE b.state = 'running' OR "
    f"(b.state = 'cancelled' AND b.updated_at > now() - interval '1 day' - {_RETRY_SPAN}) "
    "ORDER BY b.created_at LIMIT 10000"
)
# What a node knows of a backfill without its timing document (read when it drives one)
_BACKFILL_LIGHT = (
    f"SELECT b.id, b.job_id, b.incarnation, {_MS.format('b.from_at')}, {_MS.format('b.to_at')}, b.max_per_second, "
    f"b.events, '', b.state, {_MS.format('b.cursor_at')}, b.dispatched, j.incarnation, b.namespace "
    "FROM backfills b LEFT JOIN jobs j ON j.id = b.job_id AND j.deleted_at IS NULL "
)
CANCELLED_KEPT_PER_NAMESPACE = 1000  # cancelled backfills a node remembers per namespace (newest first)
_BACKFILLS_KNOWN = text(
    _BACKFILL_LIGHT + "WHERE b.state = 'running' OR b.id IN (SELECT id FROM (SELECT id, row_number() OVER "
    "(PARTITION BY namespace ORDER BY updated_at DESC) AS n FROM backfills WHERE state = 'cancelled') c "
    "WHERE n <= :kept)"
)
_BACKFILL_CHANGES = text(_BACKFILL_LIGHT + "WHERE b.change_xid >= :c")
_LEASE_BACKFILL = text(
    "UPDATE backfills SET driver = :h, lease_until = now() + :ms * interval '1 millisecond', updated_at = now() "
    "WHERE id = :id AND state = 'running' AND (driver IS NULL OR driver = :h OR lease_until < now()) "
    f"RETURNING {_MS.format('cursor_at')}, dispatched"
)
_RENEW_BACKFILL = text(
    "UPDATE backfills SET "
    "cursor_at = CASE WHEN CAST(:c AS bigint) IS NULL THEN cursor_at "
    "ELSE GREATEST(cursor_at, timestamptz 'epoch' + CAST(:c AS bigint) * interval '1 millisecond') END, "
    "dispatched = GREATEST(dispatched, :d), lease_until = now() + :ms * interval '1 millisecond', "
    "state = CASE WHEN :done AND state = 'running' THEN 'dispatched' ELSE state END, "
    "change_xid = CASE WHEN :done AND state = 'running' THEN pg_current_xact_id()::text::bigint "
    "ELSE change_xid END, "
    "driver = CASE WHEN :release OR state <> 'running' THEN NULL ELSE driver END, updated_at = now() "
    "WHERE id = :id AND driver = :h RETURNING state = 'running' OR :done"
)
_END_ORPHANED_BACKFILL = text(
    "UPDATE backfills b SET state = 'cancelled', reason = 'the job was deleted', driver = NULL, updated_at = now(), "
    "change_xid = pg_current_xact_id()::text::bigint WHERE b.id = :id AND b.state = 'running' AND NOT EXISTS "
    "(SELECT 1 FROM jobs j WHERE j.id = b.job_id AND j.deleted_at IS NULL AND j.incarnation = b.incarnation) "
    "RETURNING b.id"
)
