"""What the dashboard reads and the one change it makes in bulk, as SQL (no Flask here).

Every function takes the caller's namespace (None: the admin, every namespace) and applies it, so a
namespace key never reads another namespace's jobs, history or failures.

Scale. Lists are keyset-paginated on indexed columns: jobs by ``(namespace, id)``, history by the
primary key of ``scheduled_jobs``, failures by ``scheduled_for`` among failed rows. Two things are not
stored and are computed per request instead: a job's next fire time (from its schedule) and its last
result (one index probe per job shown). So a page in id order costs the same at any size, while
sorting by next fire or last result sorts the first :data:`SORT_LIMIT` matching jobs (the page says
so when more match), and a state decided in Python (active, completed, failing) examines at most
:data:`MAX_SCAN` jobs per page.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    any_,
    bindparam,
    exists,
    func,
    literal,
    not_,
    or_,
    select,
    text,
    tuple_,
)
from sqlalchemy.types import Text

from cronman.errors import InvalidInput
from cronman.model.labels import Selector
from cronman.model.schedule import timing_from_dict
from cronman.model.spec import MAX_JITTER_SECONDS
from cronman.model.timeutil import from_ms, to_ms
from cronman.store.db import jobs, scheduled_jobs
from cronman.store.health import Health, health_of
from cronman.store.store import (
    decode_cursor,
    encode_cursor,
    search_clause,
    selector_clause,
)

FAILED = ("failed", "permanently_failed")
FAILING_LOOKBACK = timedelta(days=7)  # "failing" looks for failed attempts this recent ...
MAX_FAILED_READ = 50_000  # ... reading at most this many of a namespace's, newest first ...
MIN_FAILED_SHARE = 500  # ... or, across namespaces (the admin), an equal share each, at least this many
MAX_FAILED_NAMESPACES = MAX_FAILED_READ // MIN_FAILED_SHARE  # ... of at most this many namespaces
MAX_SCAN = 5000  # jobs examined for one page when a state is decided in Python
SORT_LIMIT = 1000  # matching jobs sorted by next fire or last result in one request
MAX_JITTER_MS = MAX_JITTER_SECONDS * 1000  # the largest jitter a schedule may have
_BATCH = 500


class State(enum.StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    FAILING = "failing"
    COMPLETED = "completed"


class Sort(enum.StrEnum):
    ID = "id"
    NEXT_FIRE = "next"
    LAST_RESULT = "result"


@dataclass(frozen=True, slots=True)
class LastResult:
    status: str
    scheduled_for: datetime
    attempt: int
    http_status: int | None
    error: str | None

    @property
    def failed(self) -> bool:
        return self.status in FAILED


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    namespace: str
    name: str | None
    schedule: dict[str, Any]
    paused: bool
    updated_at: datetime
    incarnation: int
    labels: dict[str, str]
    next_fire_ms: int | None = None
    last: LastResult | None = None

    @property
    def state(self) -> State:
        """Exclusive, in this order: paused, failing (its latest execution failed), completed
        (nothing left to fire), active."""
        if self.paused:
            return State.PAUSED
        if self.last is not None and self.last.failed:
            return State.FAILING
        if self.completed:
            return State.COMPLETED
        return State.ACTIVE

    @property
    def completed(self) -> bool:
        """Nothing left to fire: an ``after`` job has no times of its own, and is never over."""
        return self.next_fire_ms is None and self.schedule.get("type") != "after"


@dataclass(frozen=True, slots=True)
class JobQuery:
    namespace: str | None
    q: str = ""
    state: State | None = None
    sort: Sort = Sort.ID
    limit: int = 50
    cursor: str | None = None
    selector: Selector | None = None  # labels


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: list[JobRow]
    next_cursor: str | None
    scanned: int  # jobs examined
    partial: bool  # the scan budget ran out before the page was full: more may match further on
    sorted_among: int | None  # sorted modes: how many jobs were sorted (SORT_LIMIT when capped)
    capped: bool  # sorted modes: more jobs matched than were sorted
    failures_capped: bool = False  # state=failing: a namespace's newest failed attempts were read, not all


EMPTY_PAGE = JobPage([], None, 0, False, None, False)

_JOB_COLUMNS = (
    jobs.c.id,
    jobs.c.namespace,
    jobs.c.name,
    jobs.c.schedule,
    jobs.c.paused,
    jobs.c.updated_at,
    jobs.c.incarnation,
    jobs.c.labels,
)


def _schedule_instant(name: str) -> ColumnElement[Any]:
    return func.cast(jobs.c.schedule[name].astext, type_=jobs.c.created_at.type)


def _ended_before(at: datetime) -> ColumnElement[bool]:
    """Jobs whose every occurrence lies before ``at`` by their schedule's own bounds (a ``once``
    instant or an ``end_at``): candidates for "completed", confirmed in Python."""
    once = and_(jobs.c.schedule["type"].astext == "once", _schedule_instant("at") < at)
    ended = and_(jobs.c.schedule.has_key("end_at"), _schedule_instant("end_at") < at)
    return or_(once, ended)


# The namespaces with failed attempts, in order, one index probe each (a loose index scan).
_FAILED_NAMESPACES = text(
    """
