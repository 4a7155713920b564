"""Who did what to a job: one ``job_events`` row per change, written by the statement that makes
the change (a data-modifying CTE), so the record and the change commit or fail together at the
cost of no extra round trip."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Delete,
    Insert,
    Select,
    Text,
    Update,
    and_,
    literal,
    null,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB

from cronman.store.db import job_events

# The actions a job_events row records.
CREATE, REPLACE, UPDATE, DELETE = "create", "replace", "update", "delete"
PAUSE, RESUME, TRIGGER, REDELIVER = "pause", "resume", "trigger", "redeliver"
BACKFILL, BACKFILL_CANCEL = "backfill", "backfill_cancel"


@dataclass(frozen=True, slots=True)
class Actor:
    """Who made a change (``name``: ``admin``, ``key:<prefix>``, ``queue``, ...) and any detail the
    caller adds to every event it writes (``{"command_id": ...}`` for a queued command)."""

    name: str | None
    detail: dict[str, Any] | None = None

    def with_detail(self, detail: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.detail is None:
            return detail
        return {**self.detail, **(detail or {})}


NOBODY = Actor(None)


def _json(detail: dict[str, Any] | None) -> ColumnElement[Any]:
    return null() if detail is None else literal(detail, JSONB)


def audited(
    dml: Insert | Update | Delete,
    action: str,
    actor: Actor,
    detail: dict[str, Any] | None = None,
) -> Select[Any]:
    """``dml`` (which must return ``id`` and ``namespace``) and an event for each row it changes,
    as one statement that returns what ``dml`` returns."""
    changed = dml.cte("changed")
    event = (
        job_events.insert()
        .from_select(
            ["job_id", "namespace", "action", "actor", "detail"],
            select(
                changed.c.id,
                changed.c.namespace,
                literal(action, Text),
                literal(actor.name, Text),
                _json(actor.with_detail(detail)),
            ),
        )
        .cte("event")
    )
    return select(*changed.c).add_cte(event)


def record(conn: Connection, job_id: str, namespace: str, action: str, actor: Actor, detail: dict[str, Any]) -> None:
    """One event, inside the caller's transaction (for changes made by several statements)."""
    conn.execute(
        job_events.insert().values(
            job_id=job_id, namespace=namespace, action=action, actor=actor.name, detail=actor.with_detail(detail)
        )
    )


@dataclass(frozen=True, slots=True)
class JobEvent:
    id: int
    job_id: str
    namespace: str
    at: datetime
    action: str
    actor: str | None
    detail: dict[str, Any] | None


def list_events(
    conn: Connection, job_id: str, namespace: str | None, limit: int, before_id: int | None
) -> list[JobEvent]:
    """A job's events, newest first; ``namespace`` None sees every namespace's events of the id."""
    e = job_events.c
    cond = e.job_id == job_id
    if namespace is not None:
        cond = and_(cond, e.namespace == namespace)
    if before_id is not None:
        cond = and_(cond, e.id < before_id)
    q = (
        select(e.id, e.job_id, e.namespace, e.at, e.action, e.actor, e.detail)
        .where(cond)
        .order_by(e.id.desc())
        .limit(limit)
    )
    return [JobEvent(**r) for r in conn.execute(q).mappings()]
