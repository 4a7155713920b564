"""The job store and the history reader (PostgreSQL through SQLAlchemy Core)."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    TextClause,
    and_,
    create_engine,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy import exc as sqlalchemy_exc
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from cronman.errors import (
    Conflict,
    CronmanError,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    QuotaExceeded,
    TransientError,
)
from cronman.model.changes import Stop
from cronman.model.execution import Trigger, execution_id
from cronman.model.hashing import slot_of
from cronman.model.labels import Op, Selector
from cronman.model.namespaces import DEFAULT_NAMESPACE
from cronman.model.spec import JobSpec, options_of
from cronman.model.timeutil import MAX_INSTANT_MS, MIN_INSTANT_MS, from_ms, iso, to_ms
from cronman.store import audit, dependencies
from cronman.store.audit import NOBODY, Actor, audited
from cronman.store.calendar_store import missing_calendars, unknown_calendar
from cronman.store.db import async_runs, execution_upstreams, job_triggers, jobs, namespace_usage, scheduled_jobs
from cronman.store.health import paused_by
from cronman.store.pgurl import sqlalchemy_url
from cronman.store.prepared import Prepared
from cronman.store.throttles import missing_policies, unknown_throttle

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
    jobs.c.incarnation,
    jobs.c.labels,
    jobs.c.paused_reason,
)


def engine_url(url: str) -> str:
    """A libpq-style URL (postgresql://..., one host or a comma-separated list) as SQLAlchemy's
    psycopg2 URL (see :mod:`cronman.store.pgurl`)."""
    return sqlalchemy_url(url)


# libpq keywords set unless the URL sets them: a deadline on connecting (per host of a list) and
# TCP keepalives, so a connection to a primary that vanished without closing it fails in about
# 25 s instead of hanging until the kernel gives up.
_CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "application_name": "cronman",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


def make_engine(
    url: str, *, pool_size: int = 5, max_overflow: int = 10, pre_ping: bool = True, null_pool: bool = False
) -> Engine:
    """``pre_ping`` tests each pooled connection before use (a round trip), so none fails after
    a database restart or failover. Without it, a failure on a dead connection discards the whole pool
    at once, costing one failed request per worker instead of a round trip per request. Either way
    the next connection goes through libpq again, which (with a host list and
    ``target_session_attrs=read-write``) finds the new primary. ``null_pool`` opens a connection per
    use (migrations)."""
    full = engine_url(url)
    given = make_url(full).query
    connect_args = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in given}
    if null_pool:
        return create_engine(full, poolclass=NullPool, connect_args=connect_args)
    return create_engine(
        full,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        connect_args=connect_args,
    )


def _first_row_alone(
    engine: Engine, sql: str, params: Mapping[str, Any], prepared: Prepared | None = None
) -> tuple[Any, ...] | None:
    """The first row of one statement that commits by itself, sent through the DBAPI connection of
    one of ``engine``'s pooled connections, switched to autocommit for it (as SQLAlchemy's pre-ping
    does). SQLAlchemy's ``execution_options(isolation_level="AUTOCOMMIT")`` did the same through
    its connection and result objects, which cost a create more of the API's CPU than the
    statement's own client side, and its reset when the connection went back to the pool set the
    isolation level again, which psycopg2 sends as a ``SET`` (a round trip a create). The values
    are the driver's, as ``exec_driver_sql`` returns them; an error is raised as it raises it
    (``sqlalchemy.exc.OperationalError`` for a lost server, which the API answers with 503), and a
    lost connection marks the pool's as stale, as SQLAlchemy's connections do. ``prepared``: the
    same statement, executed prepared when the session may (:mod:`cronman.store.prepared`)."""
    dbapi_error = engine.dialect.loaded_dbapi.Error
    fairy = engine.raw_connection()
    dbapi_connection: Any = fairy.dbapi_connection  # (psycopg2's: checked out, never None)
    try:
        if dbapi_connection.isolation_level is not None:  # (a level such a reset left: the default's)
            dbapi_connection.isolation_level = None  # outside autocommit, psycopg2 sends nothing
        dbapi_connection.autocommit = True
        try:
            cursor = dbapi_connection.cursor()
            try:
                if prepared is None or not prepared.execute(cursor, fairy.info, params):
                    cursor.execute(sql, params)
                return cursor.fetchone()  # type: ignore[no-any-return]
            finally:
                cursor.close()
        finally:
            if not dbapi_connection.closed:
                dbapi_connection.autocommit = False  # (the isolation level is the default's: no SET)
    except dbapi_error as exc:
        lost = engine.dialect.is_disconnect(exc, dbapi_connection, None)
        if lost:
            engine.pool._invalidate(fairy, exc)  # (what Connection does on a disconnect)
        raise sqlalchemy_exc.DBAPIError.instance(
            sql, params, exc, dbapi_error, connection_invalidated=lost, dialect=engine.dialect
        ) from exc
    finally:
        fairy.close()


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
    incarnation: int
    labels: dict[str, str]
    paused_reason: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobRecord:
        return cls(**{k: row[k] for k in cls.__slots__})  # type: ignore[arg-type]

    def spec_document(self) -> dict[str, Any]:
        """The job as a user would write it (the basis of a PATCH)."""
        return _document(
            self.id, self.name, self.schedule, self.target, self.payload, self.retry, self.paused, self.options
        ) | _labels_doc(self.labels)


def _document(
    job_id: str,
    name: str | None,
    schedule: dict[str, Any],
    target: dict[str, Any],
    payload: str,
    retry: dict[str, Any],
    paused: bool,
    options: dict[str, Any],
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": job_id,
        "schedule": schedule,
        "target": target,
        "payload": json.loads(payload),
        "retry": retry,
        "paused": paused,
        **{k: v for k, v in options.items() if v is not None},
    }
    if name is not None:
        doc["name"] = name
    return doc


def _labels_doc(labels: dict[str, str]) -> dict[str, Any]:
    return {"labels": labels} if labels else {}


def document_of(spec: JobSpec, job_id: str) -> dict[str, Any]:
    """``spec`` as :meth:`JobRecord.spec_document` shows it once stored (to compare versions)."""
    v = _values(spec, job_id, DEFAULT_NAMESPACE)
    doc = _document(job_id, v["name"], v["schedule"], v["target"], v["payload"], v["retry"], v["paused"], v["options"])
    return doc | _labels_doc(v["labels"])


# (a job's row is read as a JobRecord: the same columns in the same order)
assert tuple(c.name for c in _RETURNING) == JobRecord.__slots__
# What a create reads back: the columns the server sets. The rest of the record is what was sent
# (no trigger changes a job's row), so the JSON columns are not decoded again.
_CREATED = "version, created_at, updated_at, incarnation"
# The jobs quota in the same statement: the namespace's count is read under its row's lock (the
# latest committed value; the statement's trigger adds this job to it before the lock goes), so
# concurrent creates of one namespace cannot pass the quota together. A namespace without a count
# row has nothing to lock: the statement creates nothing and answers one row of NULLs, and the
# create makes the row and sends the statement again (_count_row_made). (Counted as 0 there,
# concurrent first creates each passed: 8 jobs under a quota of 1.)
_CREATE_SQL = f"""
WITH usage AS (
    SELECT jobs FROM namespace_usage WHERE namespace = %(namespace)s FOR UPDATE
), created AS (
    INSERT INTO jobs (id, namespace, name, schedule, target, payload, retry, paused, options, slot, version,
                      change_xid, created_at, updated_at, deleted_at, labels)
    SELECT %(id)s, %(namespace)s, %(name)s, %(schedule)s::jsonb, %(target)s::jsonb, %(payload)s, %(retry)s::jsonb,
            %(paused)s, %(options)s::jsonb, %(slot)s, nextval('jobs_version_seq'),
            pg_current_xact_id()::text::bigint, now(), now(), NULL, %(labels)s::jsonb
    WHERE (SELECT jobs FROM usage) < %(quota)s
    ON CONFLICT (id) DO UPDATE SET
        namespace = EXCLUDED.namespace, name = EXCLUDED.name, schedule = EXCLUDED.schedule,
        target = EXCLUDED.target, payload = EXCLUDED.payload, retry = EXCLUDED.retry, paused = EXCLUDED.paused,
        options = EXCLUDED.options, labels = EXCLUDED.labels, version = EXCLUDED.version,
        change_xid = EXCLUDED.change_xid,
        created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, deleted_at = NULL,
        incarnation = EXCLUDED.incarnation, paused_reason = NULL
    WHERE jobs.deleted_at IS NOT NULL
    RETURNING id, namespace, {_CREATED}
), event AS (
    INSERT INTO job_events (job_id, namespace, action, actor, detail)
    SELECT id, namespace, %(action)s, %(actor)s, %(detail)s::jsonb FROM created
), deps AS (
    DELETE FROM job_dependencies d USING created WHERE d.namespace = created.namespace AND d.downstream = created.id
)
SELECT {_CREATED} FROM created
UNION ALL SELECT NULL, NULL, NULL, NULL WHERE NOT EXISTS (SELECT FROM usage)
"""


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
        "labels": spec.labels,
        "slot": slot_of(job_id),
        "version": _NEXT_VERSION,
        "change_xid": _CURRENT_XID,
        "created_at": _NOW,
        "updated_at": _NOW,
        "deleted_at": None,
    }


def _pausing(paused: bool, actor: Actor) -> dict[str, Any]:
    """What a pause writes (who paused the job, and when) or a resume (no reason left)."""
    reason = paused_by(actor.name, iso(int(time.time() * 1000))) if paused else None
    return {
        "paused": paused,
        "paused_reason": reason,
        "version": _NEXT_VERSION,
        "change_xid": _CURRENT_XID,
        "updated_at": _NOW,
    }


def _live(job_id: str, namespace: str | None) -> ColumnElement[bool]:
    cond = and_(jobs.c.id == job_id, jobs.c.deleted_at.is_(None))
    return cond if namespace is None else and_(cond, jobs.c.namespace == namespace)


def _versions_text(versions: Collection[int]) -> str:
    return " or ".join(str(v) for v in sorted(versions)) or "any version given"


def _get(conn: Connection, job_id: str, namespace: str | None) -> JobRecord:
    row = conn.execute(select(*_RETURNING).where(_live(job_id, namespace))).mappings().first()
    if row is None:
        raise NotFound(f"no job with id {job_id!r}", field="id")
    return JobRecord.from_row(row)


_NO_QUOTA = 2**62


def _live_id(conn: Connection, job_id: str) -> bool:
    return conn.execute(select(jobs.c.id).where(_live(job_id, None))).first() is not None


def _count_row_made(conn: Connection, namespace: str) -> None:
    """The namespace's row of ``namespace_usage``, made (at 0) if it has none: what a create locks
    to check the jobs quota (see _CREATE_SQL). A concurrent maker waits for this one's commit."""
    conn.execute(
        text("INSERT INTO namespace_usage (namespace, jobs) VALUES (:namespace, 0) ON CONFLICT DO NOTHING"),
        {"namespace": namespace},
    )


