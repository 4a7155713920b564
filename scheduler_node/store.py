"""What a node reads from and writes to PostgreSQL: the jobs of the slots it owns, the change feed,
manual triggers and redeliveries, history, throttle policies and signing secrets, and how far the
cluster has fired (per node, per slot) and when it was down altogether.

Jobs and the feed are read in one REPEATABLE READ snapshot together with that snapshot's xmin.
Every transaction whose changes the snapshot could not see has an id >= xmin, so polling
``change_xid >= xmin`` next time cannot skip a transaction that committed late. Rows seen twice
are told apart by version.

:class:`NodeStore` is the interface the node uses; :class:`PgNodeStore` runs each call's blocking
SQL in the node's thread pool. The simulation has its own implementation in memory.

Past one database, jobs and history are split by slot range (:mod:`cronman.routing`): every call
here that names slots (or jobs, whose slot is fixed) goes to the databases ``SlotRanges.split``
names, and the feed keeps a cursor per database (``FeedCursors``); see docs/scaling.md.
"""

from __future__ import annotations

import abc
import asyncio
import gc
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import psycopg2
import sqlalchemy.exc
from psycopg2 import errors as pg_errors
from sqlalchemy import Engine, text

from cronman.calendars import Calendar, calendar_from_stored
from cronman.changes import Stop
from cronman.errors import TransientError
from cronman.misfire import REASON_PREFIX as MISFIRE_REASON
from cronman.partitions import day_of_ms, ensure_partitions
from cronman.pgarray import array_columns, array_literal
from cronman.spec import MAX_TIMEOUT_SECONDS, RETRY_DEFAULTS
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import JOB_COLUMNS, Decoder, JobRow, Loaded
from scheduler_node.outcomes import record_outcomes

log = logging.getLogger("cronman.node.store")

_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
_MS = "floor(extract(epoch from {}) * 1000)::bigint"
T = TypeVar("T")

Ident = tuple[str, int, int, str]  # (job id, scheduled ms, event index, trigger)


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
    incarnation: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Small tables every node keeps whole: throttle policies, signing secrets and calendars."""

    throttles: dict[tuple[str, str], tuple[int, float | None]]
    secrets: dict[str, tuple[str, ...]]  # newest first; the previous one for a day after a rotation
    calendars: dict[tuple[str, str], Calendar] = field(default_factory=dict)  # (namespace, name)


@dataclass(frozen=True, slots=True)
class BackfillRow:
    """A backfill as a node drives it (see scheduler_node.backfill)."""

    id: str
    job_id: str
    incarnation: int
    from_ms: int
    to_ms: int
    rate: float  # executions per second
    events: int
    timing: str  # JSON: {"schedule": ..., "calendars": [[name, document], ...]} (cronman.backfills); "" unless running
    state: str  # running or cancelled
    cursor_ms: int | None  # every occurrence up to here is claimed
    dispatched: int
    live_incarnation: int | None  # the job's incarnation, while it is live
    namespace: str = "default"


@dataclass(frozen=True, slots=True)
class Attempts:
    """What history says of an execution: its highest attempt and whether it ended."""

    last_attempt: int
    final: bool
    # ended only by a misfire plan's skip: a row recorded for an occurrence nobody claimed, which
    # does not end it if a node did claim it after all (seed 79428). A skip its claim's holder
    # decided (an overlap, a calendar) ends it like a success (seed 8204482).
    only_skipped: bool = False


def ends(status: str, error: str | None) -> bool:
    """Whether a history row ends its execution whoever holds its claim: a final one, but for a
    misfire plan's skip (see :class:`Attempts`)."""
    if status == "skipped":
        return not (error or "").startswith(MISFIRE_REASON)
    return status in ("succeeded", "permanently_failed", "cancelled")


class SlotMarks(NamedTuple):
    """How far the slots were fired, from every node's recorded progress."""

    claimed: dict[int, int]  # slot -> every occurrence up to here was claimed (a node resumes here)
    cluster: int | None  # how far any node fired at all (outages are judged by it); None: never
    # slot -> how far it was fired, claims lost with Redis's data or not (the watchdog's view):
    # past `claimed` only after such a loss, and what lies between may have been delivered
    fired: dict[int, int]


def slot_marks_of(rows: Iterable[tuple[int, int, bytes]]) -> SlotMarks:
    """From progress rows (claimed through, fired through, bitmap of slots): each slot's furthest."""
    rows = list(rows)
    claimed: dict[int, int] = {}
    fired: dict[int, int] = {}
    for ms, _, slots in sorted(rows, key=lambda r: r[0]):  # later rows overwrite
        for s in bitmap_slots(slots):
            claimed[s] = ms
    for _, ms, slots in sorted(rows, key=lambda r: r[1]):
        for s in bitmap_slots(slots):
            fired[s] = ms
    return SlotMarks(claimed, max((r[1] for r in rows), default=None), fired)


