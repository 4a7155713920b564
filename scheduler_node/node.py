"""The scheduler node: one asyncio loop drives membership, slot ownership, the change feed and
the firing path (scheduler_node.firing); blocking work (PostgreSQL, boto3) runs in a small thread
pool. This module is the control plane: which jobs the node owns and when they next fire."""

from __future__ import annotations

import asyncio
import collections
import gc
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

from cronman import misfire
from cronman.execution import Trigger
from cronman.hashing import owned_slots
from cronman.keys import Keys
from cronman.partitions import run_maintenance
from cronman.settings import Settings
from cronman.store import make_engine
from cronman.timeutil import iso
from scheduler_node.claims import ClaimStore
from scheduler_node.commands import CommandConsumer
from scheduler_node.dispatch import Dispatcher, HttpDispatcher, Outcome, SqsDispatcher
from scheduler_node.execution import Execution
from scheduler_node.feed import (
    ClusterConfig,
    TriggerRow,
    advance_watermark,
    load_cluster_config,
    load_slots,
    poll_changes,
    read_watermark,
)
from scheduler_node.firing import FINAL, Firing, wait_event
from scheduler_node.history import HistoryRow, HistoryWriter, row_from_text, row_to_text
from scheduler_node.jobs import Decoder, JobRow, OwnedJob
from scheduler_node.membership import Membership
from scheduler_node.metrics import NodeMetrics
from scheduler_node.throttle import ThrottleGate

log = logging.getLogger("cronman.node")

_SWEEP_SECONDS = 60.0
_CONFIG_SECONDS = 5.0  # throttle policies, signing secrets and the fired-through watermark


