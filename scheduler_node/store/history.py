"""History: the rows a node writes (and the watchdog's for late occurrences), applied to health,
auto-pause and notification events in the same transaction, and what history says of an
execution's attempts. Blocking: see PgNodeStore.

Rows go in as one array per column (unnest): psycopg2 adapts a list in C, where execute_values
formats every row in Python (a sixth of a node's own time on the firing path).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from typing import Any

from psycopg2 import errors as pg_errors
from sqlalchemy import Engine, text

from cronman.model.changes import Stop
from cronman.model.misfire import REASON_PREFIX as MISFIRE_REASON
from cronman.store.partitions import day_of_ms, ensure_partitions
from cronman.store.pgarray import array_columns
from scheduler_node.history import HistoryRow
from scheduler_node.outcomes import record_outcomes
from scheduler_node.store import copytext
from scheduler_node.store.dependencies import record_dependencies
from scheduler_node.store.port import _ENDS, Attempts, Ident, one_row_per_attempt
from scheduler_node.store.sql import _MS

log = logging.getLogger("cronman.node.store")

# The columns a node writes, in the order of HistoryRow's fields (the INSERT's and the COPY's).
_COLUMNS = (
    "job_id, scheduled_for, event_index, attempt, execution_id, trigger, status, node, fired_at, finished_at, "
    "lag_ms, http_status, error, throttle_wait_ms, dead_lettered, incarnation, namespace, response, occurrences, "
    "last_scheduled_for"
)
assert _COLUMNS.count(",") + 1 == len(HistoryRow._fields)  # COPY sends every field, in order
_HISTORY_COLUMNS = (
    f"INSERT INTO scheduled_jobs ({_COLUMNS}) "
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
_REPLACES = (
    "(EXCLUDED.status = 'succeeded' AND scheduled_jobs.status <> 'succeeded') OR "
    f"(EXCLUDED.status IN {_ENDS!r} AND scheduled_jobs.status = 'failed')"
)
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
# Rows written by COPY when none of them is in the table yet (the usual batch): a copied row costs
# PostgreSQL about a third of an inserted one (no ON CONFLICT, no expressions, nothing returned).
_COPY = f"COPY scheduled_jobs ({_COLUMNS}) FROM STDIN"
# Rows written for the first time (the others, already there, go through _INSERT).
_INSERT_NEW = (
    _HISTORY_COLUMNS + "ON CONFLICT (job_id, scheduled_for, event_index, attempt, trigger) DO NOTHING "
    f"RETURNING job_id, {_MS.format('scheduled_for')}, event_index, attempt, trigger"
)


class History:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._days: set[Any] = set()
        # Told of the jobs a history write paused (auto-pause), from the writing thread, once
        # the write has committed.
        self.on_paused: Callable[[list[Stop]], None] = lambda stops: None

    def attempts(self, items: list[Ident]) -> dict[Ident, Attempts]:
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

    def write(self, batch: list[HistoryRow]) -> tuple[int, int]:
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
                    rows = one_row_per_attempt(batch)
                    copied = self._copy(raw, rows)
                    cur = raw.cursor()
                    try:
                        returned: list[tuple[Any, ...]] = []
                        if copied:
                            fresh = rows
                        else:
                            cur.execute(_INSERT_NEW, array_columns(rows))
                            new = {(r[0], int(r[1]), r[2], r[3], r[4]) for r in cur.fetchall()}
                            fresh = [r for r in rows if r.key in new]
                            again = [r for r in rows if r.key not in new]
                            if again:
                                cur.execute(_INSERT, array_columns(again))
                                returned = list(cur.fetchall())
                        paused = record_outcomes(cur, fresh) if fresh else []
                        # Jobs that wait for these: rows written again count too (a success over a
                        # failure of its attempt), each upstream execution once (sim seed 9000032).
                        record_dependencies(cur, rows)
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

    def _copy(self, raw: Any, rows: list[HistoryRow]) -> bool:
        """Write rows that are all new by COPY, the transaction's first statement. False, with the
        transaction rolled back, when one of them is there already (a row written again, a
        delivery's second row, a skip of what was delivered: rare, and written by INSERT then)."""
        if not rows:
            return False
        cur = raw.cursor()
        try:
            cur.copy_expert(_COPY, io.StringIO(copytext.history_rows(rows)))
        except pg_errors.UniqueViolation:
            raw.rollback()
            return False
        finally:
            cur.close()
        return True

    def _ensure_days(self, days: set[Any]) -> None:
        with self.engine.begin() as conn:
            created = ensure_partitions(conn, days)
        if created:
            log.info("created history partitions %s", ", ".join(created))
        self._days |= days