def _no_count_row(row: Any) -> bool:
    """Whether the create statement answered that the namespace has no count row (see _CREATE_SQL)."""
    return row is not None and row[0] is None


def _usage(conn: Connection, namespace: str) -> int:
    found = conn.execute(select(namespace_usage.c.jobs).where(namespace_usage.c.namespace == namespace)).scalar()
    return int(found or 0)


def _over_quota(namespace: str, usage: int, quota: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"namespace {namespace!r} has {min(usage, quota)} jobs, its quota; delete jobs first "
        "(the quota is CRONMAN_QUOTA_JOBS_PER_NAMESPACE)",
        quota="CRONMAN_QUOTA_JOBS_PER_NAMESPACE",
        field="id",
    )


def _require_throttle(conn: Connection, spec: JobSpec, namespace: str) -> None:
    if spec.throttle is not None and missing_policies(conn, [(namespace, spec.throttle)]):
        raise unknown_throttle(spec.throttle, namespace)


def _landing(conn: Connection, ids: list[str], namespace: str | None) -> dict[str, str]:
    """The namespace each job lands in. Without a namespace (the admin), a job's namespace is that
    of the live job it replaces, else the default."""
    existing: dict[str, str] = {}
    if namespace is None:
        rows = conn.execute(select(jobs.c.id, jobs.c.namespace).where(jobs.c.id.in_(ids), jobs.c.deleted_at.is_(None)))
        existing = {r[0]: r[1] for r in rows}
    return {job_id: namespace or existing.get(job_id, DEFAULT_NAMESPACE) for job_id in ids}