WITH RECURSIVE ns(n) AS (
    SELECT min(namespace) FROM scheduled_jobs WHERE status IN ('failed', 'permanently_failed')
  UNION ALL
    SELECT (
        SELECT min(namespace) FROM scheduled_jobs
        WHERE status IN ('failed', 'permanently_failed') AND namespace > ns.n
    )
    FROM ns WHERE ns.n IS NOT NULL
)
SELECT n FROM ns WHERE n IS NOT NULL LIMIT :limit
"""
)

# The jobs of the newest failed attempts of each namespace, at most :share attempts each.
_FAILED_JOBS = text(
    """
SELECT n.ns, f.job_id
FROM unnest(CAST(:namespaces AS text[])) AS n(ns)
CROSS JOIN LATERAL (
    SELECT s.job_id FROM scheduled_jobs s
    WHERE s.namespace = n.ns AND s.status IN ('failed', 'permanently_failed') AND s.scheduled_for >= :since
    ORDER BY s.scheduled_for DESC
    LIMIT :share
) AS f
"""
)


def recently_failed(conn: Connection, now: datetime, namespace: str | None = None) -> tuple[list[str], bool]:
    """The jobs of ``namespace`` (None: every namespace) with a failed attempt in the last
    FAILING_LOOKBACK, and whether a limit was reached. A namespace's newest MAX_FAILED_READ failed
    attempts are read (by the partial index on failed rows per namespace); across namespaces each
    gets an equal share of that (at least MIN_FAILED_SHARE, of at most MAX_FAILED_NAMESPACES), so
    one namespace's flood of failures hides no other namespace's."""
    if namespace is not None:
        namespaces = [namespace]
    else:
        namespaces = list(conn.execute(_FAILED_NAMESPACES, {"limit": MAX_FAILED_NAMESPACES + 1}).scalars())
    capped = len(namespaces) > MAX_FAILED_NAMESPACES
    namespaces = namespaces[:MAX_FAILED_NAMESPACES]
    if not namespaces:
        return [], False
    share = max(MIN_FAILED_SHARE, MAX_FAILED_READ // len(namespaces))
    args = {"namespaces": namespaces, "since": now - FAILING_LOOKBACK, "share": share}
    read: dict[str, int] = {}
    ids: set[str] = set()
    for ns, job_id in conn.execute(_FAILED_JOBS, args):
        read[ns] = read.get(ns, 0) + 1
        ids.add(job_id)
    return sorted(ids), capped or any(n >= share for n in read.values())


def _state_condition(state: State | None, now: datetime, failed: list[str]) -> ColumnElement[bool] | None:
    """A superset of the jobs in ``state``, in SQL; :meth:`JobRow.state` decides exactly."""
    if state is None:
        return None
    if state is State.PAUSED:
        return jobs.c.paused
    if state is State.FAILING:  # primary-key look-ups of the jobs that failed lately
        return and_(not_(jobs.c.paused), jobs.c.id == any_(bindparam("failed_ids", failed, type_=ARRAY(Text))))
    if state is State.COMPLETED:
        return and_(not_(jobs.c.paused), _ended_before(now))
    # active: not paused, and not surely over (a jittered occurrence may still be due)
    return and_(not_(jobs.c.paused), not_(_ended_before(now - timedelta(milliseconds=MAX_JITTER_MS))))


def _filtered(query: JobQuery, now: datetime, failed: list[str]) -> Select[Any]:
    stmt = select(*_JOB_COLUMNS).where(jobs.c.deleted_at.is_(None))
    if query.namespace is not None:
        stmt = stmt.where(jobs.c.namespace == query.namespace)
    if query.q:
        stmt = stmt.where(search_clause(query.q))
    if query.selector:
        stmt = stmt.where(selector_clause(query.selector))
    cond = _state_condition(query.state, now, failed)
    if cond is not None:
        stmt = stmt.where(cond)
    return stmt


_LAST_RESULTS = text(
    """
