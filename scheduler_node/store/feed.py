"""The jobs of the slots a node owns, the change feed, manual triggers and redeliveries (what a
node loads and polls), and the deletes of jobs that completed. Blocking: see PgNodeStore.

Jobs and the feed are read in one REPEATABLE READ snapshot together with that snapshot's xmin.
Every transaction whose changes the snapshot could not see has an id >= xmin, so polling
``change_xid >= xmin`` next time cannot skip a transaction that committed late. Rows seen twice
are told apart by version.
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any

from sqlalchemy import Engine, text

from cronman.errors import TransientError
from cronman.store.pgarray import array_literal
from scheduler_node.jobs import JOB_COLUMNS, Decoder, JobRow, Loaded, load_columns
from scheduler_node.store.port import PayloadRow, TriggerRow
from scheduler_node.store.sql import _MS, _XMIN

log = logging.getLogger("cronman.node.store")


class JobFeed:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.rows_loaded = 0  # jobs read by the loads so far (NodeStore.rows_loaded)
        self._abandon = threading.Event()  # set when the node stops: a load in a thread ends

    def abandon_loads(self) -> None:
        self._abandon.set()

    def load_slots(self, slots: list[int], decoder: Decoder, batch: int = 5_000) -> tuple[int, Loaded]:
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
                columns = load_columns(decoder.payload_limit)
                cur.execute(f"SELECT {columns} FROM jobs WHERE deleted_at IS NULL AND slot = ANY(%s)", (list(slots),))
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

    def poll_changes(self, cursor: int, slots: list[int] | None) -> tuple[int, list[JobRow], list[TriggerRow]]:
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

    def recent_triggers(self, slots: list[int], since_ms: int) -> list[TriggerRow]:
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

    def live_incarnations(self, job_ids: list[str]) -> dict[str, tuple[int, int]]:
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

    def payloads(self, job_ids: list[str]) -> dict[str, PayloadRow]:
        """The payloads of these jobs as stored now (a job deleted has none), by primary key."""
        if not job_ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(_PAYLOADS, {"ids": array_literal(job_ids)})
            return {r[0]: PayloadRow(int(r[1]), int(r[2]), r[3].encode()) for r in rows}

    def delete_completed(self, jobs: list[tuple[str, int]]) -> list[str]:
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


_TRIGGERS = (
    f"SELECT t.id, t.job_id, {_MS.format('t.requested_at')}, t.kind, {_MS.format('t.scheduled_for')}, "
    "t.event_index, t.attempt, t.execution_id::text, t.trigger, t.incarnation FROM job_triggers t "
)
_PAYLOADS = text(
    "SELECT id, version, incarnation, payload FROM jobs WHERE id = ANY(CAST(:ids AS text[])) AND deleted_at IS NULL"
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