def _unknown_throttles(
    conn: Connection, items: Sequence[tuple[JobSpec, str]], namespace: str | None
) -> dict[int, CronmanError]:
    """The items (by index) naming a throttle policy their namespace lacks."""
    named = [(k, spec.throttle, job_id) for k, (spec, job_id) in enumerate(items) if spec.throttle is not None]
    if not named:
        return {}
    where = _landing(conn, [job_id for _, _, job_id in named], namespace)
    missing = missing_policies(conn, {(where[job_id], name) for _, name, job_id in named})
    return {k: unknown_throttle(name, where[job_id]) for k, name, job_id in named if (where[job_id], name) in missing}


def _unknown_calendars(
    conn: Connection, items: Sequence[tuple[JobSpec, str]], namespace: str | None
) -> dict[int, CronmanError]:
    """The items (by index) naming a calendar their namespace lacks; the calendars found stay
    locked until the write commits, so that a delete cannot slip in between."""
    named = [(k, spec.calendars, job_id) for k, (spec, job_id) in enumerate(items) if spec.calendars]
    if not named:
        return {}
    where = _landing(conn, [job_id for _, _, job_id in named], namespace)
    missing = missing_calendars(conn, {(where[j], n) for _, names, j in named for n in names}, lock=True)
    out: dict[int, CronmanError] = {}
    for k, names, job_id in named:
        gone = [n for n in names if (where[job_id], n) in missing]
        if gone:
            out[k] = unknown_calendar(gone[0], where[job_id])
    return out


def _check_dependencies(
    conn: Connection, items: Sequence[tuple[JobSpec, str]], namespace: str | None, refused: dict[int, CronmanError]
) -> dict[str, list[dependencies.Edge]]:
    """The dependency rows of a batch's items that name upstreams, by job id. Under the lock of each
    namespace they land in, in item order: an item whose edges would close a cycle (with the
    namespace's other jobs or the batch's earlier items) is added to ``refused``."""
    named = {i: e for i, (spec, _) in enumerate(items) if i not in refused and (e := dependencies.edges_of(spec))}
    if not named:
        return {}
    where = _landing(conn, [job_id for i, (_, job_id) in enumerate(items) if i not in refused], namespace)
    graphs: dict[str, dict[str, set[str]]] = {}
    for ns in sorted({where[items[i][1]] for i in named}):
        dependencies.lock(conn, ns)
        graphs[ns] = dependencies.namespace_edges(conn, ns)
    for i, (_, job_id) in enumerate(items):  # the batch's jobs that name none wait for nothing any more
        if i not in refused and i not in named:
            graphs.get(where[job_id], {}).pop(job_id, None)
    out: dict[str, list[dependencies.Edge]] = {}
    for i, edges in named.items():
        job_id = items[i][1]
        graph = graphs[where[job_id]]
        previous = graph.pop(job_id, None)
        try:
            dependencies.check(graph, job_id, edges)
        except InvalidInput as exc:
            refused[i] = exc
            if previous is not None:
                graph[job_id] = previous
            continue
        out[job_id] = edges
    return out


# Create-or-replace of many jobs in one statement: the rows travel as arrays (one bind parameter
# per column, whatever the number of jobs), and each change's job_events row is written by the
# same statement. The namespace rules are those of PUT (see JobStore.put).
_UPSERT_SQL = """
WITH v AS (
    SELECT * FROM unnest(
        CAST(:id AS text[]), CAST(:name AS text[]), CAST(:schedule AS jsonb[]), CAST(:target AS jsonb[]),
        CAST(:payload AS text[]), CAST(:retry AS jsonb[]), CAST(:paused AS boolean[]), CAST(:options AS jsonb[]),
        CAST(:slot AS integer[]), CAST(:labels AS jsonb[])
    ) AS v(id, name, schedule, target, payload, retry, paused, options, slot, labels)
), changed AS (
    INSERT INTO jobs AS jobs (id, namespace, name, schedule, target, payload, retry, paused, options, slot,
        version, change_xid, created_at, updated_at, deleted_at, labels)
    SELECT id, :namespace, name, schedule, target, payload, retry, paused, options, slot,
        nextval('jobs_version_seq'), pg_current_xact_id()::text::bigint, now(), now(), NULL, labels
    FROM v ORDER BY id
    ON CONFLICT (id) DO UPDATE SET
        namespace = {namespace}, name = excluded.name, schedule = excluded.schedule, target = excluded.target,
        payload = excluded.payload, retry = excluded.retry, paused = excluded.paused, options = excluded.options,
        labels = excluded.labels, slot = excluded.slot, version = excluded.version, change_xid = excluded.change_xid,
        created_at = CASE WHEN jobs.deleted_at IS NULL THEN jobs.created_at ELSE now() END,
        updated_at = excluded.updated_at, deleted_at = NULL,
        incarnation = CASE WHEN jobs.deleted_at IS NULL THEN jobs.incarnation ELSE excluded.incarnation END,
        paused_reason = CASE WHEN excluded.paused AND jobs.deleted_at IS NULL THEN jobs.paused_reason END
    {where}
    RETURNING {returning}
), event AS (
    INSERT INTO job_events (job_id, namespace, action, actor, detail)
    SELECT id, namespace, CASE WHEN created_at = updated_at THEN 'create' ELSE 'replace' END,
        :actor, CAST(:detail AS jsonb)
    FROM changed
), deps AS (
    DELETE FROM job_dependencies d USING changed WHERE d.namespace = changed.namespace AND d.downstream = changed.id
)
SELECT {select} FROM changed
"""


