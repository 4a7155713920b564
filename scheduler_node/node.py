"""The scheduler node: one asyncio loop drives membership, ownership, the timer, claims and
deliveries; blocking work (PostgreSQL, boto3) runs in a small thread pool.

Life of an occurrence on this node:
1. the timer pops every due (job, time) and claims them all in one Redis round trip;
2. won: deliver (renewing the claim while in flight), record history, retry with backoff,
   then mark the claim done (coalesced with other marks into one round trip);
3. lost: check back after the holder's deadline; if it vanished without finishing, take over
   (verifying first against the history when Redis had no record at all).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cronman.execution import Status, Trigger, backoff_ms, execution_id
from cronman.hashing import owned_slots
from cronman.keys import Keys
from cronman.migrate import run_maintenance
from cronman.settings import Settings
from cronman.store import make_engine
from cronman.timeutil import iso
from scheduler_node.claims import ClaimStore
from scheduler_node.dispatch import Delivery, Dispatcher, HttpDispatcher, Outcome, SqsDispatcher
from scheduler_node.feed import finished_executions, load_slots, poll_changes
from scheduler_node.history import HistoryRow, HistoryWriter, row_from_text, row_to_text
from scheduler_node.jobs import Decoder, HttpCall, JobRow, OwnedJob
from scheduler_node.membership import Membership
from scheduler_node.metrics import NodeMetrics

log = logging.getLogger("cronman.node")

_MAX_BATCH = 5000  # due executions handled per timer pass
_CHECK_MARGIN_MS = 300
_FINAL = frozenset({Status.SUCCEEDED.value, Status.PERMANENTLY_FAILED.value, Status.SKIPPED.value})
_SWEEP_SECONDS = 60.0


class Execution:
    """One occurrence of a job, as this node works on it."""

    __slots__ = ("job", "scheduled_ms", "event_index", "trigger", "id", "key", "attempt", "deadline_ms", "lost")

    def __init__(
        self, job: OwnedJob, scheduled_ms: int, keys: Keys, trigger: str = Trigger.SCHEDULE, event_index: int = 0
    ) -> None:
        self.job = job
        self.scheduled_ms = scheduled_ms
        self.event_index = event_index
        self.trigger = trigger
        self.id = execution_id(job.id, scheduled_ms, event_index, trigger)
        self.key = keys.execution(self.id)
        self.attempt = 1
        self.deadline_ms = 0
        self.lost = False

    @property
    def ident(self) -> tuple[str, int, int]:
        return (self.job.id, self.scheduled_ms, self.event_index)


class Node:
    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self.s = settings
        self.node_id = settings.node_id
        self.keys = Keys(settings.redis_prefix)
        self.clock = clock
        self.lease_ms = int(settings.lease_seconds * 1000)
        self.metrics = NodeMetrics(self.node_id)
        self.decoder = Decoder()
        # ownership and jobs
        self.live_ids: list[str] = [self.node_id]
        self.owned: frozenset[int] = frozenset()
        self.jobs: dict[str, OwnedJob] = {}
        self.feed_cursor: int | None = None
        self._seen_triggers: dict[int, int] = {}
        # timers: (due ms, job id, gen) for occurrences; (due ms, seq, Execution) for the rest
        self.fires: list[tuple[int, str, int]] = []
        self.retries: list[tuple[int, int, Execution]] = []
        self.checks: list[tuple[int, int, Execution]] = []
        self.manual: list[Execution] = []
        self.held: dict[str, Execution] = {}
        self._done_pending: list[tuple[Execution, str, str]] = []  # (execution, status, history row or '')
        self._absent_since: dict[str, float] = {}
        self._seq = itertools.count()
        self._attempts: set[asyncio.Task[None]] = set()
        self.ready = False
        self.started_at = iso(self.now_ms())
        self._stopping = False

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ lifecycle
    async def run(self, stop: asyncio.Event) -> None:
        s = self.s
        self.engine = make_engine(s.database_url, pool_size=4, max_overflow=4)
        self.redis = aioredis.from_url(s.redis_url, socket_timeout=5, socket_connect_timeout=5)
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="cronman-io")
        self.claims = ClaimStore(self.redis, self.node_id, ttl_ms=int(s.done_ttl_seconds * 1000))
        self.membership = Membership(self.redis, self.keys, self.node_id, s.heartbeat_ttl_seconds)
        m = self.metrics
        self.history = HistoryWriter(
            self.engine,
            self.executor,
            flush_seconds=s.history_flush_seconds,
            max_rows=s.history_buffer_max,
            on_batch=self._history_written,
            on_failure=m.history_failures.inc,
            on_dropped=m.history_dropped.inc,
        )
        self.dispatcher = Dispatcher(
            HttpDispatcher(s.max_in_flight), SqsDispatcher(s.sqs_endpoint_url, s.sqs_region, self.executor)
        )
        await self.dispatcher.http.start()
        self._slots = asyncio.Semaphore(s.max_in_flight)
        self._wake = asyncio.Event()
        self._sync_wake = asyncio.Event()
        self._ownership_dirty = asyncio.Event()
        self._done_wake = asyncio.Event()
        history_stop = asyncio.Event()

        from scheduler_node.web import start_web

        web = await start_web(self, s.node_host, s.node_port) if s.node_port else None
        log.info("node starting", extra={"node": self.node_id, "port": s.node_port})

        loops = [
            self._spawn(c)
            for c in (
                self._heartbeat_loop(),
                self._membership_loop(),
                self._sync_loop(),
                self._timer_loop(),
                self._notify_loop(),
                self._maintenance_loop(),
                self._sweep_recorded(),
            )
        ]
        if "hold_history" in s.faults:  # test fault: never write history (as if PostgreSQL were unreachable)
            history_stop.set()
        keepers = [
            self._spawn(self._renew_loop()),
            self._spawn(self._done_loop()),
            self._spawn(self.history.run(history_stop)),
        ]
        await stop.wait()
        log.info("node stopping", extra={"node": self.node_id, "in_flight": len(self.held)})
        self._stopping = True
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self._drain()
        history_stop.set()
        await asyncio.wait(keepers[2:], timeout=1)
        await self._final_flush()
        for t in keepers:
            t.cancel()
        await asyncio.gather(*keepers, return_exceptions=True)
        try:
            await self.membership.leave()
        except RedisError as exc:
            log.warning("could not remove the heartbeat: %s", exc)
        if web is not None:
            await web.cleanup()
        await self.dispatcher.http.close()
        await self.redis.aclose()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()
        log.info("node stopped", extra={"node": self.node_id, "history_unwritten": len(self.history)})

    def _history_written(self, rows: list[HistoryRow], duplicates: int) -> None:
        self.metrics.history_batch.observe(len(rows))
        if duplicates:
            self.metrics.duplicates.inc(duplicates)
            log.warning("duplicate deliveries detected in history", extra={"count": duplicates})
        written = [row_to_text(r) for r in rows if r.status in _FINAL]
        if written:
            self._spawn(self._forget_recorded(written))

    async def _forget_recorded(self, members: list[str]) -> None:
        try:
            await self.redis.srem(self.keys.unrecorded(self.node_id), *members)
        except (RedisError, OSError) as exc:  # the periodic sweep removes them later
            log.debug("could not clear recorded rows: %s", exc)

    async def _recover(self, node_id: str) -> None:
        """Write the history rows a node delivered but did not record before it died."""
        key = self.keys.unrecorded(node_id)
        try:
            lock = self.keys.recovery_lock(node_id)
            if node_id != self.node_id and not await self.redis.set(lock, self.node_id, nx=True, px=60_000):
                return  # another survivor is on it
            members = await self.redis.smembers(key)
            if not members:
                return
            rows = [row_from_text(m) for m in members]
            await self.history.write_now(rows)
            await self.redis.srem(key, *members)
            log.info("recovered history rows of a departed node", extra={"from_node": node_id, "rows": len(rows)})
        except Exception as exc:  # noqa: BLE001 - a later departure check or restart retries
            log.warning("could not recover history rows of %s: %s", node_id, exc)

    async def _sweep_recorded(self) -> None:
        """Drop rows from this node's unrecorded set once they are no longer waiting to be written
        (a row written before its done mark reached Redis is left behind otherwise)."""
        while True:
            await asyncio.sleep(_SWEEP_SECONDS)
            try:
                key = self.keys.unrecorded(self.node_id)
                pending = self.history.rows_pending()
                cutoff = self.now_ms() - 30_000
                stale = []
                for m in await self.redis.smembers(key):
                    row = row_from_text(m)
                    if row[:4] not in pending and (row.finished_ms or 0) < cutoff:
                        stale.append(m)
                if stale:
                    await self.redis.srem(key, *stale)
            except Exception as exc:  # noqa: BLE001 - next sweep
                log.debug("sweep of recorded rows failed: %s", exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)

    async def _drain(self, timeout: float = 20.0) -> None:
        """Let deliveries in flight finish; hand executions waiting to retry back to the replica."""
        if self._attempts:
            await asyncio.wait(list(self._attempts), timeout=timeout)
        waiting = [e for _, _, e in self.retries if not e.lost]
        if waiting:
            try:  # a deadline of 0 lets the replica take over at its next check
                await self.claims.renew(
                    [e.key for e in waiting], [self.claims.claim_value(e.attempt, 0) for e in waiting]
                )
            except RedisError as exc:
                log.warning("could not release %d claims: %s", len(waiting), exc)

    async def _final_flush(self) -> None:
        try:
            await asyncio.wait_for(self._flush_done(), 5)
        except (TimeoutError, RedisError) as exc:
            log.warning("could not mark executions done at shutdown: %s", exc)
        deadline = time.monotonic() + 10
        while len(self.history) and time.monotonic() < deadline:
            if not await self.history.flush():
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ membership and ownership
    def _info(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "pid": os.getpid(),
            "jobs": len(self.jobs),
            "slots": len(self.owned),
            "ready": self.ready,
            "port": self.s.node_port,
        }

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                await self.membership.beat(self._info())
                self.metrics.heartbeat_age.set(0)
            except (RedisError, OSError) as exc:
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.s.heartbeat_interval_seconds)
            if self.membership.last_beat:
                self.metrics.heartbeat_age.set(time.time() - self.membership.last_beat)

    async def _membership_loop(self) -> None:
        """Track the live set. A node counts as gone only after it has been missing for a heartbeat
        interval, so a Redis restart (every heartbeat lost at once) does not reshuffle ownership.
        The first ownership waits a moment for nodes starting at the same time to register."""
        s = self.s
        removal_grace = s.heartbeat_interval_seconds + s.membership_poll_seconds
        settle_until = time.monotonic() + min(s.heartbeat_interval_seconds, 2.0)
        settled = False
        await self._recover(self.node_id)  # rows a previous run under this id left unwritten
        while True:
            try:
                seen = {n.node_id for n in await self.membership.live()} | {self.node_id}
                now = time.monotonic()
                for n in seen:
                    self._absent_since.pop(n, None)
                for n in self.live_ids:
                    if n not in seen:
                        self._absent_since.setdefault(n, now)
                gone = {n for n, t in self._absent_since.items() if now - t >= removal_grace}
                for n in gone:
                    del self._absent_since[n]
                    self._spawn(self._recover(n))
                view = sorted(seen | set(self._absent_since))
                if view != self.live_ids:
                    log.info("membership changed", extra={"nodes": view, "before": self.live_ids})
                    self.live_ids = view
                    if settled:
                        self._ownership_dirty.set()
                        self._sync_wake.set()
                if not settled and now >= settle_until:
                    settled = True
                    self._ownership_dirty.set()
                    self._sync_wake.set()
                self.metrics.live_nodes.set(len(view))
            except (RedisError, OSError) as exc:
                log.warning("could not read the cluster membership: %s", exc)
            await asyncio.sleep(s.membership_poll_seconds)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _apply_ownership(self) -> None:
        new = owned_slots(self.node_id, self.live_ids, self.s.replication_factor)
        added, removed = new - self.owned, self.owned - new
        if removed:
            for job_id in [j.id for j in self.jobs.values() if j.slot in removed]:
                self.jobs.pop(job_id).gen += 1
            self.metrics.slots_moved.labels("dropped").inc(len(removed))
        loaded = 0
        if added:
            xmin, rows = await self._in_thread(load_slots, self.engine, sorted(added))
            start = self.now_ms() - int(self.s.load_grace_seconds * 1000)
            for row in rows:
                loaded += self._apply_row(row, max(start, row.updated_ms - 1))
            self.feed_cursor = xmin if self.feed_cursor is None else min(self.feed_cursor, xmin)
            self.metrics.slots_moved.labels("loaded").inc(len(added))
        self.owned = new
        self.metrics.slots_owned.set(len(new))
        self.metrics.jobs_owned.set(len(self.jobs))
        log.info(
            "ownership applied",
            extra={
                "slots_owned": len(new),
                "slots_loaded": len(added),
                "slots_dropped": len(removed),
                "jobs_loaded": loaded,
                "jobs_owned": len(self.jobs),
                "nodes": self.live_ids,
            },
        )
        self._wake.set()

    # ------------------------------------------------------------------ jobs and the change feed
    def _apply_row(self, row: JobRow, after_ms: int) -> int:
        """Install, update or remove one job from a row; returns 1 when a job was installed."""
        old = self.jobs.get(row.id)
        if old is not None and row.version <= old.version:
            return 0
        if row.deleted:
            if old is not None:
                self.jobs.pop(row.id).gen += 1
            return 0
        try:
            job = self.decoder.job(row)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("cannot schedule job: %s", exc, extra={"job_id": row.id})
            return 0
        if old is not None and old.schedule_text == job.schedule_text and old.paused == job.paused:
            job.gen = old.gen  # same timing: the pending timer entry stays valid
            self.jobs[job.id] = job
            return 1
        job.gen = old.gen + 1 if old is not None else 0
        self.jobs[job.id] = job
        if not job.paused:
            nxt = job.timing.next_after(after_ms)
            if nxt is not None:
                heapq.heappush(self.fires, (nxt, job.id, job.gen))
                self._wake.set()
        return 1

    async def _poll_changes(self) -> None:
        if self.feed_cursor is None:
            return
        xmin, rows, triggers = await self._in_thread(poll_changes, self.engine, self.feed_cursor)
        for row in rows:
            if row.slot in self.owned and self._apply_row(row, row.updated_ms - 1):
                self.metrics.changes_applied.inc()
        for t in triggers:
            if t.id in self._seen_triggers:
                continue
            self._seen_triggers[t.id] = t.requested_ms
            job = self.jobs.get(t.job_id)
            if job is not None:
                self.manual.append(Execution(job, t.requested_ms, self.keys, Trigger.MANUAL))
                self._wake.set()
        if len(self._seen_triggers) > 10_000:
            cutoff = self.now_ms() - 3_600_000
            self._seen_triggers = {k: v for k, v in self._seen_triggers.items() if v > cutoff}
        self.feed_cursor = xmin
        self.metrics.jobs_owned.set(len(self.jobs))

    async def _sync_loop(self) -> None:
        while True:
            try:
                if self._ownership_dirty.is_set():
                    self._ownership_dirty.clear()
                    try:
                        await self._apply_ownership()
                    except BaseException:
                        self._ownership_dirty.set()
                        raise
                    self.ready = True
                await self._poll_changes()
            except Exception as exc:  # noqa: BLE001 - database down: keep firing what we have, retry
                log.warning("job sync failed: %s", exc)
                await asyncio.sleep(1.0)
            try:
                await asyncio.wait_for(self._sync_wake.wait(), self.s.change_poll_seconds)
            except TimeoutError:
                pass
            self._sync_wake.clear()
            await asyncio.sleep(0.02)

    async def _notify_loop(self) -> None:
        """Redis pub/sub wakes the change feed at once; polling alone bounds the delay."""
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.changes_channel)
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None:
                        self._sync_wake.set()
            except (RedisError, OSError) as exc:
                log.debug("change notifications unavailable: %s", exc)
                await asyncio.sleep(1.0)
            finally:
                try:
                    await pubsub.aclose()
                except (RedisError, OSError):
                    pass

    async def _maintenance_loop(self) -> None:
        """Partition upkeep, run by one node at a time under a Redis lease."""
        await asyncio.sleep(1.0)
        while True:
            try:
                lease = int(self.s.maintain_interval_seconds * 900)
                if await self.redis.set(self.keys.maintenance_lock, self.node_id, nx=True, px=lease):
                    today = datetime.now(UTC).date()
                    report = await self._in_thread(
                        run_maintenance, self.engine, today, self.s.history_retention_days, self.s.partitions_ahead_days
                    )
                    log.info("maintenance done", extra={"created": report.created, "dropped": report.dropped})
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("maintenance failed: %s", exc)
            await asyncio.sleep(self.s.maintain_interval_seconds)

    # ------------------------------------------------------------------ the timer
    async def _timer_loop(self) -> None:
        while True:
            now = self.now_ms()
            due: list[Execution] = self.manual
            self.manual = []
            fires = self.fires
            while fires and fires[0][0] <= now and len(due) < _MAX_BATCH:
                when, job_id, gen = heapq.heappop(fires)
                job = self.jobs.get(job_id)
                if job is None or job.gen != gen:
                    continue
                due.append(Execution(job, when, self.keys))
                nxt = job.timing.next_after(when)
                if nxt is not None:
                    heapq.heappush(fires, (nxt, job_id, gen))
            retries = self._pop_due(self.retries, now)
            checks = self._pop_due(self.checks, now)
            try:
                if due:
                    await self._claim(due)
                for e in retries:
                    if not e.lost:
                        self._start_attempt(e)
                if checks:
                    await self._check(checks)
            except Exception:  # noqa: BLE001 - never let one pass stop the timer
                log.exception("timer pass failed")
            await self._sleep_until_next()

    @staticmethod
    def _pop_due(heap: list[tuple[int, int, Execution]], now: int) -> list[Execution]:
        out: list[Execution] = []
        while heap and heap[0][0] <= now and len(out) < _MAX_BATCH:
            out.append(heapq.heappop(heap)[2])
        return out

    async def _sleep_until_next(self) -> None:
        heads = [h[0][0] for h in (self.fires, self.retries, self.checks) if h]
        if self.manual:
            return
        delay = 0.1 if not heads else max(0.0, min(0.1, (min(heads) - self.now_ms()) / 1000))
        if delay <= 0:
            await asyncio.sleep(0)
            return
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), delay)
        except TimeoutError:
            pass

    def _later(self, heap: list[tuple[int, int, Execution]], when: int, e: Execution) -> None:
        heapq.heappush(heap, (when, next(self._seq), e))

    # ------------------------------------------------------------------ claims
    async def _claim(self, due: list[Execution]) -> None:
        now = self.now_ms()
        deadline = now + self.lease_ms
        try:
            won = await self.claims.claim([e.key for e in due], deadline)
        except (RedisError, OSError) as exc:
            log.warning("claims failed, will check back: %s", exc, extra={"executions": len(due)})
            for e in due:
                self._later(self.checks, now + 500, e)
            return
        for e, w in zip(due, won, strict=True):
            if w:
                e.deadline_ms = deadline
                self.held[e.key] = e
                self.metrics.claims.labels("won").inc()
                self._start_attempt(e)
            else:
                self.metrics.claims.labels("lost").inc()
                self._later(self.checks, deadline + _CHECK_MARGIN_MS, e)
        self.metrics.in_flight.set(len(self.held))

    async def _check(self, checks: list[Execution]) -> None:
        """Check back on executions another node claimed; take over those it abandoned."""
        now = self.now_ms()
        try:
            results = await self.claims.check([e.key for e in checks], now, now + self.lease_ms)
        except (RedisError, OSError) as exc:
            log.warning("claim checks failed: %s", exc)
            for e in checks:
                self._later(self.checks, now + 1000, e)
            return
        taken: list[Execution] = []
        for e, r in zip(checks, results, strict=True):
            if r.state == -1:
                self._later(self.checks, max(r.value, now) + _CHECK_MARGIN_MS, e)
            elif r.state in (1, 2):
                e.attempt = max(1, r.value)
                e.deadline_ms = now + self.lease_ms
                taken.append(e)
        if not taken:
            return
        try:
            finished = await self._in_thread(finished_executions, self.engine, [e.ident for e in taken])
        except Exception as exc:  # noqa: BLE001 - cannot verify: deliver (at least once)
            log.warning("could not verify takeovers against history: %s", exc)
            finished = set()
        for e in taken:
            current = self.jobs.get(e.job.id)
            if e.ident in finished or current is None:
                self._queue_done(e, "verified")
                continue
            e.job = current
            self.held[e.key] = e
            self.metrics.claims.labels("taken_over").inc()
            log.info("took over execution", extra={"job_id": e.job.id, "execution_id": e.id, "attempt": e.attempt})
            self._start_attempt(e)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.s.lease_seconds / 3)
            try:
                await self._renew(list(self.held.values()))
            except (RedisError, OSError) as exc:
                log.warning("lease renewal failed: %s", exc)

    async def _renew(self, items: list[Execution]) -> None:
        if not items:
            return
        deadline = self.now_ms() + self.lease_ms
        results = await self.claims.renew(
            [e.key for e in items], [self.claims.claim_value(e.attempt, deadline) for e in items]
        )
        for e, r in zip(items, results, strict=True):
            if r == 0:
                self._lose(e)
            else:
                e.deadline_ms = deadline

    def _lose(self, e: Execution) -> None:
        if not e.lost:
            e.lost = True
            self.held.pop(e.key, None)
            self.metrics.claims.labels("superseded").inc()
            log.warning("lost the claim on an execution", extra={"job_id": e.job.id, "execution_id": e.id})

    def _queue_done(self, e: Execution, status: str, row: str = "") -> None:
        self._done_pending.append((e, status, row))
        self._done_wake.set()

    async def _done_loop(self) -> None:
        while True:
            await self._done_wake.wait()
            self._done_wake.clear()
            try:
                await self._flush_done()
            except (RedisError, OSError) as exc:
                log.warning("marking executions done failed, retrying: %s", exc)
                await asyncio.sleep(0.5)
                self._done_wake.set()

    async def _flush_done(self) -> None:
        """Coalesced: whatever finished while the previous round trip was out goes in the next."""
        while self._done_pending:
            batch, self._done_pending = self._done_pending, []
            try:
                ok = await self.claims.done(
                    [e.key for e, _, _ in batch],
                    [f"d|{self.node_id}|{st}|{e.attempt}" for e, st, _ in batch],
                    [row for _, _, row in batch],
                    self.keys.unrecorded(self.node_id),
                )
            except BaseException:
                self._done_pending[:0] = batch
                raise
            for (e, _, _), marked in zip(batch, ok, strict=True):
                if not marked:
                    self.metrics.claims.labels("superseded").inc()
                    log.warning(
                        "another node took over an execution this node delivered",
                        extra={"job_id": e.job.id, "execution_id": e.id},
                    )

    # ------------------------------------------------------------------ delivery
    def _start_attempt(self, e: Execution) -> None:
        task = asyncio.get_running_loop().create_task(self._attempt(e))
        self._attempts.add(task)
        task.add_done_callback(self._attempts.discard)

    async def _attempt(self, e: Execution) -> None:
        async with self._slots:
            if e.lost or self._stopping and e.attempt > 1:
                return
            if self.now_ms() > e.deadline_ms - self.lease_ms // 5:
                # The lease may have run out (the process was paused or starved): confirm it first.
                try:
                    await self._renew([e])
                except (RedisError, OSError):
                    self._later(self.retries, self.now_ms() + 500, e)
                    return
                if e.lost:
                    return
            if "exit_after_claim" in self.s.faults:
                os._exit(137)  # test fault: die holding a claim, before sending
            job = e.job
            d = Delivery(job.id, e.id, iso(e.scheduled_ms), e.attempt, job.payload)
            fired = self.now_ms()
            outcome = await self.dispatcher.send(job.target, d)
            finished = self.now_ms()
        self._finish(e, outcome, fired, finished)

    def _finish(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        job = e.job
        m = self.metrics
        if e.attempt == 1:
            m.lag.observe(max(0, fired - e.scheduled_ms) / 1000)
        m.callback_latency.labels("http" if isinstance(job.target, HttpCall) else "sqs").observe(
            (finished - fired) / 1000
        )
        if outcome.ok:
            status = Status.SUCCEEDED
        elif e.attempt >= job.retry.max_attempts:
            status = Status.PERMANENTLY_FAILED
        else:
            status = Status.FAILED
        m.executions.labels(status.value).inc()
        row = self.history.add(
            HistoryRow(
                job.id,
                e.scheduled_ms,
                e.event_index,
                e.attempt,
                e.id,
                e.trigger,
                status.value,
                self.node_id,
                fired,
                finished,
                fired - e.scheduled_ms,
                outcome.http_status,
                outcome.error,
            )
        )
        m.history_buffered.set(len(self.history))
        if e.lost:
            return
        if status is Status.FAILED:
            e.attempt += 1  # when stopping, _drain hands it to the replica instead
            retry = job.retry
            self._later(
                self.retries, finished + backoff_ms(e.attempt - 1, retry.backoff_seconds, retry.max_backoff_seconds), e
            )
            self._wake.set()
            return
        self.held.pop(e.key, None)
        self._queue_done(e, status.value, row_to_text(row))
        m.in_flight.set(len(self.held))