class NodeStore(abc.ABC):
    # Jobs read by this store's loads so far: a loading node's heartbeat shows it, and the other
    # nodes count it as loading while it moves (scheduler_node.node: ownership).
    rows_loaded: int = 0

    @abc.abstractmethod
    async def load_slots(self, slots: Sequence[int], decoder: Decoder) -> tuple[int, Loaded]:
        """Every live job of ``slots`` as (job, updated ms), and the cursor to poll changes from."""

    def abandon_loads(self) -> None:  # noqa: B027 - a store whose loads are quick needs nothing
        """The node stops: a load in progress ends early (its result is not used)."""

    @abc.abstractmethod
    async def poll_changes(
        self, cursor: int, slots: Collection[int] | None = None
    ) -> tuple[int, list[JobRow], list[TriggerRow]]:
        """Jobs changed and triggers requested since ``cursor`` (of ``slots`` only, when given),
        and the cursor to poll from next."""

    @abc.abstractmethod
    async def recent_triggers(self, slots: Sequence[int], since_ms: int) -> list[TriggerRow]:
        """Triggers and redeliveries of jobs in ``slots`` requested since then."""

    @abc.abstractmethod
    async def attempts(self, idents: Sequence[Ident]) -> dict[Ident, Attempts]: ...

    @abc.abstractmethod
    async def live_incarnations(self, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """The live incarnation of each job and when it was created (ms); none for a deleted job."""

    @abc.abstractmethod
    async def cluster_config(self) -> ClusterConfig: ...

    @abc.abstractmethod
    async def save_progress(
        self,
        node_id: str,
        incarnation: str,
        fired_through_ms: int,
        slots: bytes,
        epoch: str | None,
        firing_ms: int | None = None,
    ) -> None:
        """This node has claimed every occurrence of ``slots`` through ``fired_through_ms``, in the
        Redis data of ``epoch``. Progress only grows within an epoch; claimed in an epoch recorded
        lost, it counts up to where the loss left it (see :meth:`lose_epoch`). ``firing_ms`` (by
        default the same) is how far its timer ran, whatever late work it still owes and whether
        its claims reached Redis: the cluster was running through there (``SlotMarks.cluster``)."""

    @abc.abstractmethod
    async def lose_epoch(
        self,
        epoch: str,
        current: str,
        since_ms: int,
        node_id: str,
        reach_ms: int | None = None,
        live: Collection[str] = (),
    ) -> int:
        """Redis lost the data of ``epoch`` (its claims, done marks, unwritten rows), noticed when
        it answered with ``current``: progress claimed in any other epoch than ``current`` speaks
        for occurrences up to a point only, now and when saved later, and how far the cluster
        fired stays as it was. The point is ``since_ms``, or earlier: the least progress recorded
        in ``epoch`` after ``reach_ms`` by an incarnation not in ``live`` (a node gone since, whose
        claims made after its last record may have been lost before anyone took them over), and
        not before ``reach_ms``; and no later than the point of another loss recorded after
        ``reach_ms`` (not before it either): the data lost held the claims made again after that
        loss, which nodes gone since may have held unresolved (seed 7602338: a fire_once outage's
        carrier, claimed again in the data after one loss, held through a hang of PostgreSQL by a
        node that never recorded progress in that data, handed over as it stopped, and lost with
        the next loss). Returns the point (the earliest any node that noticed gave)."""

    @abc.abstractmethod
    async def unnoticed_losses(
        self, current: str, reach_ms: int, margin_ms: int, node_id: str
    ) -> list[tuple[str, int]]:
        """Losses of Redis's data nobody recorded (every node that saw the old data died before
        noticing, as in a power cut): progress recorded after ``reach_ms`` in an epoch other than
        ``current`` and not recorded lost. Each is recorded as :meth:`lose_epoch` does, from
        ``margin_ms`` before that epoch's last record, or its least progress if earlier (not
        before ``reach_ms``); returns (epoch, from when) for each. And the losses of epochs other
        than ``current`` another node recorded after ``reach_ms``: a node that owns slots when
        another records a loss must claim their recent past again too, for the recorder claims
        again only what it owns then, which it may hand on before claiming it (seed 951099)."""

    @abc.abstractmethod
    async def slot_marks(self) -> SlotMarks:
        """How far each slot was claimed and fired (by any node), and how far the cluster fired."""

    @abc.abstractmethod
    async def back(
        self, mark_ms: int | None, now_ms: int, outage_after_ms: int, node_id: str
    ) -> tuple[int, int] | None:
        """A node is ready to fire: decide, once for the whole cluster, whether no scheduler ran
        from ``mark_ms`` (how far the cluster had fired) until ``now_ms``, and record that outage.
        The decision is taken under a lock and leaves a mark of its own (a node fired from
        ``now_ms``), so that nodes coming back together, each by its own clock, never decide
        differently: the first one back decides for the others. Returns the outage recorded."""

    @abc.abstractmethod
    async def outages(self, since_ms: int) -> list[tuple[int, int]]:
        """Times when no scheduler ran, ending after ``since_ms``."""

    @abc.abstractmethod
    async def delete_completed(self, jobs: Sequence[tuple[str, int]]) -> list[str]:
        """Delete jobs, given as (id, version), that have nothing left to fire
        (delete_after_completion), each unless it changed since; returns the ids deleted."""

    # -- backfills: a lease (database time) says which owner of the job's slot drives one
    @abc.abstractmethod
    async def backfills(self) -> list[BackfillRow]:
        """Running backfills, and the cancelled ones whose executions may still retry (those of
        the last day, and longer while their job's retries can still come)."""

    async def backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
        """The backfills changed since ``cursor`` (None: from scratch), the cursor to pass next,
        and whether the rows are every backfill to know of (then what is not among them is gone).
        Rows may come without their timing document (``timing`` empty: see backfill_timing).
        This default, for a store with no change feed, reads them all every time."""
        return 0, await self.backfills(), True

    async def backfill_timing(self, backfill_id: str) -> str | None:
        """A backfill's timing document (when the rows came without it)."""
        return next((r.timing for r in await self.backfills() if r.id == backfill_id), None)

    @abc.abstractmethod
    async def lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        """Drive a running backfill nobody else drives: (cursor ms, executions dispatched), or None."""

    @abc.abstractmethod
    async def renew_backfill(
        self,
        backfill_id: str,
        holder: str,
        lease_ms: int,
        cursor_ms: int | None,
        dispatched: int,
        *,
        done: bool,
        release: bool,
    ) -> bool:
        """Record how far the driver got (even of a backfill cancelled meanwhile) and keep driving
        (False: no longer ours, or no longer running). ``done``: every execution is handed out;
        ``release``: stop driving (another owner may go on)."""

    @abc.abstractmethod
    async def end_backfill(self, backfill_id: str, reason: str) -> None:
        """Cancel a running backfill (its occurrences cannot be computed)."""

    @abc.abstractmethod
    async def end_orphaned_backfill(self, backfill_id: str) -> bool:
        """Cancel a running backfill if its job is gone (deleted, or deleted and created again),
        as the database says and not as a node's loaded jobs do (a slot taken over is owned
        before its jobs are loaded); False: its job lives, or the backfill is not running."""

    @abc.abstractmethod
    def write_history(self, rows: list[HistoryRow]) -> int:
        """Blocking: insert rows; returns how many were second deliveries. Raises TransientError
        when the database is unavailable."""


def decide_outage(
    mark_ms: int | None, last_ms: int | None, now_ms: int, outage_after_ms: int
) -> tuple[int, int] | None:
    """The outage a node back at ``now_ms`` records, if any: no scheduler ran since the later of
    how far the cluster fired (``mark_ms``) and the last outage or node back (``last_ms``)."""
    marks = [m for m in (mark_ms, last_ms) if m is not None]
    if not marks or now_ms - max(marks) <= outage_after_ms:
        return None
    return max(marks), now_ms


def bitmap(slots: Iterable[int], size: int) -> bytes:
    out = bytearray((size + 7) // 8)
    for s in slots:
        out[s >> 3] |= 1 << (s & 7)
    return bytes(out)


def bitmap_slots(data: bytes) -> list[int]:
    return [i * 8 + b for i, byte in enumerate(data) if byte for b in range(8) if byte >> b & 1]


# --------------------------------------------------------------------------- PostgreSQL
# Rows go in as one array per column (unnest): psycopg2 adapts a list in C, where execute_values
# formats every row in Python (a sixth of a node's own time on the firing path).
_HISTORY_COLUMNS = (
    "INSERT INTO scheduled_jobs (job_id, scheduled_for, event_index, attempt, execution_id, trigger, status, node, "
    "fired_at, finished_at, lag_ms, http_status, error, throttle_wait_ms, dead_lettered, incarnation, namespace, "
    "response, occurrences, last_scheduled_for) "
    "SELECT job_id, timestamptz 'epoch' + s * interval '1 millisecond', event_index, attempt, execution_id, trigger, "
    "status, node, timestamptz 'epoch' + f * interval '1 millisecond', timestamptz 'epoch' + fin * interval "
    "'1 millisecond', lag_ms, http_status, error, throttle_wait_ms, dead_lettered, incarnation, namespace, response, "
    "occurrences, timestamptz 'epoch' + last * interval '1 millisecond' "
    "FROM unnest(%s::text[], %s::bigint[], %s::int[], %s::int[], %s::uuid[], %s::text[], %s::text[], %s::text[], "
    "%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::text[], %s::bigint[], %s::bool[], %s::bigint[], "
    "%s::text[], %s::text[], %s::int[], %s::bigint[]) AS v(job_id, s, event_index, attempt, execution_id, trigger, "
    "status, node, f, fin, lag_ms, http_status, error, throttle_wait_ms, dead_lettered, incarnation, namespace, "
    "response, occurrences, last) "
)
# A second row for one attempt from a different delivery counts a duplicate; the same row written
# again (a retried write, or a survivor recovering a dead node's rows) does not, nor does a
# "skipped" or "cancelled" row for an occurrence that turns out to have been delivered.
# Two deliveries of one attempt (a node paused past its lease, its execution taken over and tried
# again under the same attempt number): a success is what the row keeps, and an end (cancelled,
# permanently failed) replaces a failure that was to be retried, so that history says the execution
# ended (seed 40021: the job deleted, the taker cancelled the execution while the paused node's
# failure of the same attempt was written first, and the paused node then lost its retry). Every
# CASE tests the old row: an UPDATE reads the row as it was. (``replaces`` says the same in Python.)
_ENDS = ("cancelled", "permanently_failed")
_REPLACES = (
    "(EXCLUDED.status = 'succeeded' AND scheduled_jobs.status <> 'succeeded') OR "
    f"(EXCLUDED.status IN {_ENDS!r} AND scheduled_jobs.status = 'failed')"
)


def replaces(old_status: str, new_status: str) -> bool:
    """Whether a row of ``new_status`` replaces one of ``old_status`` for the same attempt."""
    if new_status == "succeeded":
        return old_status != "succeeded"
    return new_status in _ENDS and old_status == "failed"


_INSERT = (
    _HISTORY_COLUMNS + "ON CONFLICT (job_id, scheduled_for, event_index, attempt, trigger) DO UPDATE SET duplicates = "
    "scheduled_jobs.duplicates "
    "+ CASE WHEN EXCLUDED.status IN ('skipped', 'cancelled') OR (scheduled_jobs.node IS NOT DISTINCT FROM "
    "EXCLUDED.node AND scheduled_jobs.fired_at IS NOT DISTINCT FROM EXCLUDED.fired_at) THEN 0 ELSE 1 END"
    + "".join(
        f", {c} = CASE WHEN {_REPLACES} THEN EXCLUDED.{c} ELSE scheduled_jobs.{c} END"
        for c in ("node", "fired_at", "finished_at", "lag_ms", "http_status", "error", "response", "status")
    )
    # a summary written again says the most it has counted (the watchdog's passes go on counting)
    + ", occurrences = GREATEST(scheduled_jobs.occurrences, EXCLUDED.occurrences)"
    + ", last_scheduled_for = GREATEST(scheduled_jobs.last_scheduled_for, EXCLUDED.last_scheduled_for)"
    + " RETURNING duplicates"
)
# Jobs that completed (delete_after_completion) and did not change since: deleted, with a job event.
_DELETE_BATCH = 5000
_DELETE_COMPLETED = text(
    "WITH v(id, version) AS (SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:versions AS bigint[]))), "
    "locked AS (SELECT j.id FROM jobs j JOIN v ON j.id = v.id AND j.version = v.version "
    "WHERE j.deleted_at IS NULL ORDER BY j.id FOR UPDATE OF j), "
    "d AS (UPDATE jobs j SET deleted_at = now(), updated_at = now(), version = nextval('jobs_version_seq'), "
    "change_xid = pg_current_xact_id()::text::bigint FROM locked WHERE j.id = locked.id "
    "RETURNING j.id, j.namespace), "
    "e AS (INSERT INTO job_events (job_id, namespace, action, actor, detail) "
    "SELECT id, namespace, 'delete', 'scheduler', '{\"reason\": \"completed\"}'::jsonb FROM d) "
    "SELECT id FROM d"
)
# Rows written for the first time (the others, already there, go through _INSERT).
_INSERT_NEW = (
    _HISTORY_COLUMNS + "ON CONFLICT (job_id, scheduled_for, event_index, attempt, trigger) DO NOTHING "
    f"RETURNING job_id, {_MS.format('scheduled_for')}, event_index, attempt, trigger"
)


UNAVAILABLE = (
    psycopg2.OperationalError,
    psycopg2.InterfaceError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
)


def one_row_per_attempt(batch: Iterable[HistoryRow]) -> list[HistoryRow]:
    """One row per attempt, as the database keeps them across batches: the first, unless a later
    one ``replaces`` it (a batch can hold a survivor's success, or its end, and the failure it
    recovered from the node that died, of the same attempt)."""
    seen: dict[tuple[str, int, int, int, str], HistoryRow] = {}
    for r in batch:
        old = seen.get(r.key)
        if old is None or replaces(old.status, r.status):
            seen[r.key] = r
    return list(seen.values())


class PgNodeStore(NodeStore):
    def __init__(self, engine: Engine, executor: Executor) -> None:
        self.engine = engine
        self.executor = executor
        self._days: set[Any] = set()
        self._calendars: dict[tuple[str, str], tuple[int, Calendar | None]] = {}  # (version, calendar) by key
        self._abandon = threading.Event()  # set when the node stops: a load in a thread ends
        # Told of the jobs a history write paused (auto-pause), from the writing thread, once
        # the write has committed.
        self.on_paused: Callable[[list[Stop]], None] = lambda stops: None

    def abandon_loads(self) -> None:
        self._abandon.set()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        except UNAVAILABLE as exc:
            raise TransientError(f"database: {type(exc).__name__}: {str(exc).strip()[:200]}") from exc

    # -- jobs and the feed
    async def load_slots(self, slots: Sequence[int], decoder: Decoder) -> tuple[int, Loaded]:
        return await self._call(self._load_slots, list(slots), decoder)

    def _load_slots(self, slots: list[int], decoder: Decoder, batch: int = 5_000) -> tuple[int, Loaded]:
        """Rows are decoded as they stream in (a server-side cursor, ``batch`` rows a round trip),
        so a million jobs never sit in memory as rows, and ``rows_loaded`` moves as they come."""
        out = Loaded()
        with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
            xmin = int(conn.execute(_XMIN).scalar_one())
            if not slots:
                return xmin, out
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
                abandon = self._abandon
                base = self.rows_loaded
                for i, r in enumerate(cur):
                    if i % batch == 0:
                        if abandon.is_set():
                            raise TransientError("the node is stopping: the load was abandoned")
                        self.rows_loaded = base + i
                    try:
                        job = job_from(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[9], r[10], r[11], r[8])
                    except (ValueError, KeyError, TypeError) as exc:
                        log.error("cannot schedule job: %s", exc, extra={"job_id": r[0]})
                        continue
                    out.add(job, r[8])
                self.rows_loaded = base + len(out)
            finally:
                if collecting:
                    gc.enable()
                cur.close()
        return xmin, out

    async def poll_changes(
        self, cursor: int, slots: Collection[int] | None = None
    ) -> tuple[int, list[JobRow], list[TriggerRow]]:
        return await self._call(self._poll_changes, cursor, None if slots is None else sorted(slots))

    def _poll_changes(self, cursor: int, slots: list[int] | None) -> tuple[int, list[JobRow], list[TriggerRow]]:
        """With ``slots``, the database leaves out other nodes' jobs: ``ix_jobs_change_xid_slot``
        (change_xid, slot) finds the changed rows and tests their slot in the index, so only this
        node's rows are read from the table and sent."""
        owned = "" if slots is None else " AND slot = ANY(CAST(:slots AS int[]))"
        joined = "" if slots is None else "JOIN jobs j ON j.id = t.job_id AND j.slot = ANY(CAST(:slots AS int[])) "
        # thousands of owned slots, polled several times a second: one literal, not a list psycopg2
        # adapts number by number (3 % of a node's CPU at 3,000 deliveries/s)
        params = {"c": cursor, "slots": None if slots is None else array_literal(slots)}
        with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
            xmin = int(conn.execute(_XMIN).scalar_one())
            jobs = [
                JobRow(*r)
                for r in conn.execute(
                    text(
                        f"SELECT {JOB_COLUMNS}, deleted_at IS NOT NULL, change_xid FROM jobs "
                        f"WHERE change_xid >= :c{owned}"
                    ),
                    params,
                )
            ]
            triggers = [
                TriggerRow(*r) for r in conn.execute(text(_TRIGGERS + joined + "WHERE t.change_xid >= :c"), params)
            ]
        return xmin, jobs, triggers

    async def recent_triggers(self, slots: Sequence[int], since_ms: int) -> list[TriggerRow]:
        return await self._call(self._recent_triggers, list(slots), since_ms)

    def _recent_triggers(self, slots: list[int], since_ms: int) -> list[TriggerRow]:
        if not slots:
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    _TRIGGERS + "JOIN jobs j ON j.id = t.job_id AND j.slot = ANY(:slots) "
                    "WHERE t.requested_at > timestamptz 'epoch' + :since * interval '1 millisecond'"
                ),
                {"slots": slots, "since": since_ms},
            )
            return [TriggerRow(*r) for r in rows]

    async def attempts(self, idents: Sequence[Ident]) -> dict[Ident, Attempts]:
        return await self._call(self._attempts, list(idents))

    def _attempts(self, items: list[Ident]) -> dict[Ident, Attempts]:
        if not items:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT s.job_id, {_MS.format('s.scheduled_for')}, s.event_index, s.trigger, max(s.attempt), "
                    "bool_or(s.status IN ('succeeded', 'permanently_failed', 'skipped', 'cancelled')), "
                    "bool_or(s.status IN ('succeeded', 'permanently_failed', 'cancelled') "
                    "OR (s.status = 'skipped' AND coalesce(s.error, '') NOT LIKE :misfire)) "
                    "FROM scheduled_jobs s JOIN unnest(CAST(:j AS text[]), CAST(:t AS bigint[]), CAST(:e AS int[]), "
                    "CAST(:g AS text[])) AS w(job_id, ms, ev, tr) ON s.job_id = w.job_id "
                    "AND s.scheduled_for = timestamptz 'epoch' + w.ms * interval '1 millisecond' "
                    "AND s.event_index = w.ev AND s.trigger = w.tr GROUP BY 1, 2, 3, 4"
                ),
                {
                    "j": [i[0] for i in items],
                    "t": [i[1] for i in items],
                    "e": [i[2] for i in items],
                    "g": [i[3] for i in items],
                    "misfire": MISFIRE_REASON + "%",
                },
            )
            return {
                (r[0], int(r[1]), int(r[2]), r[3]): Attempts(int(r[4]), bool(r[5]), bool(r[5]) and not r[6])
                for r in rows
            }

    async def live_incarnations(self, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        return await self._call(self._live_incarnations, list(job_ids))

    def _live_incarnations(self, job_ids: list[str]) -> dict[str, tuple[int, int]]:
        if not job_ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT id, incarnation, {_MS.format('created_at')} FROM jobs "
                    "WHERE id = ANY(:ids) AND deleted_at IS NULL"
                ),
                {"ids": job_ids},
            )
            return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    async def cluster_config(self) -> ClusterConfig:
        return await self._call(self._cluster_config)

    def _cluster_config(self) -> ClusterConfig:
        with self.engine.connect() as conn:
            throttles = {
                (r[0], r[1]): (int(r[2]), None if r[3] is None else float(r[3]))
                for r in conn.execute(
                    text("SELECT namespace, name, max_in_flight, max_per_second FROM throttle_policies")
                )
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
            calendars = self._read_calendars(conn)
        return ClusterConfig(throttles, {k: tuple(v) for k, v in secrets.items()}, calendars)

    def calendars(self) -> dict[tuple[str, str], Calendar]:
        """Blocking: every calendar, by (namespace, name) (see _read_calendars)."""
        with self.engine.connect() as conn:
            return self._read_calendars(conn)

    def _read_calendars(self, conn: Any) -> dict[tuple[str, str], Calendar]:
        """Every calendar. Only the version of each is read; the documents of those whose version
        moved since the last read are loaded (the others are the very objects of the last read), and
        read without checking each entry again: the API validated them."""
        versions = {(r[0], r[1]): int(r[2]) for r in conn.execute(_CALENDAR_VERSIONS)}
        known = self._calendars
        changed = sorted(k for k, v in versions.items() if k not in known or known[k][0] != v)
        fresh: dict[tuple[str, str], tuple[int, Calendar | None]] = {}
        for i in range(0, len(changed), _CALENDARS_A_READ):
            part = changed[i : i + _CALENDARS_A_READ]
            rows = conn.execute(_CALENDAR_DOCUMENTS, {"ns": [k[0] for k in part], "names": [k[1] for k in part]})
            for namespace, name, version, doc in rows:
                fresh[(namespace, name)] = (int(version), _stored_calendar(namespace, name, doc))
        self._calendars = kept = {k: fresh[k] if k in fresh else known[k] for k in versions if k in fresh or k in known}
        return {k: cal for k, (_, cal) in kept.items() if cal is not None}

    # -- progress and outages
    async def save_progress(
        self,
        node_id: str,
        incarnation: str,
        fired_through_ms: int,
        slots: bytes,
        epoch: str | None,
        firing_ms: int | None = None,
    ) -> None:
        await self._call(self._save_progress, node_id, incarnation, fired_through_ms, slots, epoch, firing_ms)

    def _save_progress(
        self,
        node_id: str,
        incarnation: str,
        fired_through_ms: int,
        slots: bytes,
        epoch: str | None,
        firing_ms: int | None,
    ) -> None:
        # Within an epoch a node's mark only grows; a node that noticed a loss saves in the new
        # epoch the progress it lowered itself. Claimed in an epoch since lost (by a node that has
        # not noticed yet), the mark goes no further than the loss left it.
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO node_progress AS p "
                    "(node_id, incarnation, fired_through, firing_through, slots, epoch, updated_at) "
                    "SELECT :n, :i, LEAST(t.at, (SELECT since FROM lost_epochs WHERE epoch = :e)), "
                    "GREATEST(t.at, timestamptz 'epoch' + :f * interval '1 millisecond'), :s, :e, now() "
                    "FROM (SELECT timestamptz 'epoch' + :ms * interval '1 millisecond' AS at) t "
                    "ON CONFLICT (node_id, incarnation) DO UPDATE SET slots = EXCLUDED.slots, "
                    "updated_at = now(), epoch = EXCLUDED.epoch, "
                    "firing_through = GREATEST(p.firing_through, EXCLUDED.firing_through), "
                    "fired_through = CASE WHEN p.epoch IS NOT DISTINCT FROM EXCLUDED.epoch "
                    "THEN GREATEST(p.fired_through, EXCLUDED.fired_through) ELSE EXCLUDED.fired_through END"
                ),
                {
                    "n": node_id,
                    "i": incarnation,
                    "ms": fired_through_ms,
                    "f": fired_through_ms if firing_ms is None else firing_ms,
                    "s": slots,
                    "e": epoch,
                },
            )

    async def lose_epoch(
        self,
        epoch: str,
        current: str,
        since_ms: int,
        node_id: str,
        reach_ms: int | None = None,
        live: Collection[str] = (),
    ) -> int:
        return await self._call(self._lose_epoch, epoch, current, since_ms, node_id, reach_ms, sorted(live))

    def _lose_epoch(
        self,
        epoch: str,
        current: str,
        since_ms: int,
        node_id: str,
        reach_ms: int | None,
        live: list[str],
        after_ms: int | None = None,
    ) -> int:
        since = "timestamptz 'epoch' + :ms * interval '1 millisecond'"
        with self.engine.begin() as conn:
            reach = reach_ms if reach_ms is not None else after_ms
            if reach is not None and reach < since_ms:
                earlier = conn.execute(
                    text(
                        f"SELECT {_MS.format('min(since)')} FROM lost_epochs WHERE epoch <> :e "
                        "AND noticed_at > timestamptz 'epoch' + :r * interval '1 millisecond'"
                    ),
                    {"e": epoch, "r": reach},
                ).scalar()
                if earlier is not None:
                    since_ms = min(since_ms, max(reach, int(earlier)))
            if reach_ms is not None and reach_ms < since_ms:
                least = conn.execute(
                    text(
                        f"SELECT {_MS.format('min(fired_through)')} FROM node_progress "
                        "WHERE epoch = :e AND updated_at > timestamptz 'epoch' + :r * interval '1 millisecond' "
                        "AND NOT (incarnation = ANY(CAST(:live AS text[])))"
                    ),
                    {"e": epoch, "r": reach_ms, "live": live},
                ).scalar()
                if least is not None:
                    since_ms = max(reach_ms, min(since_ms, int(least)))
            recorded = conn.execute(
                text(
                    f"INSERT INTO lost_epochs (epoch, since, noticed_by) VALUES (:e, {since}, :n) "
                    "ON CONFLICT (epoch) DO UPDATE SET since = LEAST(lost_epochs.since, EXCLUDED.since) "
                    f"RETURNING {_MS.format('since')}"
                ),
                {"e": epoch, "ms": since_ms, "n": node_id},
            ).scalar_one()
            since_ms = int(recorded)
            # Every mark not claimed in the data Redis holds now (rows of older epochs, and rows
            # written before epochs were recorded) spoke for claims that are gone.
            conn.execute(
                text(
                    "UPDATE node_progress SET firing_through = GREATEST(firing_through, fired_through), "
                    f"fired_through = {since} WHERE epoch IS DISTINCT FROM :c AND fired_through > {since}"
                ),
                {"c": current, "ms": since_ms},
            )
        return since_ms

    async def unnoticed_losses(
        self, current: str, reach_ms: int, margin_ms: int, node_id: str
    ) -> list[tuple[str, int]]:
        return await self._call(self._unnoticed_losses, current, reach_ms, margin_ms, node_id)

    def _unnoticed_losses(self, current: str, reach_ms: int, margin_ms: int, node_id: str) -> list[tuple[str, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT epoch, {_MS.format('max(updated_at)')}, {_MS.format('min(fired_through)')} "
                    "FROM node_progress p WHERE epoch IS NOT NULL AND epoch <> :c "
                    "AND updated_at > timestamptz 'epoch' + :r * interval '1 millisecond' "
                    "AND NOT EXISTS (SELECT 1 FROM lost_epochs l WHERE l.epoch = p.epoch) GROUP BY epoch"
                ),
                {"c": current, "r": reach_ms},
            ).all()
        out = []
        for epoch, last, least in rows:
            since = max(reach_ms, min(int(last) - margin_ms, int(least)))
            out.append((str(epoch), self._lose_epoch(str(epoch), current, since, node_id, None, [], reach_ms)))
        found = {e for e, _ in out}
        with self.engine.connect() as conn:
            recorded = conn.execute(
                text(
                    f"SELECT epoch, {_MS.format('since')} FROM lost_epochs WHERE epoch <> :c "
                    "AND noticed_at > timestamptz 'epoch' + :r * interval '1 millisecond' ORDER BY epoch"
                ),
                {"c": current, "r": reach_ms},
            ).all()
        out += [(str(e), int(t)) for e, t in recorded if str(e) not in found]
        return out

    async def slot_marks(self) -> SlotMarks:
        return await self._call(self._slot_marks)

    def _slot_marks(self) -> SlotMarks:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT {_MS.format('fired_through')}, slots, "
                    f"{_MS.format('GREATEST(firing_through, fired_through)')} FROM node_progress "
                    "WHERE updated_at > now() - interval '7 days'"
                )
            ).all()
        return slot_marks_of([(int(ms), int(firing), bytes(slots)) for ms, slots, firing in rows])

    async def back(
        self, mark_ms: int | None, now_ms: int, outage_after_ms: int, node_id: str
    ) -> tuple[int, int] | None:
        return await self._call(self._back, mark_ms, now_ms, outage_after_ms, node_id)

    def _back(self, mark_ms: int | None, now_ms: int, outage_after_ms: int, node_id: str) -> tuple[int, int] | None:
        with self.engine.begin() as conn:
            # (self-exclusive; plain reads of the outages go on)
            conn.execute(text("LOCK TABLE cluster_outages IN SHARE ROW EXCLUSIVE MODE"))
            last = conn.execute(text(f"SELECT {_MS.format('max(until)')} FROM cluster_outages")).scalar()
            outage = decide_outage(mark_ms, None if last is None else int(last), now_ms, outage_after_ms)
            since, until = outage or (now_ms, now_ms)  # an empty one: only the mark that a node is back
            conn.execute(
                text(
                    "INSERT INTO cluster_outages (since, until, recorded_by) VALUES "
                    "(timestamptz 'epoch' + :a * interval '1 millisecond', "
                    "timestamptz 'epoch' + :b * interval '1 millisecond', :n)"
                ),
                {"a": since, "b": until, "n": node_id},
            )
            # Only the latest end counts for the next decision: earlier empty marks go, so the
            # table keeps the outages and one mark, not a row for every node start.
            conn.execute(
                text(
                    "DELETE FROM cluster_outages WHERE until = since "
                    "AND until < timestamptz 'epoch' + :b * interval '1 millisecond'"
                ),
                {"b": until},
            )
        return outage

    async def outages(self, since_ms: int) -> list[tuple[int, int]]:
        return await self._call(self._outages, since_ms)

    def _outages(self, since_ms: int) -> list[tuple[int, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT {_MS.format('since')}, {_MS.format('until')} FROM cluster_outages "
                    "WHERE until > since AND until > timestamptz 'epoch' + :s * interval '1 millisecond' ORDER BY 1"
                ),
                {"s": since_ms},
            )
            return [(int(a), int(b)) for a, b in rows]

    async def delete_completed(self, jobs: Sequence[tuple[str, int]]) -> list[str]:
        return await self._call(self._delete_completed, list(jobs))

    def _delete_completed(self, jobs: list[tuple[str, int]]) -> list[str]:
        """One statement for a batch (a burst of one-off jobs completes thousands at once); rows
        are locked in id order, so two writers never wait on each other in a circle."""
        deleted: list[str] = []
        ordered = sorted(set(jobs))
        with self.engine.begin() as conn:
            for i in range(0, len(ordered), _DELETE_BATCH):
                chunk = ordered[i : i + _DELETE_BATCH]
                rows = conn.execute(
                    _DELETE_COMPLETED, {"ids": [j for j, _ in chunk], "versions": [v for _, v in chunk]}
                )
                deleted.extend(r[0] for r in rows)
        return deleted

    # -- backfills
    async def backfills(self) -> list[BackfillRow]:
        return await self._call(self._backfills)

    def _backfills(self) -> list[BackfillRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(_BACKFILLS)
            return [BackfillRow(*r) for r in rows]

    async def backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
        return await self._call(self._backfill_changes, cursor)

    def _backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
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

    async def backfill_timing(self, backfill_id: str) -> str | None:
        return await self._call(self._backfill_timing, backfill_id)

    def _backfill_timing(self, backfill_id: str) -> str | None:
        with self.engine.connect() as conn:
            found = conn.execute(text("SELECT timing::text FROM backfills WHERE id = :id"), {"id": backfill_id})
            return found.scalar()

    async def lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        return await self._call(self._lease_backfill, backfill_id, holder, lease_ms)

    def _lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        with self.engine.begin() as conn:
            row = conn.execute(_LEASE_BACKFILL, {"id": backfill_id, "h": holder, "ms": lease_ms}).first()
        return None if row is None else (None if row[0] is None else int(row[0]), int(row[1]))

    async def renew_backfill(
        self,
        backfill_id: str,
        holder: str,
        lease_ms: int,
        cursor_ms: int | None,
        dispatched: int,
        *,
        done: bool,
        release: bool,
    ) -> bool:
        params = {
            "id": backfill_id,
            "h": holder,
            "ms": 0 if release else lease_ms,
            "c": cursor_ms,
            "d": dispatched,
            "done": done,
            "release": release or done,
        }
        return await self._call(self._renew_backfill, params)

    def _renew_backfill(self, params: dict[str, Any]) -> bool:
        with self.engine.begin() as conn:
            row = conn.execute(_RENEW_BACKFILL, params).first()
        return row is not None and bool(row[0])

    async def end_backfill(self, backfill_id: str, reason: str) -> None:
        await self._call(self._end_backfill, backfill_id, reason)

    def _end_backfill(self, backfill_id: str, reason: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE backfills SET state = 'cancelled', reason = :r, driver = NULL, updated_at = now(), "
                    "change_xid = pg_current_xact_id()::text::bigint "
                    "WHERE id = :id AND state = 'running'"
                ),
                {"id": backfill_id, "r": reason},
            )

    async def end_orphaned_backfill(self, backfill_id: str) -> bool:
        return await self._call(self._end_orphaned_backfill, backfill_id)

    def _end_orphaned_backfill(self, backfill_id: str) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(_END_ORPHANED_BACKFILL, {"id": backfill_id}).first() is not None

    # -- history
    def write_history(self, rows: list[HistoryRow]) -> int:
        try:
            return self._write(rows)[0]
        except UNAVAILABLE as exc:
            raise TransientError(f"database: {type(exc).__name__}: {str(exc).strip()[:200]}") from exc

    def write_late(self, rows: list[HistoryRow]) -> int:
        """Blocking: the watchdog's rows for late occurrences; returns how many are new."""
        try:
            return self._write(rows)[1]
        except UNAVAILABLE as exc:
            raise TransientError(f"database: {type(exc).__name__}: {str(exc).strip()[:200]}") from exc

    def _write(self, batch: list[HistoryRow]) -> tuple[int, int]:
        """Insert rows, and apply those written for the first time to health, auto-pause and
        notification events (scheduler_node.outcomes) in the same transaction; returns (second
        deliveries, rows new)."""
        days = {day_of_ms(r.scheduled_ms) for r in batch}
        raw = self.engine.raw_connection()
        try:
            for attempt in (1, 2):
                try:
                    if not days <= self._days:
                        self._ensure_days(days)
                    cur = raw.cursor()
                    try:
                        rows = one_row_per_attempt(batch)
                        cur.execute(_INSERT_NEW, array_columns(rows))
                        new = {(r[0], int(r[1]), r[2], r[3], r[4]) for r in cur.fetchall()}
                        fresh = [r for r in rows if r.key in new]
                        again = [r for r in rows if r.key not in new]
                        returned: list[tuple[Any, ...]] = []
                        if again:
                            cur.execute(_INSERT, array_columns(again))
                            returned = list(cur.fetchall())
                        paused = record_outcomes(cur, fresh) if fresh else []
                    finally:
                        cur.close()
                    raw.commit()
                    if paused:
                        try:
                            self.on_paused(paused)
                        except Exception:  # noqa: BLE001 - the write is done; the nodes read the feed anyway
                            log.exception("could not tell of jobs paused")
                    return sum(1 for row in returned if row[0]), len(fresh)
                except pg_errors.CheckViolation:
                    # "no partition of relation found for row": a day nobody created yet
                    raw.rollback()
                    self._days -= days
                    if attempt == 2:
                        raise
                except Exception:
                    raw.rollback()
                    raise
            raise AssertionError("unreachable")
        finally:
            raw.close()

    def _ensure_days(self, days: set[Any]) -> None:
        with self.engine.begin() as conn:
            created = ensure_partitions(conn, days)
        if created:
            log.info("created history partitions %s", ", ".join(created))
        self._days |= days