def _upsert(namespace: str | None, full: bool) -> TextClause:
    return _upsert_statement(namespace is None, full)


@cache
def _upsert_statement(admin: bool, full: bool) -> TextClause:
    """``admin`` (no namespace): replacing keeps a live job's namespace; otherwise only a job of the
    given namespace (or a deleted one) is replaced. ``full``: return whole rows, not just outcomes."""
    outcomes = ["id", "namespace", "created_at", "updated_at", "version", "paused"]
    names = [c.name for c in _RETURNING] if full else outcomes
    sql = _UPSERT_SQL.format(
        namespace="CASE WHEN jobs.deleted_at IS NULL THEN jobs.namespace ELSE excluded.namespace END"
        if admin
        else "excluded.namespace",
        where="" if admin else "WHERE jobs.namespace = excluded.namespace OR jobs.deleted_at IS NOT NULL",
        returning=", ".join(f"jobs.{n}" for n in names),
        select=", ".join(names) if full else "id, created_at = updated_at AS created, version, paused, namespace",
    )
    return text(sql)


def _upsert_params(
    items: Sequence[tuple[JobSpec, str]], namespace: str | None, actor: Actor, detail: dict[str, Any] | None
) -> dict[str, Any]:
    columns: dict[str, list[Any]] = {k: [] for k in ("id", "name", "schedule", "target", "payload", "retry")}
    columns.update(paused=[], options=[], slot=[], labels=[])
    dumps = json.dumps
    for spec, job_id in items:
        v = _values(spec, job_id, DEFAULT_NAMESPACE)
        columns["id"].append(job_id)
        columns["name"].append(v["name"])
        columns["schedule"].append(dumps(v["schedule"]))
        columns["target"].append(dumps(v["target"]))
        columns["payload"].append(v["payload"])
        columns["retry"].append(dumps(v["retry"]))
        columns["paused"].append(v["paused"])
        columns["options"].append(dumps(v["options"]))
        columns["slot"].append(v["slot"])
        columns["labels"].append(dumps(v["labels"]))
    event_detail = actor.with_detail(detail)
    return {
        **columns,
        "namespace": namespace or DEFAULT_NAMESPACE,
        "actor": actor.name,
        "detail": None if event_detail is None else dumps(event_detail),
    }


def list_statement(
    namespace: str | None, limit: int, after_id: str | None, selector: Selector | None, search: str | None
) -> Select[Any]:
    stmt = select(*_RETURNING).where(jobs.c.deleted_at.is_(None))
    if namespace is not None:
        stmt = stmt.where(jobs.c.namespace == namespace)
    if after_id is not None:
        stmt = stmt.where(jobs.c.id > after_id)
    if selector:
        stmt = stmt.where(selector_clause(selector))
    if search:
        stmt = stmt.where(search_clause(search))
    return stmt.order_by(jobs.c.id).limit(limit)


def selector_clause(selector: Selector) -> ColumnElement[bool]:
    """A label selector as SQL. Equalities travel together as one containment test
    (``labels @> '{"team": "payments", "env": "prod"}'``) that the GIN index on labels answers."""
    labels = jobs.c.labels
    equal: dict[str, str] = {}
    conds: list[ColumnElement[bool]] = []
    for r in selector.requirements:
        if r.op is Op.EQ and r.key not in equal:
            equal[r.key] = r.values[0]
        elif r.op in (Op.EXISTS, Op.NOT_EXISTS):
            has = labels.has_key(r.key)
            conds.append(has if r.op is Op.EXISTS else not_(has))
        else:
            found = or_(*(labels.contains({r.key: v}) for v in r.values))
            conds.append(found if r.op in (Op.EQ, Op.IN) else not_(found))
    if equal:
        conds.insert(0, labels.contains(equal))
    return and_(*conds)


MIN_TRIGRAM_SEARCH = 3


def search_clause(search: str) -> ColumnElement[bool]:
    """The id or the name contains ``search``, ignoring case. From 3 characters on, trigram indexes
    answer it; a shorter text has no trigram to look up, and the index would hand back every row to
    recheck (1.1 s at 1M jobs), so it is tested row by row in id order instead, which stops after a page."""
    if len(search) < MIN_TRIGRAM_SEARCH:
        needle = search.lower()
        return or_(func.strpos(func.lower(jobs.c.id), needle) > 0, func.strpos(func.lower(jobs.c.name), needle) > 0)
    pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return or_(jobs.c.id.ilike(pattern, escape="\\"), jobs.c.name.ilike(pattern, escape="\\"))


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


