"""History written in batches off the timer: rows go to a buffer, one writer flushes it every
~100 ms with a multi-row INSERT. While PostgreSQL is down the buffer is held (bounded) and the
write retried with backoff, so history recorded during an outage is kept, not lost."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import NamedTuple

from psycopg2 import errors as pg_errors
from psycopg2.extras import execute_values
from sqlalchemy import Engine

from cronman.partitions import day_of_ms, ensure_partitions

log = logging.getLogger("cronman.node.history")

_TS = "(timestamptz 'epoch' + %s * interval '1 millisecond')"
_COLUMNS = (
    "INSERT INTO scheduled_jobs (job_id, scheduled_for, event_index, attempt, execution_id, trigger, status, node, "
    "fired_at, finished_at, lag_ms, http_status, error, throttle_wait_ms, dead_lettered) VALUES %s "
)
# A second row for one attempt from a different delivery counts a duplicate; the same row written
# again (a retried write, or a survivor recovering a dead node's rows) does not, nor does a
# "skipped" row for an occurrence that turns out to have been delivered (the delivery stands).
_INSERT = (
    _COLUMNS + "ON CONFLICT (job_id, scheduled_for, event_index, attempt) DO UPDATE SET duplicates = "
    "scheduled_jobs.duplicates "
    "+ CASE WHEN EXCLUDED.status = 'skipped' OR (scheduled_jobs.node IS NOT DISTINCT FROM EXCLUDED.node "
    "AND scheduled_jobs.fired_at IS NOT DISTINCT FROM EXCLUDED.fired_at) THEN 0 ELSE 1 END "
    "RETURNING duplicates"
)
_TEMPLATE = f"(%s, {_TS}, %s, %s, %s::uuid, %s, %s, %s, {_TS}, {_TS}, %s, %s, %s, %s, %s)"
_MAX_ERROR = 1000


class HistoryRow(NamedTuple):
    job_id: str
    scheduled_ms: int
    event_index: int
    attempt: int
    execution_id: str
    trigger: str
    status: str
    node: str
    fired_ms: int | None
    finished_ms: int | None
    lag_ms: int | None
    http_status: int | None
    error: str | None
    throttle_wait_ms: int | None = None
    dead_lettered: bool | None = None


class HistoryWriter:
    def __init__(
        self,
        engine: Engine,
        executor: Executor,
        *,
        flush_seconds: float,
        max_rows: int,
        on_batch: Callable[[list[HistoryRow], int], None] = lambda rows, dups: None,
        on_failure: Callable[[], None] = lambda: None,
        on_dropped: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.engine = engine
        self.executor = executor
        self.flush_seconds = flush_seconds
        self.max_rows = max_rows
        self._buffer: deque[HistoryRow] = deque()
        self._days: set = set()
        self._on_batch, self._on_failure, self._on_dropped = on_batch, on_failure, on_dropped
        self._backoff = 0.0
        self.last_error: str | None = None

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, row: HistoryRow) -> HistoryRow:
        """Buffer a row for the next write; returns it as it will be written."""
        if row.error and len(row.error) > _MAX_ERROR:
            row = row._replace(error=row.error[:_MAX_ERROR])
        self._buffer.append(row)
        if len(self._buffer) > self.max_rows:
            self._buffer.popleft()
            self._on_dropped(1)
        return row

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                async with asyncio.timeout(self.flush_seconds + self._backoff):
                    await stopping.wait()
            except TimeoutError:
                pass
            await self.flush()

    async def flush(self, limit: int = 20_000) -> bool:
        """Write what is buffered (in chunks); keep it on failure. True when the buffer is empty."""
        loop = asyncio.get_running_loop()
        while self._buffer:
            batch = [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]
            try:
                dups = await loop.run_in_executor(self.executor, self._write, batch)
            except asyncio.CancelledError:
                # Keep the rows: writing them again later is harmless (the same row is no duplicate).
                self._buffer.extendleft(reversed(batch))
                raise
            except Exception as exc:  # noqa: BLE001 - database down or failing: keep the rows, retry later
                self._buffer.extendleft(reversed(batch))
                self._backoff = min(max(self._backoff * 2, 0.2), 5.0)
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                self._on_failure()
                log.warning("history write failed, %d rows held: %s", len(self._buffer), self.last_error)
                return False
            self._backoff = 0.0
            self.last_error = None
            self._on_batch(batch, dups)
        return True

    async def write_now(self, rows: list[HistoryRow]) -> None:
        """Write rows at once (recovering a dead node's history); raises on failure."""
        if rows:
            await asyncio.get_running_loop().run_in_executor(self.executor, self._write, rows)

    def rows_pending(self) -> set[tuple[str, int, int, int]]:
        return {r[:4] for r in self._buffer}

    def _write(self, batch: list[HistoryRow]) -> int:
        days = {day_of_ms(r.scheduled_ms) for r in batch}
        raw = self.engine.raw_connection()
        try:
            for attempt in (1, 2):
                try:
                    if not days <= self._days:
                        self._ensure_days(days)
                    cur = raw.cursor()
                    try:
                        returned = execute_values(
                            cur, _INSERT, _dedupe(batch), template=_TEMPLATE, page_size=len(batch), fetch=True
                        )
                    finally:
                        cur.close()
                    raw.commit()
                    return sum(1 for (d,) in returned if d)
                except pg_errors.CheckViolation:
                    # "no partition of relation found for row": a day nobody created yet
                    raw.rollback()
                    self._days -= days
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")
        finally:
            raw.close()

    def _ensure_days(self, days: set) -> None:
        with self.engine.begin() as conn:
            created = ensure_partitions(conn, days)
        if created:
            log.info("created history partitions %s", ", ".join(created))
        self._days |= days


def _dedupe(batch: list[HistoryRow]) -> list[HistoryRow]:
    seen: dict[tuple[str, int, int, int], HistoryRow] = {}
    for r in batch:
        seen[(r.job_id, r.scheduled_ms, r.event_index, r.attempt)] = r
    return list(seen.values())


def row_to_text(row: HistoryRow) -> str:
    """A history row as kept in Redis until it is written (see the done script)."""
    return json.dumps(list(row), separators=(",", ":"))


def row_from_text(text: str | bytes) -> HistoryRow:
    return HistoryRow(*json.loads(text))