SELECT j.id, h.status, h.scheduled_for, h.attempt, h.http_status, h.error
FROM unnest(CAST(:ids AS text[]), CAST(:incarnations AS bigint[])) AS j(id, incarnation)
CROSS JOIN LATERAL (
    SELECT s.status, s.scheduled_for, s.attempt, s.http_status, s.error
    FROM scheduled_jobs s
    WHERE s.job_id = j.id AND (s.incarnation IS NULL OR s.incarnation = j.incarnation)
    ORDER BY s.scheduled_for DESC, s.event_index DESC, s.attempt DESC
    LIMIT 1
) h
"""
)


def last_results(conn: Connection, rows: Sequence[JobRow]) -> dict[str, LastResult]:
    """Each job's latest attempt (of its latest occurrence): one index probe per job."""
    if not rows:
        return {}
    found = conn.execute(_LAST_RESULTS, {"ids": [r.id for r in rows], "incarnations": [r.incarnation for r in rows]})
    return {r.id: LastResult(r.status, r.scheduled_for, r.attempt, r.http_status, r.error) for r in found}


def _complete(conn: Connection, raw: Sequence[Any], now_ms: int) -> list[JobRow]:
    rows = []
    for r in raw:
        nxt = None if r.paused else timing_from_dict(r.schedule, r.id, r.namespace).next_after(now_ms)
        rows.append(JobRow(r.id, r.namespace, r.name, r.schedule, r.paused, r.updated_at, r.incarnation, r.labels, nxt))
    last = last_results(conn, rows)
    return [replace(r, last=last.get(r.id)) for r in rows]


def list_jobs(engine: Engine, query: JobQuery, now_ms: int) -> JobPage:
    with engine.connect() as conn:
        failed, capped = (
            recently_failed(conn, from_ms(now_ms), query.namespace) if query.state is State.FAILING else ([], False)
        )
        base = _filtered(query, from_ms(now_ms), failed)
        page = _by_id(conn, base, query, now_ms) if query.sort is Sort.ID else _sorted(conn, base, query, now_ms)
    return replace(page, failures_capped=capped)


def _by_id(conn: Connection, base: Select[Any], query: JobQuery, now_ms: int) -> JobPage:
    after = decode_cursor(query.cursor, (str,))[0] if query.cursor else None
    base = base.order_by(jobs.c.id)
    if query.state in (None, State.PAUSED):  # the SQL is exact: one page, one query
        stmt = base if after is None else base.where(jobs.c.id > after)
        raw = conn.execute(stmt.limit(query.limit + 1)).all()
        rows = _complete(conn, raw[: query.limit], now_ms)
        more = len(raw) > query.limit
        return JobPage(rows, encode_cursor([rows[-1].id]) if more else None, len(raw), False, None, False)
    out: list[JobRow] = []
    scanned = 0
    while True:  # the state is decided in Python: examine batches until the page is full
        want = min(_BATCH, MAX_SCAN - scanned)
        stmt = base if after is None else base.where(jobs.c.id > after)
        raw = conn.execute(stmt.limit(want)).all()
        scanned += len(raw)
        for row in _complete(conn, raw, now_ms):
            after = row.id
            if row.state is query.state:
                out.append(row)
                if len(out) == query.limit:
                    return JobPage(out, encode_cursor([after]), scanned, False, None, False)
        if len(raw) < want:  # the end of the matching jobs
            return JobPage(out, None, scanned, False, None, False)
        if scanned >= MAX_SCAN:
            return JobPage(out, encode_cursor([after]), scanned, True, None, False)


