"""Calendars as stored: one row per (namespace, name), the document as `cronman.calendars` writes
it. Jobs name calendars of their own namespace (``calendars: [...]``); a write naming one that does
not exist is refused, and so is deleting a calendar that live jobs still name."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, literal_column, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cronman.calendars import Calendar, CalendarError, calendar_from_dict, calendar_to_dict, timing_with
from cronman.db import calendars
from cronman.errors import Conflict, InvalidInput, NotFound
from cronman.schedule import Timing, timing_from_dict
from cronman.spec import CALENDAR_NAME_PATTERN

CALENDAR_NAME_RE = re.compile(CALENDAR_NAME_PATTERN)
_IN_USE_SHOWN = 10


@dataclass(frozen=True, slots=True)
class StoredCalendar:
    namespace: str
    name: str
    calendar: Calendar
    created_at: datetime
    updated_at: datetime


def check_name(name: str) -> str:
    if not CALENDAR_NAME_RE.match(name):
        raise InvalidInput(
            "a calendar name is 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit",
            field="name",
            code="invalid_value",
        )
    return name


def parse_calendar(doc: Any) -> Calendar:
    """A calendar document as a user wrote it; InvalidInput naming the field at fault."""
    try:
        return calendar_from_dict(doc)
    except CalendarError as exc:
        raise InvalidInput(str(exc), field=exc.field or None, code="invalid_calendar") from None


def unknown_calendar(name: str, namespace: str) -> InvalidInput:
    return InvalidInput(
        f"calendars: namespace {namespace!r} has no calendar {name!r}; create it first (PUT /v1/calendars/{name})",
        field="calendars",
        code="unknown_calendar",
    )


def missing_calendars(
    conn: Connection, wanted: Iterable[tuple[str, str]], *, lock: bool = False
) -> set[tuple[str, str]]:
    """Which (namespace, name) pairs name no calendar. ``lock``: hold the found rows (FOR SHARE)
    until the transaction ends, so that a delete waits for the job naming them to be written."""
    pairs = set(wanted)
    if not pairs:
        return set()
    c = calendars.c
    q = select(c.namespace, c.name).where(tuple_(c.namespace, c.name).in_(sorted(pairs)))
    if lock:
        q = q.with_for_update(read=True)
    return pairs - {(r[0], r[1]) for r in conn.execute(q)}


def names_of(options: Mapping[str, Any]) -> list[str]:
    """The calendars a stored job names (its ``options`` document)."""
    return list(options.get("calendars") or ())


def job_timing(
    job_id: str,
    namespace: str,
    schedule: dict[str, Any],
    options: Mapping[str, Any],
    found: Mapping[tuple[str, str], Calendar],
) -> Timing:
    """A stored job's timing with the calendars it names (of ``found``, by namespace and name)."""
    names = names_of(options)
    base = timing_from_dict(schedule, job_id, namespace)
    if not names:
        return base
    return timing_with(base, names, {n: found[(namespace, n)] for n in names if (namespace, n) in found})


def _row(r: Mapping[Any, Any]) -> StoredCalendar:
    return StoredCalendar(
        r["namespace"], r["name"], calendar_from_dict(r["document"]), r["created_at"], r["updated_at"]
    )


_COLUMNS = (
    calendars.c.namespace,
    calendars.c.name,
    calendars.c.document,
    calendars.c.created_at,
    calendars.c.updated_at,
)


class CalendarStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def put(self, namespace: str, name: str, cal: Calendar) -> tuple[StoredCalendar, bool]:
        """Create or replace; returns the calendar and whether it was created."""
        insert = pg_insert(calendars).values(namespace=namespace, name=name, document=calendar_to_dict(cal))
        stmt = insert.on_conflict_do_update(
            index_elements=[calendars.c.namespace, calendars.c.name],
            set_={"document": insert.excluded.document, "updated_at": literal_column("now()")},
        ).returning(*_COLUMNS, literal_column("xmax = 0").label("inserted"))
        with self.engine.begin() as conn:
            row = conn.execute(stmt).mappings().one()
        return _row(row), bool(row["inserted"])

    def get(self, namespace: str, name: str) -> StoredCalendar:
        c = calendars.c
        with self.engine.connect() as conn:
            found = conn.execute(select(*_COLUMNS).where(and_(c.namespace == namespace, c.name == name))).mappings()
            row = found.first()
        if row is None:
            raise NotFound(f"no calendar {name!r}", field="name")
        return _row(row)

    def list(self, namespace: str | None) -> list[StoredCalendar]:
        c = calendars.c
        q = select(*_COLUMNS).order_by(c.namespace, c.name)
        if namespace is not None:
            q = q.where(c.namespace == namespace)
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q).mappings()]

    def delete(self, namespace: str, name: str) -> None:
        """Delete a calendar no live job names (409 naming some of those that do)."""
        c = calendars.c
        with self.engine.begin() as conn:
            held = conn.execute(
                select(c.name).where(and_(c.namespace == namespace, c.name == name)).with_for_update()
            ).first()
            if held is None:
                raise NotFound(f"no calendar {name!r}", field="name")
            users = [r[0] for r in conn.execute(_IN_USE, {"ns": namespace, "name": name, "n": _IN_USE_SHOWN + 1})]
            if users:
                more = ", ..." if len(users) > _IN_USE_SHOWN else ""
                raise Conflict(
                    f"calendar {name!r} is named by jobs {', '.join(users[:_IN_USE_SHOWN])}{more}; remove it from "
                    "them first",
                    field="name",
                    code="calendar_in_use",
                )
            conn.execute(calendars.delete().where(and_(c.namespace == namespace, c.name == name)))

    def named(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Calendar]:
        """The calendars among (namespace, name) pairs that exist."""
        wanted = sorted(set(pairs))
        if not wanted:
            return {}
        c = calendars.c
        q = select(c.namespace, c.name, c.document).where(tuple_(c.namespace, c.name).in_(wanted))
        with self.engine.connect() as conn:
            return {(r[0], r[1]): calendar_from_dict(r[2]) for r in conn.execute(q)}


# Jobs naming a calendar: the partial index ix_jobs_calendars holds only jobs that name any.
_IN_USE = text(
    "SELECT id FROM jobs WHERE namespace = :ns AND options ? 'calendars' AND deleted_at IS NULL "
    "AND options -> 'calendars' ? :name ORDER BY id LIMIT :n"
)