def _history_cursor(cursor: str) -> tuple[int, int, int, str]:
    """(scheduled ms, event index, attempt, trigger) of the last row of a page; a cursor from before
    history was keyed by trigger has no trigger ("" sorts first: the same rows follow)."""
    try:
        ms, ev, att, trig = decode_cursor(cursor, (int, int, int, str))
    except InvalidInput:
        (ms, ev, att), trig = decode_cursor(cursor, (int, int, int)), ""
    if not (
        MIN_INSTANT_MS <= ms < MAX_INSTANT_MS
        and 0 <= ev < 2**31
        and 0 <= att < 2**31
        and len(trig) <= 200
        and "\x00" not in trig
    ):
        raise InvalidInput("cursor is not one this API returned", field="cursor", code="invalid_cursor")
    return ms, ev, att, trig


def _history_of(record: JobRecord) -> ColumnElement[bool]:
    """The history rows of a job's current incarnation. Rows written before history carried the
    incarnation (NULL) count when they are not older than the incarnation itself."""
    c = scheduled_jobs.c
    return and_(
        c.job_id == record.id,
        or_(
            and_(c.incarnation == record.incarnation, func.coalesce(c.namespace, record.namespace) == record.namespace),
            and_(c.incarnation.is_(None), c.scheduled_for >= record.created_at),
        ),
    )


def _running(conn: Connection, record: JobRecord, limit: int) -> list[ExecutionRecord]:
    """The job's executions whose work (completing later) was accepted and whose end history has not
    recorded yet, newest first: the head of the first page of its executions (one query)."""
    a, c, u = async_runs.c, scheduled_jobs.c, execution_upstreams.c
    ended = (
        select(literal(1))
        .where(
            c.job_id == a.job_id,
            c.scheduled_for == a.scheduled_for,
            c.event_index == a.event_index,
            c.trigger == a.trigger,
            c.attempt >= a.attempt,
        )
        .exists()
    )
    q = (
        select(
            a.job_id,
            a.execution_id,
            a.scheduled_for,
            a.event_index,
            a.attempt,
            a.trigger,
            a.started_at,
            a.deadline_at,
            u.upstream_ids,
        )
        .select_from(async_runs.outerjoin(execution_upstreams, u.execution_id == a.execution_id))
        .where(
            a.namespace == record.namespace,
            a.job_id == record.id,
            a.started_at >= record.created_at,  # (the job's current incarnation)
            not_(ended),
        )
        .order_by(a.scheduled_for.desc(), a.event_index.desc())
        .limit(limit)
    )
    return [
        ExecutionRecord(
            job_id=r.job_id,
            execution_id=r.execution_id,
            scheduled_for=r.scheduled_for,
            event_index=r.event_index,
            attempt=r.attempt,
            trigger=r.trigger,
            status="running",
            node=None,
            fired_at=r.started_at,
            finished_at=None,
            lag_ms=None,
            http_status=None,
            error=None,
            duplicates=0,
            throttle_wait_ms=None,
            dead_lettered=None,
            upstream_execution_ids=r.upstream_ids,
            started_at=r.started_at,
            deadline_at=r.deadline_at,
        )
        for r in conn.execute(q)
    ]


@dataclass(frozen=True, slots=True)
class StoredJob:
    namespace: str
    target: dict[str, Any]
    schedule: dict[str, Any]


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
    response: str | None = None
    occurrences: int | None = None  # a summary row: how many occurrences it stands for
    last_scheduled_for: datetime | None = None
    upstream_execution_ids: list[str] | None = None  # the upstream executions it followed
    started_at: datetime | None = None  # work that completes later, still running: when its attempt was sent
    deadline_at: datetime | None = None  # ... and when it fails unless its work reports


_HISTORY_FIELDS = ExecutionRecord.__slots__[: ExecutionRecord.__slots__.index("upstream_execution_ids")]


