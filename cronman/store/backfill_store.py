"""Backfills as stored (``backfills``) and their progress, read from history: an execution of a
backfill has exactly one final history row (succeeded, permanently_failed, skipped or cancelled),
whichever node delivered it and however often it was taken over."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, and_, func, literal_column, select, text, update

from cronman.errors import Conflict, NotFound, QuotaExceeded
from cronman.model.backfills import (
    MAX_RUNNING_PER_JOB,
    BackfillLimits,
    BackfillSpec,
    check_rate,
    count,
    new_backfill_id,
    timing_document,
)
from cronman.model.calendars import Calendar
from cronman.model.execution import backfill_trigger
from cronman.model.spec import OPTION_DEFAULTS, options_with_defaults
from cronman.model.timeutil import from_ms, iso
from cronman.store import audit
from cronman.store.audit import Actor
from cronman.store.db import backfills, jobs
from cronman.store.store import JobRecord

# Every change a node must learn of (created, cancelled, all handed out) stamps the writing
# transaction's id: the nodes read what changed (change_xid >= their snapshot's xmin), as they read jobs.
_CURRENT_XID: ColumnElement[int] = literal_column("pg_current_xact_id()::text::bigint")


class BackfillState(enum.StrEnum):
    RUNNING = "running"  # executions still to hand out, or still to finish
    COMPLETED = "completed"  # every execution finished (delivered, failed for good, skipped)
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Backfill:
    id: str
    namespace: str
    job_id: str
    from_at: datetime
    to_at: datetime
    max_per_second: float
    total: int
    state: BackfillState
    dispatched: int
    delivered: int
    failed: int
    skipped: int
    driver: str | None
    reason: str | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime

    @property
    def pending(self) -> int:
        return max(0, self.dispatched - self.delivered - self.failed - self.skipped)


_COLUMNS = (
    backfills.c.id,
    backfills.c.namespace,
    backfills.c.job_id,
    backfills.c.incarnation,
    backfills.c.from_at,
    backfills.c.to_at,
    backfills.c.max_per_second,
    backfills.c.total,
    backfills.c.state,
    backfills.c.dispatched,
    backfills.c.driver,
    backfills.c.lease_until,
    backfills.c.reason,
    backfills.c.created_by,
    backfills.c.created_at,
    backfills.c.updated_at,
)

# Final rows of a backfill's executions, by status (the history key starts with job and time).
_PROGRESS = text(
    "SELECT status, count(*) FROM scheduled_jobs WHERE job_id = :job AND trigger = :trigger "
    "AND scheduled_for BETWEEN :lo AND :hi AND incarnation = :inc "
    "AND status IN ('succeeded', 'permanently_failed', 'skipped', 'cancelled') GROUP BY status"
)


def _with_progress(conn: Connection, r: Mapping[Any, Any]) -> Backfill:
    params = {"job": r["job_id"], "trigger": backfill_trigger(r["id"]), "lo": r["from_at"], "hi": r["to_at"]}
    done: dict[str, int] = {s: n for s, n in conn.execute(_PROGRESS, {**params, "inc": r["incarnation"]})}
    delivered, failed = done.get("succeeded", 0), done.get("permanently_failed", 0)
    skipped = done.get("skipped", 0) + done.get("cancelled", 0)
    if r["state"] == "cancelled":
        state = BackfillState.CANCELLED
    elif r["state"] == "dispatched" and delivered + failed + skipped >= r["total"]:
        state = BackfillState.COMPLETED
    else:
        state = BackfillState.RUNNING
    leased = r["driver"] is not None and r["lease_until"] is not None and state is BackfillState.RUNNING
    return Backfill(
        id=r["id"],
        namespace=r["namespace"],
        job_id=r["job_id"],
        from_at=r["from_at"],
        to_at=r["to_at"],
        max_per_second=r["max_per_second"],
        total=r["total"],
        state=state,
        dispatched=r["dispatched"],
        delivered=delivered,
        failed=failed,
        skipped=skipped,
        driver=r["driver"].split("/")[0] if leased else None,
        reason=r["reason"],
        created_by=r["created_by"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
    )


def _check_limits(conn: Connection, record: JobRecord, spec: BackfillSpec, limits: BackfillLimits) -> None:
    """The job's running backfills, and the namespace's (how many, and their rate together)."""
    b = backfills.c
    running = conn.execute(select(func.count()).where(b.job_id == record.id, b.state == "running")).scalar_one()
    if running >= MAX_RUNNING_PER_JOB:
        raise Conflict(
            f"job {record.id!r} has {running} backfills running; at most {MAX_RUNNING_PER_JOB} at a time",
            field="id",
            code="too_many_backfills",
        )
    ns = record.namespace
    n, rate = conn.execute(
        select(func.count(), func.coalesce(func.sum(b.max_per_second), 0.0)).where(
            b.namespace == ns, b.state == "running"
        )
    ).one()
    if n >= limits.running:
        raise QuotaExceeded(
            f"namespace {ns!r} has {n} backfills running, its quota; wait for one to finish or cancel one "
            "(the quota is CRONMAN_QUOTA_BACKFILLS_PER_NAMESPACE)",
            quota="CRONMAN_QUOTA_BACKFILLS_PER_NAMESPACE",
            field="id",
        )
    if float(rate) + spec.max_per_second > limits.rate * (1 + 1e-9):
        raise QuotaExceeded(
            f"namespace {ns!r} has backfills running at {float(rate):g} executions a second together; with "
            f"{spec.max_per_second:g} more it would pass its quota of {limits.rate:g} "
            "(the quota is CRONMAN_QUOTA_BACKFILL_RATE_PER_NAMESPACE)",
            quota="CRONMAN_QUOTA_BACKFILL_RATE_PER_NAMESPACE",
            field="max_per_second",
        )


class BackfillStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create(
        self,
        record: JobRecord,
        spec: BackfillSpec,
        range_ms: tuple[int, int],
        found: Mapping[str, Calendar],
        actor: Actor,
        limits: BackfillLimits | None = None,
    ) -> Backfill:
        """A new running backfill of the job as it is now (schedule and calendars kept with it).
        The limits are checked before its occurrences are counted (a refusal costs a query), and
        again where it is written."""
        limits = limits or BackfillLimits()
        check_rate(spec, limits)
        options = options_with_defaults(record.options)
        names = list(options["calendars"])
        events = int(options["events_per_trigger"] or OPTION_DEFAULTS.events_per_trigger)
        document = timing_document(record.schedule, names, found)
        with self.engine.connect() as conn:
            _check_limits(conn, record, spec, limits)
        total = count(document, record.id, record.namespace, *range_ms, events, limits.max_executions)
        backfill_id = new_backfill_id()
        with self.engine.begin() as conn:
            # one writer per namespace and job at a time: the counts below stay true until commit
            conn.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended('backfills:' || :ns, 0))"),
                {"ns": record.namespace},
            )
            conn.execute(select(jobs.c.id).where(jobs.c.id == record.id).with_for_update())
            _check_limits(conn, record, spec, limits)
            conn.execute(
                backfills.insert().values(
                    id=backfill_id,
                    namespace=record.namespace,
                    job_id=record.id,
                    incarnation=record.incarnation,
                    from_at=from_ms(range_ms[0]),
                    to_at=from_ms(range_ms[1]),
                    max_per_second=spec.max_per_second,
                    events=events,
                    timing=document,
                    total=total,
                    state="running",
                    created_by=actor.name,
                    change_xid=_CURRENT_XID,
                )
            )
            detail = {"backfill_id": backfill_id, "from": iso(range_ms[0]), "to": iso(range_ms[1]), "total": total}
            audit.record(conn, record.id, record.namespace, audit.BACKFILL, actor, detail)
        return self.get(backfill_id, record.namespace)

    def get(self, backfill_id: str, namespace: str | None) -> Backfill:
        cond = backfills.c.id == backfill_id
        if namespace is not None:
            cond = and_(cond, backfills.c.namespace == namespace)
        with self.engine.connect() as conn:
            row = conn.execute(select(*_COLUMNS).where(cond)).mappings().first()
            if row is None:
                raise NotFound(f"no backfill {backfill_id!r}", field="id")
            return _with_progress(conn, row)

    def of_job(self, record: JobRecord, limit: int) -> list[Backfill]:
        """The job's backfills (its current incarnation's), newest first."""
        b = backfills.c
        q = (
            select(*_COLUMNS)
            .where(b.job_id == record.id, b.incarnation == record.incarnation)
            .order_by(b.created_at.desc(), b.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [_with_progress(conn, r) for r in conn.execute(q).mappings().all()]

    def cancel(self, backfill_id: str, namespace: str | None, actor: Actor) -> Backfill:
        """Stop handing out executions; those waiting to retry are cancelled when their time comes.
        Cancelling a cancelled backfill changes nothing; a completed one cannot be cancelled."""
        current = self.get(backfill_id, namespace)
        if current.state is BackfillState.COMPLETED:
            raise Conflict(f"backfill {backfill_id!r} has completed", field="id", code="backfill_completed")
        if current.state is BackfillState.CANCELLED:
            return current
        b = backfills.c
        stmt = (
            update(backfills)
            .where(b.id == backfill_id, b.state != "cancelled")
            .values(state="cancelled", reason="cancelled", updated_at=func.now(), change_xid=_CURRENT_XID)
            .returning(b.job_id, b.namespace)
        )
        with self.engine.begin() as conn:
            row = conn.execute(stmt).first()
            if row is not None:
                audit.record(conn, row[0], row[1], audit.BACKFILL_CANCEL, actor, {"backfill_id": backfill_id})
        return self.get(backfill_id, namespace)