# A cancelled backfill is read for as long as its executions can still retry: a day, plus its
# job's retries (each wait at most max_backoff_seconds, each attempt at most 300 s). Only a running
# one's timing is needed.
_RETRY_SPAN = (
    f"(GREATEST(COALESCE((j.retry->>'max_attempts')::int, {RETRY_DEFAULTS.max_attempts:d}) - 1, 0) "
    f"* (COALESCE((j.retry->>'max_backoff_seconds')::float, {RETRY_DEFAULTS.max_backoff_seconds!r}) "
    f"+ {MAX_TIMEOUT_SECONDS:d})) * interval '1 second'"
)
_CALENDAR_VERSIONS = text("SELECT namespace, name, version FROM calendars")
_CALENDAR_DOCUMENTS = text(
    "SELECT c.namespace, c.name, c.version, c.document::text FROM calendars c "
    "JOIN unnest(CAST(:ns AS text[]), CAST(:names AS text[])) AS k(ns, name) ON (c.namespace, c.name) = (k.ns, k.name)"
)
_CALENDARS_A_READ = 200


def _stored_calendar(namespace: str, name: str, doc: str) -> Calendar | None:
    try:
        return calendar_from_stored(json.loads(doc))
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:  # fire as if it were absent
        log.error("cannot use calendar %s/%s: %s", namespace, name, exc)
        return None


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
_TRIGGERS = (
    f"SELECT t.id, t.job_id, {_MS.format('t.requested_at')}, t.kind, {_MS.format('t.scheduled_for')}, "
    "t.event_index, t.attempt, t.execution_id::text, t.trigger, t.incarnation FROM job_triggers t "
)