_NONE_LAST = 2**62
_RESULT_RANK = {"permanently_failed": 0, "failed": 1, "skipped": 2, "succeeded": 3}


def _sort_key(sort: Sort, row: JobRow) -> list[Any]:
    if sort is Sort.NEXT_FIRE:
        return [_NONE_LAST if row.next_fire_ms is None else row.next_fire_ms, row.id]
    if row.last is None:
        return [len(_RESULT_RANK) + 1, 0, row.id]
    rank = _RESULT_RANK.get(row.last.status, len(_RESULT_RANK))
    return [rank, -to_ms(row.last.scheduled_for), row.id]


def _sorted(conn: Connection, base: Select[Any], query: JobQuery, now_ms: int) -> JobPage:
    shape: tuple[type, ...] = (int, str) if query.sort is Sort.NEXT_FIRE else (int, int, str)
    after = decode_cursor(query.cursor, shape) if query.cursor else None
    raw = conn.execute(base.order_by(jobs.c.id).limit(SORT_LIMIT + 1)).all()
    capped = len(raw) > SORT_LIMIT
    rows = _complete(conn, raw[:SORT_LIMIT], now_ms)
    if query.state not in (None, State.PAUSED):
        rows = [r for r in rows if r.state is query.state]
    keyed = sorted(((_sort_key(query.sort, r), r) for r in rows), key=lambda kr: kr[0])
    if after is not None:
        keyed = [kr for kr in keyed if kr[0] > after]
    page = keyed[: query.limit]
    more = len(keyed) > query.limit
    return JobPage(
        [r for _, r in page],
        encode_cursor(page[-1][0]) if more else None,
        min(len(raw), SORT_LIMIT),
        False,
        min(len(raw), SORT_LIMIT),
        capped,
    )


# -- one job's history ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
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
    dead_lettered: bool | None
    response: str | None = None


@dataclass(frozen=True, slots=True)
class Execution:
    """The attempts of one execution (one occurrence and event), newest attempt first."""

    attempts: tuple[Attempt, ...]

    @property
    def latest(self) -> Attempt:
        return self.attempts[0]

    @property
    def first(self) -> Attempt:
        return self.attempts[-1]

    @property
    def status(self) -> str:
        return "dead_lettered" if self.latest.dead_lettered else self.latest.status

    @property
    def redeliverable(self) -> bool:
        return self.latest.status in FAILED


def _attempt_columns() -> tuple[Any, ...]:
    s = scheduled_jobs.c
    return (
        s.execution_id,
        s.scheduled_for,
        s.event_index,
        s.attempt,
        s.trigger,
        s.status,
        s.node,
        s.fired_at,
        s.finished_at,
        s.lag_ms,
        s.http_status,
        s.error,
        s.duplicates,
        s.dead_lettered,
        s.response,
    )


def history(engine: Engine, job: JobRow, limit: int) -> list[Execution]:
    """The latest ``limit`` attempts of a job's current incarnation, grouped by execution."""
    s = scheduled_jobs.c
    cond = and_(
        s.job_id == job.id,
        or_(s.incarnation.is_(None), s.incarnation == job.incarnation),
        or_(s.namespace.is_(None), s.namespace == job.namespace),
    )
    stmt = (
        select(*_attempt_columns())
        .where(cond)
        .order_by(s.scheduled_for.desc(), s.event_index.desc(), s.attempt.desc())
        .limit(limit)
    )
    with engine.connect() as conn:
        attempts = [Attempt(**r) for r in conn.execute(stmt).mappings()]
    return group_attempts(attempts)


def group_attempts(attempts: Sequence[Attempt]) -> list[Execution]:
    """Consecutive attempts (newest first) of one execution id, together."""
    groups: list[list[Attempt]] = []
    for a in attempts:
        if groups and groups[-1][0].execution_id == a.execution_id:
            groups[-1].append(a)
        else:
            groups.append([a])
    return [Execution(tuple(g)) for g in groups]


def health_states(engine: Engine, rows: Sequence[JobRow]) -> dict[str, Health]:
    """The health rows of the jobs shown (one query by key)."""
    with engine.connect() as conn:
        return health_of(conn, [(r.id, r.incarnation) for r in rows])


