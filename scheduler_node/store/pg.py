"""The node store on PostgreSQL: :class:`PgNodeStore` runs each call's blocking SQL in the node's
thread pool, and tells the database being unavailable apart (a TransientError). The SQL is in its
parts, each the one owner of what it keeps: the jobs and the feed (``feed``), the cluster's small
tables (``tables``), progress and outages (``progress``), backfills (``backfill_rows``) and
history (``history``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

import psycopg2
import sqlalchemy.exc
from sqlalchemy import Engine

from cronman.errors import TransientError
from cronman.model.calendars import Calendar
from cronman.model.changes import Stop
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import Decoder, JobRow, Loaded
from scheduler_node.store.backfills import Backfills
from scheduler_node.store.feed import JobFeed
from scheduler_node.store.history import History
from scheduler_node.store.port import (
    AsyncRun,
    Attempts,
    BackfillRow,
    ClusterConfig,
    Ident,
    NodeStore,
    PayloadRow,
    RunStart,
    SlotMarks,
    TriggerRow,
    Upstreams,
)
from scheduler_node.store.progress import Progress
from scheduler_node.store.tables import ClusterTables
from scheduler_node.store.waits import Waits

T = TypeVar("T")

UNAVAILABLE = (
    psycopg2.OperationalError,
    psycopg2.InterfaceError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
)


def _transient(exc: Exception) -> TransientError:
    return TransientError(f"database: {type(exc).__name__}: {str(exc).strip()[:200]}")


class PgNodeStore(NodeStore):
    def __init__(self, engine: Engine, executor: Executor) -> None:
        self.engine = engine
        self.executor = executor
        self.feed = JobFeed(engine)
        self.tables = ClusterTables(engine)
        self.progress = Progress(engine)
        self.backfill_rows = Backfills(engine)
        self.history = History(engine)
        self.waits = Waits(engine)

    @property
    def rows_loaded(self) -> int:
        return self.feed.rows_loaded

    @rows_loaded.setter
    def rows_loaded(self, count: int) -> None:
        self.feed.rows_loaded = count

    @property
    def on_paused(self) -> Callable[[list[Stop]], None]:
        """Told of the jobs a history write paused (auto-pause), from the writing thread, once the
        write has committed."""
        return self.history.on_paused

    @on_paused.setter
    def on_paused(self, tell: Callable[[list[Stop]], None]) -> None:
        self.history.on_paused = tell

    def abandon_loads(self) -> None:
        self.feed.abandon_loads()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        except UNAVAILABLE as exc:
            raise _transient(exc) from exc

    # -- jobs and the feed
    async def load_slots(self, slots: Sequence[int], decoder: Decoder) -> tuple[int, Loaded]:
        return await self._call(self.feed.load_slots, list(slots), decoder)

    async def poll_changes(
        self, cursor: int, slots: Collection[int] | None = None
    ) -> tuple[int, list[JobRow], list[TriggerRow]]:
        return await self._call(self.feed.poll_changes, cursor, None if slots is None else sorted(slots))

    async def recent_triggers(self, slots: Sequence[int], since_ms: int) -> list[TriggerRow]:
        return await self._call(self.feed.recent_triggers, list(slots), since_ms)

    async def live_incarnations(self, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        return await self._call(self.feed.live_incarnations, list(job_ids))

    async def payloads(self, job_ids: Sequence[str]) -> dict[str, PayloadRow]:
        return await self._call(self.feed.payloads, list(job_ids))

    async def delete_completed(self, jobs: Sequence[tuple[str, int]]) -> list[str]:
        return await self._call(self.feed.delete_completed, list(jobs))

    # -- throttles, secrets, calendars
    async def cluster_config(self) -> ClusterConfig:
        return await self._call(self.tables.cluster_config)

    def calendars(self) -> dict[tuple[str, str], Calendar]:
        """Blocking: every calendar, by (namespace, name) (see scheduler_node.store.tables)."""
        return self.tables.calendars()

    # -- progress and outages
    async def save_progress(
        self,
        node_id: str,
        incarnation: str,
        fired_through_ms: int,
        slots: bytes,
        epoch: str | None,
        firing_ms: int | None = None,
        open_ms: int | None = None,
    ) -> None:
        await self._call(
            self.progress.save_progress, node_id, incarnation, fired_through_ms, slots, epoch, firing_ms, open_ms
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
        return await self._call(self.progress.lose_epoch, epoch, current, since_ms, node_id, reach_ms, sorted(live))

    async def unnoticed_losses(
        self, current: str, reach_ms: int, margin_ms: int, node_id: str
    ) -> list[tuple[str, int]]:
        return await self._call(self.progress.unnoticed_losses, current, reach_ms, margin_ms, node_id)

    async def slot_marks(self) -> SlotMarks:
        return await self._call(self.progress.slot_marks)

    async def back(
        self, mark_ms: int | None, now_ms: int, outage_after_ms: int, node_id: str
    ) -> tuple[int, int] | None:
        return await self._call(self.progress.back, mark_ms, now_ms, outage_after_ms, node_id)

    async def outages(self, since_ms: int) -> list[tuple[int, int]]:
        return await self._call(self.progress.outages, since_ms)

    # -- backfills
    async def backfills(self) -> list[BackfillRow]:
        return await self._call(self.backfill_rows.backfills)

    async def backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
        return await self._call(self.backfill_rows.backfill_changes, cursor)

    async def backfill_timing(self, backfill_id: str) -> str | None:
        return await self._call(self.backfill_rows.backfill_timing, backfill_id)

    async def lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        return await self._call(self.backfill_rows.lease_backfill, backfill_id, holder, lease_ms)

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
        return await self._call(self.backfill_rows.renew_backfill, params)

    async def end_backfill(self, backfill_id: str, reason: str) -> None:
        await self._call(self.backfill_rows.end_backfill, backfill_id, reason)

    async def end_orphaned_backfill(self, backfill_id: str) -> bool:
        return await self._call(self.backfill_rows.end_orphaned_backfill, backfill_id)

    # -- history
    async def attempts(self, idents: Sequence[Ident]) -> dict[Ident, Attempts]:
        return await self._call(self.history.attempts, list(idents))

    # -- what executions wait for
    async def start_runs(self, runs: Sequence[RunStart]) -> dict[str, tuple[bool, AsyncRun]]:
        return await self._call(self.waits.start_runs, list(runs))

    async def async_runs(self, execution_ids: Sequence[str]) -> dict[str, AsyncRun]:
        return await self._call(self.waits.async_runs, list(execution_ids))

    async def time_out_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        return await self._call(self.waits.time_out_runs, list(items))

    async def unaccept_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        return await self._call(self.waits.unaccept_runs, list(items))

    async def last_successes(self, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, int]]:
        return await self._call(self.waits.last_successes, list(wanted))

    async def upstreams_of(self, execution_ids: Sequence[str]) -> dict[str, Upstreams]:
        return await self._call(self.waits.upstreams_of, list(execution_ids))

    async def record_upstreams(self, rows: Sequence[tuple[str, str, str, Upstreams]]) -> None:
        await self._call(self.waits.record_upstreams, list(rows))

    def write_history(self, rows: list[HistoryRow]) -> int:
        try:
            return self.history.write(rows)[0]
        except UNAVAILABLE as exc:
            raise _transient(exc) from exc

    def write_late(self, rows: list[HistoryRow]) -> int:
        """Blocking: the watchdog's rows for late occurrences; returns how many are new."""
        try:
            return self.history.write(rows)[1]
        except UNAVAILABLE as exc:
            raise _transient(exc) from exc
