"""The job store and the history reader (PostgreSQL through SQLAlchemy Core)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    create_engine,
    literal,
    literal_column,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cronman.db import job_triggers, jobs, scheduled_jobs
from cronman.errors import Conflict, InvalidInput, NotFound
from cronman.hashing import slot_of
from cronman.spec import JobSpec, options_of
from cronman.timeutil import from_ms, to_ms

_NEXT_VERSION: ColumnElement[int] = literal_column("nextval('jobs_version_seq')")
_CURRENT_XID: ColumnElement[int] = literal_column("pg_current_xact_id()::text::bigint")
_NOW: ColumnElement[datetime] = literal_column("now()")
_RETURNING = (
    jobs.c.id,
    jobs.c.namespace,
    jobs.c.name,
    jobs.c.schedule,
    jobs.c.target,
    jobs.c.payload,
    jobs.c.retry,
    jobs.c.paused,
    jobs.c.version,
    jobs.c.created_at,
    jobs.c.updated_at,
    jobs.c.options,
)


def engine_url(url: str) -> str:
    """A libpq-style URL (postgresql://...) as SQLAlchemy's psycopg2 URL."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg2://" + url[len(scheme) :]
    return url


def make_engine(url: str, *, pool_size: int = 5, max_overflow: int = 10) -> Engine:
    return create_engine(
        engine_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"connect_timeout": 5, "application_name": "cronman"},
    )


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    namespace: str
    name: str | None
    schedule: dict[str, Any]
    target: dict[str, Any]
    payload: str
    retry: dict[str, Any]
    paused: bool
    version: int
    created_at: datetime
    updated_at: datetime
    options: dict[str, Any]

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobRecord:
        return cls(**{k: row[k] for k in cls.__slots__})  # type: ignore[arg-type]

    def spec_document(self) -> dict[str, Any]:
        """The job as a user would write it (the basis of a PATCH)."""
        doc: dict[str, Any] = {
            "id": self.id,
            "schedule": self.schedule,
            "target": self.target,
            "payload": json.loads(self.payload),
            "retry": self.retry,
            "paused": self.paused,
            **{k: v for k, v in self.options.items() if v is not None},
        }
        if self.name is not None:
            doc["name"] = self.name
        return doc


def _values(spec: JobSpec, job_id: str, namespace: str) -> dict[str, Any]:
    return {
        "id": job_id,
        "namespace": namespace,
        "name": spec.name,
        "schedule": spec.schedule.model_dump(mode="json", exclude_none=True),
        "target": spec.target.model_dump(mode="json", exclude_none=True),
        "payload": json.dumps(spec.payload, separators=(",", ":"), ensure_ascii=False),
        "retry": spec.retry.model_dump(mode="json", exclude_none=True),
        "paused": spec.paused,
        "options": options_of(spec),
        "slot": slot_of(job_id),
        "version": _NEXT_VERSION,
        "change_xid": _CURRENT_XID,
        "created_at": _NOW,
        "updated_at": _NOW,
        "deleted_at": None,
    }


def encode_cursor(parts: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, shape: tuple[type, ...]) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        parts = json.loads(raw)
        if (
            not isinstance(parts, list)
            or len(parts) != len(shape)
            or not all(isinstance(p, t) and not isinstance(p, bool) for p, t in zip(parts, shape, strict=True))
        ):
            raise ValueError
        return parts
    except ValueError:
        raise InvalidInput("cursor is not one this API returned", field="cursor", code="invalid_cursor") from None


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    job_id: str
    execution_id: str
    scheduled_for: datetime
    event_index: int
    attempt: int
    trigger: str
    status: str
    node: str | None
    fired_at: datetime | None
    finished_at: datetime | None
    lag_ms: int | None
    http_status: int | None
    error: str | None
    duplicates: int
    throttle_wait_ms: int | None
    dead_lettered: bool | None


class JobStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- jobs ------------------------------------------------------------------------------
    def create(self, spec: JobSpec, job_id: str, namespace: str = "default") -> JobRecord:
        values = _values(spec, job_id, namespace)
        insert = pg_insert(jobs).values(values)
        # A tombstoned id may be reused; a live one is a conflict.
        revive = {k: insert.excluded[k] for k in values if k != "id"}
        stmt = insert.on_conflict_do_update(
            index_elements=[jobs.c.id], set_=revive, where=jobs.c.deleted_at.is_not(None)
        ).returning(*_RETURNING)
        with self.engine.begin() as conn:
            row = conn.execute(stmt).mappings().first()
        if row is None:
            raise Conflict(f"a job with id {job_id!r} already exists", field="id")
        return JobRecord.from_row(row)

    def put(self, spec: JobSpec, job_id: str, namespace: str | None = "default") -> tuple[JobRecord, bool]:
        """Create or replace; returns the record and whether it was created.

        A live job of another namespace is a Conflict. ``namespace=None`` (the admin) replaces a
        live job in its own namespace and creates a new one in the default namespace."""
        values = _values(spec, job_id, namespace or "default")
        insert = pg_insert(jobs).values(values)
        replace = {k: insert.excluded[k] for k in values if k not in ("id", "created_at")}
        replace["created_at"] = literal_column("CASE WHEN jobs.deleted_at IS NULL THEN jobs.created_at ELSE now() END")
        where = None
        if namespace is None:
            replace["namespace"] = literal_column(
                "CASE WHEN jobs.deleted_at IS NULL THEN jobs.namespace ELSE excluded.namespace END"
            )
        else:
            where = or_(jobs.c.namespace == namespace, jobs.c.deleted_at.is_not(None))
        stmt = insert.on_conflict_do_update(index_elements=[jobs.c.id], set_=replace, where=where).returning(
            *_RETURNING
        )
        with self.engine.begin() as conn:
            row = conn.execute(stmt).mappings().first()
        if row is None:  # the id belongs to another namespace
            raise Conflict(f"a job with id {job_id!r} already exists", field="id")
        record = JobRecord.from_row(row)
        return record, record.created_at == record.updated_at

    def get(self, job_id: str, namespace: str | None = None) -> JobRecord:
        cond = and_(jobs.c.id == job_id, jobs.c.deleted_at.is_(None))
        if namespace is not None:
            cond = and_(cond, jobs.c.namespace == namespace)
        with self.engine.connect() as conn:
            row = conn.execute(select(*_RETURNING).where(cond)).mappings().first()
        if row is None:
            raise NotFound(f"no job with id {job_id!r}", field="id")
        return JobRecord.from_row(row)

    def list_jobs(self, namespace: str | None, limit: int, after_id: str | None) -> list[JobRecord]:
        q = select(*_RETURNING).where(jobs.c.deleted_at.is_(None))
        if namespace is not None:
            q = q.where(jobs.c.namespace == namespace)
        if after_id is not None:
            q = q.where(jobs.c.id > after_id)
        q = q.order_by(jobs.c.id).limit(limit)
        with self.engine.connect() as conn:
            return [JobRecord.from_row(r) for r in conn.execute(q).mappings()]

    def replace_checked(self, job_id: str, namespace: str | None, version: int, spec: JobSpec) -> JobRecord:
        """Replace a live job if it is still at ``version`` (optimistic concurrency for PATCH)."""
        values = _values(spec, job_id, namespace or "default")
        for k in ("id", "namespace", "created_at", "deleted_at"):
            values.pop(k)
        cond = and_(jobs.c.id == job_id, jobs.c.version == version, jobs.c.deleted_at.is_(None))
        if namespace is not None:
            cond = and_(cond, jobs.c.namespace == namespace)
        with self.engine.begin() as conn:
            row = conn.execute(update(jobs).where(cond).values(values).returning(*_RETURNING)).mappings().first()
        if row is None:
            raise Conflict(
                f"job {job_id!r} changed while it was being updated; try again", field="id", code="concurrent_update"
            )
        return JobRecord.from_row(row)

    def set_paused(self, job_id: str, namespace: str | None, paused: bool) -> JobRecord:
        cond = and_(jobs.c.id == job_id, jobs.c.deleted_at.is_(None))
        if namespace is not None:
            cond = and_(cond, jobs.c.namespace == namespace)
        stmt = (
            update(jobs)
            .where(cond)
            .values(paused=paused, version=_NEXT_VERSION, change_xid=_CURRENT_XID, updated_at=_NOW)
            .returning(*_RETURNING)
        )
        with self.engine.begin() as conn:
            row = conn.execute(stmt).mappings().first()
        if row is None:
            raise NotFound(f"no job with id {job_id!r}", field="id")
        return JobRecord.from_row(row)

    def delete(self, job_id: str, namespace: str | None) -> None:
        cond = and_(jobs.c.id == job_id, jobs.c.deleted_at.is_(None))
        if namespace is not None:
            cond = and_(cond, jobs.c.namespace == namespace)
        stmt = (
            update(jobs)
            .where(cond)
            .values(deleted_at=_NOW, version=_NEXT_VERSION, change_xid=_CURRENT_XID, updated_at=_NOW)
        )
        with self.engine.begin() as conn:
            if conn.execute(stmt).rowcount == 0:
                raise NotFound(f"no job with id {job_id!r}", field="id")

    def add_trigger(self, job_id: str, namespace: str | None, requested_by: str | None) -> int:
        """Ask the owners of a job to fire it once now; returns the requested time (epoch ms)."""
        record = self.get(job_id, namespace)
        stmt = (
            job_triggers.insert()
            .values(job_id=record.id, requested_by=requested_by, change_xid=_CURRENT_XID)
            .returning(job_triggers.c.requested_at)
        )
        with self.engine.begin() as conn:
            return to_ms(conn.execute(stmt).scalar_one())

    def add_redelivery(
        self, job_id: str, namespace: str | None, exec_id: str, requested_by: str | None
    ) -> tuple[int, int]:
        """Ask the owners of a job to send a failed execution again, as its next attempt under the
        same execution id; returns (scheduled_for ms, the new attempt number)."""
        try:
            exec_id = str(uuid.UUID(exec_id))
        except ValueError:
            raise NotFound(f"job {job_id!r} has no execution {exec_id!r}", field="execution_id") from None
        record = self.get(job_id, namespace)
        c = scheduled_jobs.c
        with self.engine.begin() as conn:
            last = conn.execute(
                select(c.scheduled_for, c.event_index, c.attempt, c.trigger, c.status)
                .where(c.job_id == record.id, c.execution_id == exec_id)
                .order_by(c.attempt.desc())
                .limit(1)
            ).first()
            if last is None:
                raise NotFound(f"job {job_id!r} has no execution {exec_id!r}", field="execution_id")
            if last.status not in ("failed", "permanently_failed"):
                raise Conflict(
                    f"execution {exec_id!r} is {last.status}; only a failed execution can be redelivered",
                    field="execution_id",
                    code="not_failed",
                )
            conn.execute(
                job_triggers.insert().values(
                    job_id=record.id,
                    requested_by=requested_by,
                    change_xid=_CURRENT_XID,
                    kind="redeliver",
                    scheduled_for=last.scheduled_for,
                    event_index=last.event_index,
                    attempt=last.attempt + 1,
                    execution_id=exec_id,
                    trigger=last.trigger,
                )
            )
        return to_ms(last.scheduled_for), last.attempt + 1

    # -- history ---------------------------------------------------------------------------
    def executions(self, job_id: str, limit: int, cursor: str | None) -> tuple[list[ExecutionRecord], str | None]:
        c = scheduled_jobs.c
        q = select(
            c.job_id,
            c.execution_id,
            c.scheduled_for,
            c.event_index,
            c.attempt,
            c.trigger,
            c.status,
            c.node,
            c.fired_at,
            c.finished_at,
            c.lag_ms,
            c.http_status,
            c.error,
            c.duplicates,
            c.throttle_wait_ms,
            c.dead_lettered,
        ).where(c.job_id == job_id)
        if cursor:
            ms, ev, att = decode_cursor(cursor, (int, int, int))
            try:
                after = from_ms(ms)
            except (OverflowError, ValueError):
                raise InvalidInput(
                    "cursor is not one this API returned", field="cursor", code="invalid_cursor"
                ) from None
            q = q.where(
                tuple_(c.scheduled_for, c.event_index, c.attempt) < tuple_(literal(after), literal(ev), literal(att))
            )
        q = q.order_by(c.scheduled_for.desc(), c.event_index.desc(), c.attempt.desc()).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = [ExecutionRecord(**r) for r in conn.execute(q).mappings()]
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            last = rows[-1]
            next_cursor = encode_cursor([to_ms(last.scheduled_for), last.event_index, last.attempt])
        return rows, next_cursor

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