def get_job(engine: Engine, job_id: str, namespace: str | None) -> JobRow | None:
    cond = and_(jobs.c.id == job_id, jobs.c.deleted_at.is_(None))
    if namespace is not None:
        cond = and_(cond, jobs.c.namespace == namespace)
    with engine.connect() as conn:
        r = conn.execute(select(*_JOB_COLUMNS).where(cond)).first()
    if r is None:
        return None
    return JobRow(r.id, r.namespace, r.name, r.schedule, r.paused, r.updated_at, r.incarnation, r.labels)


# -- failures across jobs ------------------------------------------------------------------------


class FailureKind(enum.StrEnum):
    ANY = "any"
    FAILED = "failed"  # the latest attempt failed; a retry may follow
    PERMANENTLY_FAILED = "permanently_failed"  # no attempt left
    DEAD_LETTERED = "dead_lettered"  # given up and sent to the job's dead-letter queue


@dataclass(frozen=True, slots=True)
class Failure:
    job_id: str
    namespace: str
    name: str | None
    attempt: Attempt


def failures(
    engine: Engine, namespace: str | None, since: datetime, kind: FailureKind, limit: int, cursor: str | None
) -> tuple[list[Failure], str | None]:
    """Executions whose latest attempt failed, newest first, among live jobs of ``namespace``."""
    s = scheduled_jobs.alias("s")
    later = scheduled_jobs.alias("later")
    newer_attempt = exists().where(
        later.c.job_id == s.c.job_id,
        later.c.scheduled_for == s.c.scheduled_for,
        later.c.event_index == s.c.event_index,
        later.c.trigger == s.c.trigger,
        later.c.attempt > s.c.attempt,
    )
    on = and_(
        jobs.c.id == s.c.job_id,
        jobs.c.deleted_at.is_(None),
        or_(s.c.incarnation.is_(None), s.c.incarnation == jobs.c.incarnation),
    )
    cond = and_(s.c.status.in_(FAILED), s.c.scheduled_for >= since, not_(newer_attempt))
    if namespace is not None:  # the history row's own namespace too: its index reads only these
        cond = and_(cond, jobs.c.namespace == namespace, s.c.namespace == namespace)
    if kind is FailureKind.DEAD_LETTERED:
        cond = and_(cond, s.c.dead_lettered.is_(True))
    elif kind is not FailureKind.ANY:
        cond = and_(cond, s.c.status == kind.value)
    key = (s.c.scheduled_for, s.c.job_id, s.c.event_index, s.c.attempt)
    if cursor:
        ms, job_id, ev, att = decode_cursor(cursor, (int, str, int, int))
        try:
            at = from_ms(ms)
        except (OverflowError, ValueError):
            raise InvalidInput("cursor is not one this page made", field="cursor", code="invalid_cursor") from None
        cond = and_(cond, tuple_(*key) < tuple_(literal(at), literal(job_id), literal(ev), literal(att)))
    columns = [getattr(s.c, c.name) for c in _attempt_columns()]
    stmt = (
        select(s.c.job_id, jobs.c.namespace, jobs.c.name, *columns)
        .select_from(s.join(jobs, on))
        .where(cond)
        .order_by(*(k.desc() for k in key))
        .limit(limit + 1)
    )
    with engine.connect() as conn:
        found = conn.execute(stmt).mappings().all()
    out = [
        Failure(r["job_id"], r["namespace"], r["name"], Attempt(**{c.name: r[c.name] for c in _attempt_columns()}))
        for r in found[:limit]
    ]
    next_cursor = None
    if len(found) > limit:
        last = out[-1]
        a = last.attempt
        next_cursor = encode_cursor([to_ms(a.scheduled_for), last.job_id, a.event_index, a.attempt])
    return out, next_cursor


__all__ = [
    "FAILED",
    "Attempt",
    "Execution",
    "Failure",
    "FailureKind",
    "JobPage",
    "JobQuery",
    "JobRow",
    "LastResult",
    "Sort",
    "State",
    "failures",
    "get_job",
    "group_attempts",
    "history",
    "list_jobs",
]
