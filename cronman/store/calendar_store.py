"""Calendars as stored: one row per (namespace, name), the document as `cronman.model.calendars` writes
it, and a version every write moves (nodes load again only the calendars whose version moved).
Jobs name calendars of their own namespace (``calendars: [...]``); a write naming one that does
not exist is refused, and so is deleting a calendar that live jobs still name.

Quotas (`CalendarQuotas`, from the settings): how many calendars a namespace keeps, and how large
one may be, in entries and in bytes. Each is checked before the work it bounds: the bytes before
the body is parsed, the count and the entries before any entry is, and the count again, under a
lock of the namespace, where the calendar is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, literal_column, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cronman.errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from cronman.model.calendars import (
    Calendar,
    CalendarError,
    calendar_from_dict,
    calendar_from_stored,
    calendar_to_dict,
    document_entries,
    timing_with,
)
from cronman.model.schedule import Timing, timing_from_dict
from cronman.model.spec import CALENDAR_NAME_PATTERN
from cronman.settings import Settings
from cronman.store.db import calendars

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


@dataclass(frozen=True, slots=True)
class CalendarQuotas:
    """What one namespace may keep of calendars (settings ``calendars_per_namespace``,
    ``calendar_max_entries``, ``calendar_max_bytes``)."""

    per_namespace: int
    max_entries: int
    max_bytes: int

    @classmethod
    def of(cls, s: Settings) -> CalendarQuotas:
        return cls(s.calendars_per_namespace, s.calendar_max_entries, s.calendar_max_bytes)

    def too_many_bytes(self) -> QuotaExceeded:
        return QuotaExceeded(
            f"a calendar document is at most {self.max_bytes} bytes (quota calendar_max_bytes, "
            "CRONMAN_CALENDAR_MAX_BYTES)",
            quota="calendar_max_bytes",
            field="body",
            status=413,
        )

    def check_entries(self, doc: Any) -> None:
        """Before any entry is parsed: the document lists at most ``max_entries``."""
        n = document_entries(doc)
        if n > self.max_entries:
            raise QuotaExceeded(
                f"a calendar holds at most {self.max_entries} dates, ranges and annual dates together, this one "
                f"{n} (quota calendar_max_entries, CRONMAN_CALENDAR_MAX_ENTRIES)",
                quota="calendar_max_entries",
                field="exclude",
                status=413,
            )

    def too_many_calendars(self, namespace: str) -> QuotaExceeded:
        return QuotaExceeded(
            f"namespace {namespace!r} has {self.per_namespace} calendars, as many as it may keep (quota "
            "calendars_per_namespace, CRONMAN_CALENDARS_PER_NAMESPACE); delete one first",
            quota="calendars_per_namespace",
        )


def parse_calendar(doc: Any, max_entries: int | None = None) -> Calendar:
    """A calendar document as a user wrote it; InvalidInput naming the field at fault."""
    try:
        return calendar_from_dict(doc) if max_entries is None else calendar_from_dict(doc, max_entries)
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
        r["namespace"], r["name"], calendar_from_stored(r["document"]), r["created_at"], r["updated_at"]
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

    def put(
        self, namespace: str, name: str, cal: Calendar, quotas: CalendarQuotas | None = None
    ) -> tuple[StoredCalendar, bool]:
        """Create or replace; returns the calendar and whether it was created. A new calendar
        beyond the namespace's quota is refused (QuotaExceeded), checked under a lock of the
        namespace's calendars so that writes at once cannot pass it together."""
        insert = pg_insert(calendars).values(namespace=namespace, name=name, document=calendar_to_dict(cal))
        stmt = insert.on_conflict_do_update(
            index_elements=[calendars.c.namespace, calendars.c.name],
            set_={
                "document": insert.excluded.document,
                "updated_at": literal_column("now()"),
                "version": literal_column("nextval('calendars_version_seq')"),
            },
        ).returning(*_COLUMNS, literal_column("xmax = 0").label("inserted"))
        with self.engine.begin() as conn:
            if quotas is not None:
                conn.execute(_LOCK_NAMESPACE, {"ns": namespace})
                if not self._room(conn, namespace, name, quotas.per_namespace):
                    raise quotas.too_many_calendars(namespace)
            row = conn.execute(stmt).mappings().one()
        return _row(row), bool(row["inserted"])

    def check_room(self, namespace: str, name: str, quotas: CalendarQuotas) -> None:
        """Whether the namespace may write calendar ``name`` (replacing one always may); a cheap
        look before the document is parsed (``put`` decides, under the lock)."""
        with self.engine.connect() as conn:
            if not self._room(conn, namespace, name, quotas.per_namespace):
                raise quotas.too_many_calendars(namespace)

    @staticmethod
    def _room(conn: Connection, namespace: str, name: str, most: int) -> bool:
        found = conn.execute(_OTHERS, {"ns": namespace, "name": name, "n": most + 1}).all()
        others = [r[0] for r in found]
        return name in others or len(others) < most

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
            return {(r[0], r[1]): calendar_from_stored(r[2]) for r in conn.execute(q)}


# The calendars of a namespace, up to a number (and the one written, if it exists): the quota's count.
_OTHERS = text(
    "(SELECT name FROM calendars WHERE namespace = :ns AND name = :name) UNION ALL "
    "(SELECT name FROM calendars WHERE namespace = :ns AND name <> :name LIMIT :n)"
)
# Writes of one namespace's calendars one at a time, for the length of a transaction.
_LOCK_NAMESPACE = text("SELECT pg_advisory_xact_lock(hashtextextended('cronman.calendars:' || :ns, 0))")
# Jobs naming a calendar: the partial index ix_jobs_calendars holds only jobs that name any.
_IN_USE = text(
    "SELECT id FROM jobs WHERE namespace = :ns AND options ? 'calendars' AND deleted_at IS NULL "
    "AND options -> 'calendars' ? :name ORDER BY id LIMIT :n"
)