class JobStore:
    """Jobs in PostgreSQL. Every change records a ``job_events`` row in the same transaction.

    A store made with :meth:`bound` runs inside the caller's transaction instead of its own (the
    command queue applies a command and records it as applied in one transaction)."""

    def __init__(
        self, engine: Engine, conn: Connection | None = None, *, quota: int | None = None, prepare: bool = False
    ) -> None:
        self.engine = engine
        self._conn = conn
        self.quota = quota  # live jobs per namespace (None: no limit)
        # The single create's statement, prepared per session (settings.database_prepared_statements).
        self._create = Prepared("create", _CREATE_SQL) if prepare else None

    def bound(self, conn: Connection) -> JobStore:
        return JobStore(self.engine, conn, quota=self.quota)

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        if self._conn is not None:
            yield self._conn
        else:
            with self.engine.begin() as conn:
                yield conn

    @contextmanager
    def _single_statement(self) -> Iterator[Connection]:
        """For a change made by one statement: it commits by itself (no COMMIT round trip),
        unless the store is bound to a caller's transaction."""
        if self._conn is not None:
            yield self._conn
        else:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                yield conn

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        if self._conn is not None:
            yield self._conn
        else:
            with self.engine.connect() as conn:
                yield conn

    # -- jobs ------------------------------------------------------------------------------
    def create(self, spec: JobSpec, job_id: str, namespace: str = "default", actor: Actor = NOBODY) -> JobRecord:
        # The busiest write: one prepared SQL text (job and event together), no statement to build.
        v = _values(spec, job_id, namespace)
        params = {
            "id": job_id,
            "namespace": namespace,
            "name": v["name"],
            "schedule": json.dumps(v["schedule"]),
            "target": json.dumps(v["target"]),
            "payload": v["payload"],
            "retry": json.dumps(v["retry"]),
            "paused": v["paused"],
            "options": json.dumps(v["options"]),
            "slot": v["slot"],
            "labels": json.dumps(v["labels"]),
            "action": audit.CREATE,
            "actor": actor.name,
            "detail": None if actor.detail is None else json.dumps(actor.detail),
            "quota": _NO_QUOTA if self.quota is None else self.quota,
        }
        edges = dependencies.edges_of(spec)
        if self._conn is None and not (spec.calendars or edges) and spec.throttle is None:
            # Nothing to check first: the statement alone.
            found = _first_row_alone(self.engine, _CREATE_SQL, params, self._create)
            if _no_count_row(found):  # (a namespace's first create: once)
                with self.engine.begin() as conn:
                    _count_row_made(conn, namespace)
                found = _first_row_alone(self.engine, _CREATE_SQL, params, self._create)
                if _no_count_row(found):  # (the row was taken away meanwhile: the bench's TRUNCATE)
                    raise TransientError(f"namespace {namespace!r} has no job count to check its quota; try again")
            if found is None and self.quota is not None:
                with self._connect() as conn:
                    if not _live_id(conn, job_id):
                        raise _over_quota(namespace, _usage(conn, namespace), self.quota)
        else:
            with self._begin() if spec.calendars or edges else self._single_statement() as conn:
                _require_throttle(conn, spec, namespace)
                refused = _unknown_calendars(conn, [(spec, job_id)], namespace)
                if refused:
                    raise refused[0]
                if edges:
                    dependencies.guard(conn, namespace, job_id, edges)
                row = conn.exec_driver_sql(_CREATE_SQL, params).first()
                if _no_count_row(row):  # (a namespace's first create: its row is made in this transaction)
                    _count_row_made(conn, namespace)
                    row = conn.exec_driver_sql(_CREATE_SQL, params).first()
                    if _no_count_row(row):
                        raise TransientError(f"namespace {namespace!r} has no job count to check its quota; try again")
                if row is None and self.quota is not None and not _live_id(conn, job_id):
                    raise _over_quota(namespace, _usage(conn, namespace), self.quota)
                if row is not None and edges:
                    dependencies.replace(conn, namespace, job_id, edges)
            found = None if row is None else tuple(row)
        if found is None:  # a live job has this id: a tombstoned one would have been revived
            raise Conflict(f"a job with id {job_id!r} already exists", field="id")
        version, created_at, updated_at, incarnation = found
        return JobRecord(
            job_id,
            namespace,
            v["name"],
            v["schedule"],
            v["target"],
            v["payload"],
            v["retry"],
            v["paused"],
            version,
            created_at,
            updated_at,
            v["options"],
            incarnation,
            v["labels"],
        )

    def put(
        self, spec: JobSpec, job_id: str, namespace: str | None = "default", actor: Actor = NOBODY
    ) -> tuple[JobRecord, bool]:
        """Create or replace; returns the record and whether it was created.

        A live job of another namespace is a Conflict. ``namespace=None`` (the admin) replaces a
        live job in its own namespace and creates a new one in the default namespace."""
        with self._begin() as conn:
            refused = _unknown_throttles(conn, [(spec, job_id)], namespace) or _unknown_calendars(
                conn, [(spec, job_id)], namespace
            )
            if refused:
                raise refused[0]
            edges = dependencies.edges_of(spec)
            if edges:
                lands = _landing(conn, [job_id], namespace)[job_id]
                dependencies.guard(conn, lands, job_id, edges)
            row = conn.execute(_upsert(namespace, full=True), _upsert_params([(spec, job_id)], namespace, actor, None))
            found = row.mappings().first()
            if found is None:  # the id belongs to another namespace
                raise Conflict(f"a job with id {job_id!r} already exists", field="id")
            record = JobRecord.from_row(found)
            created = record.created_at == record.updated_at
            if created:
                self._check_quota(conn, record.namespace)
            if edges:  # (the statement dropped the job's rows)
                if record.namespace != lands:  # (not expected: the namespace it was guarded in)
                    dependencies.guard(conn, record.namespace, job_id, edges)
                dependencies.replace(conn, record.namespace, job_id, edges)
        return record, created

    def put_many(
        self,
        items: Sequence[tuple[JobSpec, str]],
        namespace: str | None,
        actor: Actor = NOBODY,
        detail: dict[str, Any] | None = None,
        stops: list[Stop] | None = None,
    ) -> list[bool | CronmanError]:
        """Create or replace many jobs in one statement, with :meth:`put`'s rules for each. Returns,
        item by item, whether it was created (True) or replaced (False), or why it was refused.
        The replaced jobs left paused are added to ``stops`` (for the nodes to stop at once)."""
        outcomes: list[bool | CronmanError] = [False] * len(items)
        refused: dict[int, CronmanError] = {}
        first: dict[str, int] = {}
        for i, (_, job_id) in enumerate(items):
            if job_id in first:
                refused[i] = InvalidInput(
                    f"id {job_id!r} appears earlier in this batch (item {first[job_id]})",
                    field="id",
                    code="duplicate_id",
                )
            else:
                first[job_id] = i
        written: dict[str, bool] = {}
        with self._begin() as conn:
            candidates = [i for i in range(len(items)) if i not in refused]
            wanted = [items[i] for i in candidates]
            unknown = {**_unknown_calendars(conn, wanted, namespace), **_unknown_throttles(conn, wanted, namespace)}
            refused.update({candidates[k]: err for k, err in unknown.items()})
            edges = _check_dependencies(conn, items, namespace, refused)
            rows = [items[i] for i in range(len(items)) if i not in refused]
            if rows:
                params = _upsert_params(rows, namespace, actor, detail)
                result = list(conn.execute(_upsert(namespace, full=False), params))
                written = {r.id: r.created for r in result}
                for r in result:  # (the statement dropped the rows of the jobs it wrote)
                    if r.id in edges:
                        dependencies.replace(conn, r.namespace, r.id, edges[r.id])
                if stops is not None:
                    stops.extend(Stop(r.id, r.version) for r in result if r.paused and not r.created)
                if any(written.values()):  # (an admin's creates go to the default namespace)
                    self._check_quota(conn, namespace or DEFAULT_NAMESPACE)
        for i, (_, job_id) in enumerate(items):
            if i in refused:
                outcomes[i] = refused[i]
            elif job_id in written:
                outcomes[i] = written[job_id]
            else:
                outcomes[i] = Conflict(f"a job with id {job_id!r} already exists", field="id")
        return outcomes

    def _check_quota(self, conn: Connection, namespace: str) -> None:
        """After a write that created jobs, in its transaction: past the quota, it is undone. (The
        write's trigger holds the namespace's count row until commit: writers take turns.)"""
        if self.quota is None:
            return
        usage = _usage(conn, namespace)
        if usage > self.quota:
            raise _over_quota(namespace, usage, self.quota)

    def get(self, job_id: str, namespace: str | None = None) -> JobRecord:
        with self._connect() as conn:
            return _get(conn, job_id, namespace)

    def stored(self, ids: Sequence[str], namespace: str | None) -> dict[str, StoredJob]:
        """The live jobs among ``ids`` as a write needs them (to restore redacted header values,
        to know the namespace a replacement lands in, and whether it changes a once job's time)."""
        if not ids:
            return {}
        cond = and_(jobs.c.id.in_(list(ids)), jobs.c.deleted_at.is_(None))
        if namespace is not None:
            cond = and_(cond, jobs.c.namespace == namespace)
        q = select(jobs.c.id, jobs.c.namespace, jobs.c.target, jobs.c.schedule).where(cond)
        with self._connect() as conn:
            return {r[0]: StoredJob(r[1], r[2], r[3]) for r in conn.execute(q)}

    def list_jobs(
        self,
        namespace: str | None,
        limit: int,
        after_id: str | None,
        *,
        selector: Selector | None = None,
        search: str | None = None,
    ) -> list[JobRecord]:
        """Live jobs in id order after ``after_id``: those ``selector`` selects, whose id or name
        contains ``search`` (case-insensitive)."""
        stmt = list_statement(namespace, limit, after_id, selector, search)
        with self._connect() as conn:
            return [JobRecord.from_row(r) for r in conn.execute(stmt).mappings()]

    def replace_checked(
        self,
        job_id: str,
        namespace: str | None,
        version: int,
        spec: JobSpec,
        actor: Actor = NOBODY,
        detail: dict[str, Any] | None = None,
    ) -> JobRecord:
        """Replace a live job if it is still at ``version`` (optimistic concurrency for PATCH)."""
        values = _values(spec, job_id, namespace or "default")
        for k in ("id", "namespace", "created_at", "deleted_at"):
            values.pop(k)
        if not spec.paused:
            values["paused_reason"] = None
        cond = and_(jobs.c.id == job_id, jobs.c.version == version, jobs.c.deleted_at.is_(None))
        if namespace is not None:
            cond = and_(cond, jobs.c.namespace == namespace)
        stmt = update(jobs).where(cond).values(values).returning(*_RETURNING)
        edges = dependencies.edges_of(spec)
        with self._begin() as conn:
            current = None
            if spec.throttle is not None or spec.calendars or edges:
                current = conn.execute(select(jobs.c.namespace).where(jobs.c.id == job_id)).scalar()
            if spec.throttle is not None or spec.calendars:
                _require_throttle(conn, spec, current or namespace or "default")
                refused = _unknown_calendars(conn, [(spec, job_id)], current or namespace or "default")
                if refused:
                    raise refused[0]
            if edges:
                dependencies.guard(conn, current or namespace or "default", job_id, edges)
            row = conn.execute(audited(stmt, audit.UPDATE, actor, detail)).mappings().first()
            if row is not None:
                if edges and row["namespace"] != (current or namespace or "default"):  # (moved meanwhile)
                    dependencies.guard(conn, row["namespace"], job_id, edges)
                dependencies.replace(conn, row["namespace"], job_id, edges)
        if row is None:
            raise Conflict(
                f"job {job_id!r} changed while it was being updated; try again", field="id", code="concurrent_update"
            )
        return JobRecord.from_row(row)

    def set_paused(self, job_id: str, namespace: str | None, paused: bool, actor: Actor = NOBODY) -> JobRecord:
        """Pause (recording who and when in ``paused_reason``) or resume (clearing it)."""
        stmt = update(jobs).where(_live(job_id, namespace)).values(_pausing(paused, actor)).returning(*_RETURNING)
        with self._begin() as conn:
            row = conn.execute(audited(stmt, audit.PAUSE if paused else audit.RESUME, actor)).mappings().first()
        if row is None:
            raise NotFound(f"no job with id {job_id!r}", field="id")
        return JobRecord.from_row(row)

    def set_paused_many(
        self, ids: Sequence[str], namespace: str | None, paused: bool, actor: Actor = NOBODY
    ) -> list[tuple[str, int]]:
        """Pause (or resume) the live jobs among ``ids`` in ``namespace`` that are not so already, as
        :meth:`set_paused` does each, in one statement that also records a job event for each
        (marked bulk); returns the ids changed, each with its new version, in id order."""
        if not ids:
            return []
        cond = and_(jobs.c.id.in_(list(ids)), jobs.c.deleted_at.is_(None), jobs.c.paused.is_(not paused))
        if namespace is not None:
            cond = and_(cond, jobs.c.namespace == namespace)
        stmt = (
            update(jobs)
            .where(cond)
            .values(_pausing(paused, actor))
            .returning(jobs.c.id, jobs.c.namespace, jobs.c.version)
        )
        action = audit.PAUSE if paused else audit.RESUME
        with self._begin() as conn:
            changed = conn.execute(audited(stmt, action, actor, {"bulk": True}))
            return sorted((r.id, int(r.version)) for r in changed)

    def delete(
        self, job_id: str, namespace: str | None, actor: Actor = NOBODY, *, versions: Collection[int] | None = None
    ) -> int:
        """Delete a live job; returns the version of the deletion. With ``versions``, only while its
        version is one of them (PreconditionFailed when it has changed since)."""
        cond = _live(job_id, namespace)
        if versions is not None:
            cond = and_(cond, jobs.c.version.in_(list(versions)))
        stmt = (
            update(jobs)
            .where(cond)
            .values(deleted_at=_NOW, version=_NEXT_VERSION, change_xid=_CURRENT_XID, updated_at=_NOW)
            .returning(jobs.c.id, jobs.c.namespace, jobs.c.version)
        )
        with self._begin() as conn:
            row = conn.execute(audited(stmt, audit.DELETE, actor)).first()
            if row is not None:
                dependencies.drop(conn, row.namespace, row.id)
                return int(row.version)
            current = _get(conn, job_id, namespace)  # NotFound when there is no such job
        raise PreconditionFailed(
            f"job {job_id!r} is at version {current.version}, not {_versions_text(versions or ())}: "
            "it changed since it was read",
            field="version",
            code="version_mismatch",
        )

    def add_trigger(self, job_id: str, namespace: str | None, requested_by: str | None, actor: Actor = NOBODY) -> int:
        """Ask the owners of a job to fire it once now; returns the requested time (epoch ms)."""
        with self._begin() as conn:
            record = _get(conn, job_id, namespace)
            stmt = (
                job_triggers.insert()
                .values(
                    job_id=record.id,
                    requested_by=requested_by,
                    change_xid=_CURRENT_XID,
                    incarnation=record.incarnation,
                    namespace=record.namespace,
                )
                .returning(job_triggers.c.requested_at)
            )
            requested = to_ms(conn.execute(stmt).scalar_one())
            detail = {
                "execution_id": execution_id(record.id, requested, 0, Trigger.MANUAL),
                "scheduled_for": iso(requested),
            }
            audit.record(conn, record.id, record.namespace, audit.TRIGGER, actor, detail)
        return requested

    def add_redelivery(
        self, job_id: str, namespace: str | None, exec_id: str, requested_by: str | None, actor: Actor = NOBODY
    ) -> tuple[int, int]:
        """Ask the owners of a job to send a failed execution again, as its next attempt under the
        same execution id; returns (scheduled_for ms, the new attempt number)."""
        try:
            exec_id = str(uuid.UUID(exec_id))
        except ValueError:
            raise NotFound(f"job {job_id!r} has no execution {exec_id!r}", field="execution_id") from None
        c = scheduled_jobs.c
        with self._begin() as conn:
            record = _get(conn, job_id, namespace)
            last = conn.execute(
                select(c.scheduled_for, c.event_index, c.attempt, c.trigger, c.status)
                .where(_history_of(record), c.execution_id == exec_id)
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
                    incarnation=record.incarnation,
                    namespace=record.namespace,
                )
            )
            detail = {"execution_id": exec_id, "attempt": last.attempt + 1}
            audit.record(conn, record.id, record.namespace, audit.REDELIVER, actor, detail)
        return to_ms(last.scheduled_for), last.attempt + 1

    def events(
        self, job_id: str, namespace: str | None, limit: int, cursor: str | None
    ) -> tuple[list[audit.JobEvent], str | None]:
        """A job's events, newest first. Events outlive the job (a delete is an event too); a job id
        with neither events nor a live job in ``namespace`` is NotFound."""
        before = decode_cursor(cursor, (int,))[0] if cursor else None
        if before is not None and not 0 < before < 2**63:
            raise InvalidInput("cursor is not one this API returned", field="cursor", code="invalid_cursor")
        with self._connect() as conn:
            rows = audit.list_events(conn, job_id, namespace, limit + 1, before)
            if not rows and before is None:
                _get(conn, job_id, namespace)
        next_cursor = encode_cursor([rows[limit - 1].id]) if len(rows) > limit else None
        return rows[:limit], next_cursor

    # -- history ---------------------------------------------------------------------------
    def executions(
        self, job_id: str, namespace: str | None, limit: int, cursor: str | None
    ) -> tuple[list[ExecutionRecord], str | None]:
        """The history of the live job ``job_id`` (visible in ``namespace``; None: any), newest
        first: its current incarnation's only, so an id created again starts with an empty history."""
        c = scheduled_jobs.c
        u = execution_upstreams.c
        q = select(*(getattr(c, f) for f in _HISTORY_FIELDS), u.upstream_ids.label("upstream_execution_ids"))
        q = q.select_from(scheduled_jobs.outerjoin(execution_upstreams, u.execution_id == c.execution_id))
        if cursor:
            ms, ev, att, trig = _history_cursor(cursor)
            q = q.where(
                tuple_(c.scheduled_for, c.event_index, c.attempt, c.trigger)
                < tuple_(literal(from_ms(ms)), literal(ev), literal(att), literal(trig))
            )
        q = q.order_by(c.scheduled_for.desc(), c.event_index.desc(), c.attempt.desc(), c.trigger.desc())
        q = q.limit(limit + 1)
        with self._connect() as conn:
            record = _get(conn, job_id, namespace)
            rows = [ExecutionRecord(**r) for r in conn.execute(q.where(_history_of(record))).mappings()]
            running = [] if cursor else _running(conn, record, limit)
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            last = rows[-1]
            next_cursor = encode_cursor([to_ms(last.scheduled_for), last.event_index, last.attempt, last.trigger])
        return running + rows, next_cursor

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