class Node(Firing):
    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        s = self.s = settings
        self.node_id = settings.node_id
        self.keys = Keys(settings.redis_prefix)
        self.clock = clock
        self.lease_ms = int(settings.lease_seconds * 1000)
        # How far back a node looks when it takes slots over: long enough to cover owners that
        # died without anyone noticing yet (heartbeat TTL), so their occurrences are fired late
        # rather than missed. Occurrences already fired are recognised by their done marks.
        self.takeover_window_ms = int(
            max(
                s.load_grace_seconds,
                s.heartbeat_ttl_seconds
                + s.heartbeat_interval_seconds
                + s.membership_poll_seconds
                + s.lease_seconds
                + 1,
            )
            * 1000
        )
        self.metrics = NodeMetrics(self.node_id)
        self.decoder = Decoder()
        self.config = ClusterConfig({}, {})
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
        self._sending: dict[asyncio.Future[Outcome], tuple[Execution, int]] = {}
        self._queued: collections.deque[Execution] = collections.deque()
        self._reverify: list[Execution] = []
        self._marking: set[str] = set()
        self._already_written: set[str] = set()
        self.ready = False
        self.started_at = iso(self.now_ms())
        self._stopping = False

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ lifecycle
    async def run(self, stop: asyncio.Event) -> None:
        s = self.s
        # Jobs are many and long-lived, executions short-lived and freed by reference counting:
        # collect cycles less often than the default (every 700 allocations).
        gc.set_threshold(20_000, 20, 20)
        if s.done_ttl_seconds * 1000 < self.takeover_window_ms + 10_000:
            log.warning(
                "CRONMAN_DONE_TTL_SECONDS is shorter than the takeover window: occurrences a new owner "
                "re-examines may be delivered twice",
                extra={"done_ttl_seconds": s.done_ttl_seconds, "takeover_window_ms": self.takeover_window_ms},
            )
        self.engine = make_engine(s.database_url, pool_size=4, max_overflow=4)
        self.redis = aioredis.from_url(s.redis_url, socket_timeout=5, socket_connect_timeout=5)
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="cronman-io")
        self.claims = ClaimStore(self.redis, self.node_id, ttl_ms=int(s.done_ttl_seconds * 1000))
        self.throttle = ThrottleGate(self.redis, self.keys, self.lease_ms)
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
            HttpDispatcher(s.max_in_flight, dev_mode=s.dev_mode, allowlist=s.callback_allowlist),
            SqsDispatcher(s.sqs_endpoint_url, s.sqs_region, self.executor),
        )
        await self.dispatcher.http.start()
        self._wake = asyncio.Event()
        self._sync_wake = asyncio.Event()
        self._config_wake = asyncio.Event()
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
                self._config_loop(),
                self._sync_loop(),
                self._timer_loop(),
                self._notify_loop(),
                self._maintenance_loop(),
                self._sweep_recorded(),
            )
        ]
        if s.command_queue_url:  # job commands arriving through SQS (scheduler_node.commands)
            notify = lambda: self.redis.publish(self.keys.changes_channel, b"")  # noqa: E731
            loops.append(self._spawn(CommandConsumer(s, self.engine, self.executor, notify).run()))
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
        await _cancel_all(loops, "loop")
        await self._drain()
        if self.ready:
            try:  # the cluster was running until now: not a misfire for whoever starts next
                await self._in_thread(advance_watermark, self.engine, self.now_ms())
            except Exception as exc:  # noqa: BLE001
                log.warning("could not record the fired-through time: %s", exc)
        history_stop.set()
        await asyncio.wait(keepers[2:], timeout=10)  # let a write in progress finish
        await self._final_flush()
        await _cancel_all(keepers, "keeper")
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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A long-lived loop; the caller keeps the task."""
        return asyncio.get_running_loop().create_task(coro, name=getattr(coro, "__qualname__", None))

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """A short task that shutdown waits for, like a delivery."""
        task = asyncio.get_running_loop().create_task(coro)
        self._attempts.add(task)
        task.add_done_callback(self._attempts.discard)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _drain(self, timeout: float = 15.0) -> None:
        """Let deliveries in flight finish; hand executions waiting to retry, for a throttle permit
        or for a delivery slot back to the replica."""
        pending: list[asyncio.Future[Any]] = [*self._sending, *self._attempts]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        waiting = [e for _, _, e in self.retries if not e.lost]
        waiting += [e for q in self.throttle.waiting.values() for e in q if not e.lost]
        waiting += [e for e in [*self._queued, *self._reverify] if not e.lost]
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
        if self._attempts:  # e.g. clearing the rows just written from the unrecorded set
            await asyncio.wait(list(self._attempts), timeout=2)

    # ------------------------------------------------------------------ history bookkeeping
    def _history_written(self, rows: list[HistoryRow], duplicates: int) -> None:
        self.metrics.history_batch.observe(len(rows))
        if duplicates:
            self.metrics.duplicates.inc(duplicates)
            log.warning("duplicate deliveries detected in history", extra={"count": duplicates})
        written = []
        for r in rows:
            if r.status in FINAL:
                text = row_to_text(r)
                if text in self._marking:  # its done mark has not reached Redis yet: it will skip it
                    self._already_written.add(text)
                else:
                    written.append(text)
        if written:
            self._forget(written)

    def _forget(self, rows: list[str]) -> None:
        """Remove written rows from this node's unrecorded set."""
        self._background(self._forget_recorded(rows))

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
        while not self._stopping:
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
        while not self._stopping:
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
        settle_until = time.monotonic() + min(s.heartbeat_interval_seconds, 1.0)
        settled = False
        await self._recover(self.node_id)  # rows a previous run under this id left unwritten
        while not self._stopping:
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
                    self._background(self._recover(n))
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

    # ------------------------------------------------------------------ cluster-wide configuration
    async def _config_loop(self) -> None:
        """Throttle policies and signing secrets (small tables read whole), and the watermark that
        says the cluster was running until now."""
        while not self._stopping:
            try:
                self.config = await self._in_thread(load_cluster_config, self.engine)
                self.throttle.policies = self.config.throttles
                if self.ready:
                    await self._in_thread(advance_watermark, self.engine, self.now_ms())
            except Exception as exc:  # noqa: BLE001 - keep the last configuration
                log.warning("could not refresh throttle policies and signing secrets: %s", exc)
            await wait_event(self._config_wake, _CONFIG_SECONDS)  # a change notification wakes it early
            self._config_wake.clear()
            await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ ownership
    async def _apply_ownership(self) -> None:
        new = owned_slots(self.node_id, self.live_ids, self.s.replication_factor)
        added, removed = new - self.owned, self.owned - new
        if removed:
            for job_id in [j.id for j in self.jobs.values() if j.slot in removed]:
                self.jobs.pop(job_id).gen += 1
            self.metrics.slots_moved.labels("dropped").inc(len(removed))
        loaded = 0
        if added:
            xmin, loaded_jobs = await self._in_thread(load_slots, self.engine, sorted(added), self.decoder)
            watermark = await self._in_thread(read_watermark, self.engine)
            window_start = self.now_ms() - self.takeover_window_ms
            # The cluster was down from the watermark until now: those occurrences are misfires.
            outage_since = watermark if watermark is not None and watermark < window_start else None
            install = self._install
            for job, updated_ms in loaded_jobs:
                loaded += install(job, max(window_start, updated_ms - 1), updated_ms, outage_since)
            del loaded_jobs
            gc.freeze()  # the loaded jobs live long: keep them out of every future collection
            self.feed_cursor = xmin if self.feed_cursor is None else min(self.feed_cursor, xmin)
            self.metrics.slots_moved.labels("loaded").inc(len(added))
            if outage_since is not None:
                log.warning(
                    "no scheduler was running since the watermark: applying misfire policies",
                    extra={"since": iso(outage_since), "until": iso(window_start)},
                )
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
        """Install, update or remove one job from a change-feed row; 1 when a job was installed."""
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
        return self._install(job, after_ms, row.updated_ms)

    def _install(self, job: OwnedJob, after_ms: int, updated_ms: int, outage_since: int | None = None) -> int:
        """Install a job (or a newer version of one); its next occurrence is the first after
        ``after_ms``. Returns 1 when installed."""
        old = self.jobs.get(job.id)
        if old is not None:
            if job.version <= old.version:
                return 0
            if old.timing == job.timing and old.paused == job.paused:
                job.gen = old.gen  # same timing: the pending timer entry stays valid
                self.jobs[job.id] = job
                return 1
            job.gen = old.gen + 1
        self.jobs[job.id] = job
        if not job.paused:
            if outage_since is not None:
                self._plan_misfire(job, max(outage_since, updated_ms - 1), after_ms)
            nxt = job.timing.next_after(after_ms)
            if nxt is not None:
                heapq.heappush(self.fires, (nxt, job.id, job.gen))
        self._wake.set()
        return 1

    def _plan_misfire(self, job: OwnedJob, since_ms: int, until_ms: int) -> None:
        """Queue what the job's misfire policy makes of the occurrences in (since, until]. The
        decision travels with one execution, so the node that wins its claim records it once."""
        plan = misfire.plan(job.timing, since_ms, until_ms, job.opts.misfire, job.opts.catchup_ms)
        if plan.last_missed is None:
            return
        executions = [
            Execution(job, t, self.keys, event_index=i) for t in plan.fire for i in range(job.opts.events)
        ] or [Execution(job, plan.last_missed, self.keys)]
        executions[0].misfire = plan
        self.manual.extend(executions)

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
                self.manual.extend(self._triggered(job, t))
                self._wake.set()
        if len(self._seen_triggers) > 10_000:
            cutoff = self.now_ms() - 3_600_000
            self._seen_triggers = {k: v for k, v in self._seen_triggers.items() if v > cutoff}
        self.feed_cursor = xmin
        self.metrics.jobs_owned.set(len(self.jobs))

    def _triggered(self, job: OwnedJob, t: TriggerRow) -> list[Execution]:
        if t.kind == "redeliver" and t.scheduled_ms is not None and t.execution_id:
            # The same execution again, under its own id, as the next attempt; a claim key of its own.
            e = Execution(
                job,
                t.scheduled_ms,
                self.keys,
                t.trigger or Trigger.SCHEDULE,
                t.event_index or 0,
                exec_id=t.execution_id,
                key_suffix=f":r{t.id}",
            )
            e.attempt = t.attempt or 1
            return [e]
        return [Execution(job, t.requested_ms, self.keys, Trigger.MANUAL, i) for i in range(job.opts.events)]

    async def _sync_loop(self) -> None:
        while not self._stopping:
            try:
                if self._ownership_dirty.is_set():
                    self._ownership_dirty.clear()
                    try:
                        await self._apply_ownership()
                    except BaseException:
                        self._ownership_dirty.set()
                        raise
                    if not self.ready:
                        self.ready = True
                        await self._in_thread(advance_watermark, self.engine, self.now_ms())
                await self._poll_changes()
            except Exception as exc:  # noqa: BLE001 - database down: keep firing what we have, retry
                log.warning("job sync failed: %s", exc)
                await asyncio.sleep(1.0)
            await wait_event(self._sync_wake, self.s.change_poll_seconds)
            self._sync_wake.clear()
            await asyncio.sleep(0.02)

    async def _notify_loop(self) -> None:
        """Redis pub/sub wakes the change feed at once; polling alone bounds the delay."""
        while not self._stopping:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.changes_channel)
                while not self._stopping:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None:
                        self._sync_wake.set()
                        self._config_wake.set()
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
        while not self._stopping:
            try:
                lease = int(self.s.maintain_interval_seconds * 900)
                if await self.redis.set(self.keys.maintenance_lock, self.node_id, nx=True, px=lease):
                    today = datetime.now(UTC).date()
                    report = await self._in_thread(
                        run_maintenance, self.engine, today, self.s.history_retention_days, self.s.partitions_ahead_days
                    )
                    log.info(
                        "maintenance done",
                        extra={"partitions_created": report.created, "partitions_dropped": report.dropped},
                    )
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("maintenance failed: %s", exc)
            await asyncio.sleep(self.s.maintain_interval_seconds)


async def _cancel_all(tasks: list[asyncio.Task[None]], what: str, timeout: float = 5.0) -> None:
    """Cancel long-lived tasks and wait for them, but not forever: a stop must not hang on one
    that ignores its cancellation (it is named in the log instead)."""
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for t in pending:
        log.warning("a %s did not stop when cancelled", what, extra={"task": t.get_name()})
