"""The scheduler node: it builds its ports (scheduler_node.parts) and the firing core
(scheduler_node.firer), starts its loops in order on one asyncio loop, says when it is ready, and
stops them in order. The control plane is in the parts beside it, each the one owner of its state:

- ``ownership.py``: heartbeats, the live set, the slots this node owns (rendezvous over the ready
  nodes, loading nodes waited for while their load moves), and the standings of leaders;
- ``loading.py``: the jobs of slots taken over, from where each slot's owners got;
- ``feed.py``: the change feed of the owned slots (jobs and triggers);
- ``recovery.py``: outages of the whole cluster and their misfire policy, losses of Redis's data,
  and the progress this node records for the slots it owns;
- ``configuration.py``: throttle policies, signing secrets and calendars, read whole.

A node is ready once its first ownership is loaded and what it owes is caught up; until then it
fires nothing, and its heartbeat says how far its load has come.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import secrets as tokens
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from cronman.errors import TransientError
from cronman.model.changes import Stop
from cronman.model.changes import decode as decode_changes
from cronman.model.schedule import LAZY_PHASE_MIN_MS
from cronman.model.timeutil import iso
from cronman.redis.keys import LAYOUT_VERSION
from cronman.settings import Settings
from scheduler_node.aio import wait_event
from scheduler_node.backfill import BackfillDriver
from scheduler_node.configuration import Configuration
from scheduler_node.execution import Execution
from scheduler_node.feed import Feed
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.history import HistoryRow, HistoryWriter
from scheduler_node.jobs import ALWAYS_KEPT_BYTES, Decoder, OwnedJob
from scheduler_node.loading import Loading
from scheduler_node.metrics import NodeMetrics
from scheduler_node.ownership import Ownership
from scheduler_node.parts import Claims, Membership
from scheduler_node.recovery import Recovery
from scheduler_node.senders import Senders
from scheduler_node.standby import Standby
from scheduler_node.stops import Stops
from scheduler_node.store import ClusterConfig, NodeStore
from scheduler_node.throttle import ThrottleGate
from scheduler_node.tracing import make_tracing

log = logging.getLogger("cronman.node")


@dataclass
class NodeParts:
    """Everything a node talks to: handed to the node ready-made (the simulation's, a test's), or
    built when it runs by a factory (``scheduler_node.wiring.production_parts``, or a test's that
    wraps one of those parts to inject a fault)."""

    claims: Claims
    membership: Membership
    store: NodeStore
    senders: Senders
    executor: Executor | None = None
    throttle: ThrottleGate | None = None
    # Runs until cancelled, calling back with each change notification's message (cronman.model.changes)
    notifications: Callable[[Callable[[bytes], None]], Coroutine[Any, Any, None]] | None = None
    extra_loops: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    close: Callable[[], Awaitable[None]] | None = None


PartsFactory = Callable[["Node"], Awaitable[NodeParts]]


class Node:
    """A scheduler node: it builds its parts, starts and stops them in order, and says when it is
    ready (its first ownership loaded and caught up). What it does is done by the parts beside it,
    each the one owner of its state: :class:`~scheduler_node.ownership.Ownership` (heartbeats, the
    live set, the slots owned, standings), :class:`~scheduler_node.loading.Loading` (the jobs of
    slots taken over), :class:`~scheduler_node.feed.Feed` (the change feed),
    :class:`~scheduler_node.recovery.Recovery` (outages, losses of Redis's data, progress),
    :class:`~scheduler_node.configuration.Configuration` (throttle policies, signing secrets,
    calendars), and the firing core (:class:`~scheduler_node.firer.Firer`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        parts: NodeParts | None = None,
        make_parts: PartsFactory | None = None,
        slots: int | None = None,
        incarnation: str | None = None,
        rng: random.Random | None = None,
        tuning: dict[str, Any] | None = None,
        phased_from_ms: int = LAZY_PHASE_MIN_MS,
    ) -> None:
        """``parts``, or ``make_parts`` to build them when the node runs (a node that builds its
        parts is a process of its own, and serves its HTTP endpoints). ``phased_from_ms``:
        intervals from this long keep one timing for all their jobs (see
        cronman.model.schedule.IdPhasedInterval; the simulation lowers it to drive that way too)."""
        from cronman.model.hashing import SLOTS

        self.s = settings
        self.node_id = settings.node_id
        self.incarnation = incarnation or tokens.token_hex(4)
        self.holder = f"{self.node_id}/{self.incarnation}"
        self.clock = clock
        self.slot_count = slots or SLOTS
        self.parts = parts
        self.make_parts = make_parts
        self.rng = rng or random.Random()
        self.tuning = tuning or {}  # FirerConfig fields to override (the simulation's coarser timer)
        self.phased_from_ms = phased_from_ms
        self.metrics = NodeMetrics(self.node_id)
        self.lease_ms = int(settings.lease_seconds * 1000)
        self.ready = False
        self.stopping = False
        self.started_at = iso(self.now_ms())
        self.firer: Firer | None = None
        self.history: HistoryWriter | None = None
        self.stops = Stops(self.slot_count)  # jobs heard paused or deleted before the feed said so
        self.recovery = Recovery(self)
        self.loading = Loading(self)
        self.feed = Feed(self)
        self.ownership = Ownership(self)
        self.configuration = Configuration(self)
        self._sync_wake = asyncio.Event()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def jobs(self) -> dict[str, OwnedJob]:
        return self.firer.jobs if self.firer is not None else {}

    @property
    def config(self) -> ClusterConfig:
        """The cluster-wide configuration as last read."""
        return self.configuration.current

    @property
    def owned(self) -> frozenset[int]:
        return self.ownership.owned

    @property
    def live_ids(self) -> list[str]:
        return self.ownership.live_ids

    # ------------------------------------------------------------------ lifecycle
    async def run(self, stop: asyncio.Event) -> None:
        s = self.s
        # Jobs are many and long-lived, executions short-lived and freed by reference counting:
        # collect cycles less often than the default (every 700 allocations).
        gc.set_threshold(20_000, 20, 20)
        parts = self.parts = self.parts or await self._build_parts()
        firer, history = self._make_core(parts)
        await parts.senders.start()
        history_stop = asyncio.Event()
        web = None
        if self.parts_built and s.node_port >= 0:
            from scheduler_node.web import start_web

            web, self.port = await start_web(self, s.node_host, s.node_port)
        log.info("node starting", extra={"node": self.node_id, "incarnation": self.incarnation})

        loops = [
            self._spawn(c)
            for c in (
                self.ownership.heartbeat_loop(),
                self.ownership.membership_loop(),
                self.configuration.loop(),
                self._sync_loop(),
                self.recovery.progress_loop(),
                self.ownership.standing_loop(),
                self.backfills.run(lambda: self.ready),
                firer.run_payloads(),
            )
        ]
        # The firing loops finish the pass they are in when the node stops (a claim made in Redis
        # is never left unaccounted for here), so they are stopped apart from the others.
        firing = [self._spawn(firer.run_timer()), self._spawn(firer.run_sweeper(lambda: self.ready))]
        if parts.notifications is not None:
            loops.append(self._spawn(parts.notifications(self._changed)))
        loops += [self._spawn(f()) for f in parts.extra_loops]
        keepers = [
            self._spawn(firer.run_renewer()),
            self._spawn(firer.run_done()),
            self._spawn(history.run(history_stop)),
        ]
        await stop.wait()
        log.info("node stopping", extra={"node": self.node_id, "in_flight": len(firer.held)})
        self.stopping = True
        parts.store.abandon_loads()  # a load of millions of jobs would hold the stop (its thread)
        firer.stop()
        await asyncio.wait(firing, timeout=10)
        await _cancel_all(loops + firing, "loop")
        await self.ownership.withdraw_standing()
        try:  # what it drove goes on from where it got, driven by another owner of the slot
            await asyncio.wait_for(self.backfills.release_all(), 10)
        except TimeoutError:
            log.warning("could not release the backfills this node drove")
        await firer.drain(timeout=15.0)
        await self.recovery.save_progress()
        history_stop.set()
        await asyncio.wait(keepers[2:], timeout=10)  # let a write in progress finish
        await self._flush_history(history, 10)
        await firer.settle(5.0)  # e.g. forgetting, in Redis, the history rows just written
        await _cancel_all(keepers, "keeper")
        try:
            await parts.membership.leave()
        except TransientError as exc:
            log.warning("could not remove the heartbeat: %s", exc)
        if web is not None:
            await web.cleanup()
        await parts.senders.close()
        firer.tracing.close()
        if parts.close is not None:
            await parts.close()
        log.info("node stopped", extra={"node": self.node_id, "history_unwritten": len(history)})

    parts_built = False
    port: int | None = None

    async def _build_parts(self) -> NodeParts:
        if self.make_parts is None:
            raise TypeError("a node runs with its parts, or a factory of them (scheduler_node.wiring.production_parts)")
        self.parts_built = True
        return await self.make_parts(self)

    def _make_core(self, parts: NodeParts) -> tuple[Firer, HistoryWriter]:
        """The history writer, the firing core (with its standby, when standing by is on), the
        backfill driver and the job decoder, on ``parts``."""
        s, m = self.s, self.metrics
        history = self.history = HistoryWriter(
            parts.store.write_history,
            parts.executor,
            flush_seconds=s.history_flush_seconds,
            max_rows=s.history_buffer_max,
            on_batch=self._history_written,
            on_failure=m.history_failures.inc,
            on_dropped=m.history_dropped.inc,
            on_poison=m.history_poison.inc,
            clock=asyncio.get_running_loop().time,
        )
        firer = self.firer = Firer(
            FirerConfig(
                node_id=self.node_id,
                lease_ms=self.lease_ms,
                max_in_flight=s.max_in_flight,
                namespace_share=s.namespace_inflight_share,
                # half a lease, and at most a heartbeat: a claim whose holder died is taken over
                # within a lease and a heartbeat of it, whatever the lease (see the guarantee)
                sweep_seconds=max(0.2, min(s.lease_seconds / 2, s.heartbeat_interval_seconds)),
                tick_seconds=s.timer_tick_seconds,
                unrecorded_after_ms=int(s.history_recover_after_seconds * 1000),
                done_ttl_ms=int(s.done_ttl_seconds * 1000),
                slots=self.slot_count,
                payload_horizon_ms=int(s.payload_horizon_seconds * 1000),
                **self.tuning,
            ),
            clock=self.now_ms,
            claims=parts.claims,
            senders=parts.senders,
            history=history,
            store=parts.store,
            metrics=m,
            throttle=parts.throttle,
            secrets=lambda ns: self.config.secrets.get(ns),
            screen=self.configuration.screen,
            misfire=self.recovery.misfire_of,
            rng=self.rng,
            tracing=make_tracing(s.otlp_endpoint, self.node_id),
        )
        if s.trace_jobs:
            firer.trace = _job_tracer(s.trace_jobs)
        if s.standby_grace_seconds > 0:
            firer.standby = Standby(
                self.node_id, int(s.standby_grace_seconds * 1000), max(3.0, 10 * s.standby_publish_seconds)
            )
            firer.standby.on_claim = lambda reason: m.standby_claims.labels(reason).inc()
            firer.standby.epoch = self.recovery.epoch or ""
        self.backfills = BackfillDriver(
            firer,
            parts.store,
            self.holder,
            max(3 * self.lease_ms, 5000),
            cluster_rate=s.backfill_cluster_rate,
            namespace_rate=s.quota_backfill_rate_per_namespace,
        )
        self.decoder = Decoder(parts.senders.decode, self.phased_from_ms, self.configuration.calendars)
        if firer.payloads is not None:  # loads leave the longer payloads out (see scheduler_node.payloads)
            self.decoder.payload_limit = ALWAYS_KEPT_BYTES
        return firer, history

    @staticmethod
    async def _flush_history(history: HistoryWriter, seconds: float) -> None:
        """Write what the history writer still holds, trying for ``seconds`` at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while len(history) and loop.time() < deadline:
            if not await history.flush():
                await asyncio.sleep(0.5)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro, name=getattr(coro, "__qualname__", None))

    def _changed(self, message: bytes = b"") -> None:
        """A change notification: stop at once the jobs it names as paused or deleted, then read
        the feed and the configuration."""
        if message:
            self.stops_heard(decode_changes(message))
        self._sync_wake.set()
        self.configuration.wake()
        if self.firer is not None:
            self.backfills.wake.set()

    def stops_heard(self, stops: list[Stop]) -> None:
        """Jobs paused or deleted (a notification, or this node's own auto-pause): see scheduler_node.stops."""
        if self.firer is not None and stops:
            halted = self.stops.heard(self.firer, stops, self.owned, self.now_ms())
            if halted:
                log.info("jobs stopped on notice", extra={"jobs": halted})

    def wake_sync(self) -> None:
        """Work out ownership and read the change feed now, not at the next poll."""
        self._sync_wake.set()

    def _history_written(self, rows: list[HistoryRow], duplicates: int) -> None:
        self.metrics.history_batch.observe(len(rows))
        if duplicates:
            self.metrics.duplicates.inc(duplicates)
            log.warning("duplicate deliveries detected in history", extra={"count": duplicates})
        if self.firer is not None:
            self.firer.recorded(rows)

    def info(self) -> dict[str, Any]:
        """What this node's heartbeat says of it."""
        firer = self.firer
        return {
            "started_at": self.started_at,
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "layout": LAYOUT_VERSION,
            "jobs": len(self.jobs),
            "slots": len(self.owned),
            "ready": self.ready,
            **({} if self.ready else {"loading": self.loading.moved()}),
            "port": self.port if self.port is not None else self.s.node_port,  # the port bound (for 0)
            **(firer.figures() if firer is not None else {}),
        }

    # ------------------------------------------------------------------ readiness
    async def _sync_loop(self) -> None:
        """Own the slots wanted (the first time, then becoming ready), and read the change feed."""
        while not self.stopping:
            try:
                if await self.ownership.apply_if_changed() and not self.ready:
                    await self.become_ready()
                    self.ownership.recompute_soon()  # now others' loading may count differently
                await self.feed.poll()
            except TransientError as exc:  # database down: keep firing what we have, retry
                log.warning("job sync failed: %s", exc)
                await asyncio.sleep(1.0)
            except Exception:  # noqa: BLE001 - a bug must not stop the node's sync; retried
                log.exception("job sync failed")
                await asyncio.sleep(1.0)
            await wait_event(self._sync_wake, self.s.change_poll_seconds)
            self._sync_wake.clear()
            await asyncio.sleep(0.02)

    async def become_ready(self) -> None:
        """The first ownership is loaded: if no node was firing, record the outage so that every
        node applies the misfire policy to it, classify what the loaded slots missed, and fire."""
        assert self.parts is not None and self.firer is not None
        now = self.now_ms()
        await self.recovery.judge_outage(now)
        await self.loading.catch_up_pending(now)
        self.firer.compact()  # (a table that grew as the load staged its jobs)
        self.ready = True
        self.firer.sweep_soon()  # what holders gone from the loaded slots left: taken now (see Ownership.apply)
        # Not past what the loaded slots still owe: a node that dies before claiming its catch-up
        # (or holding it back for a slot's leader) must not have recorded it as fired.
        self.firer.progress.settle(now)
        # Worked out after their catch-up was queued, it speaks for the slots just loaded.
        self.recovery.all_settled()
        await self.recovery.save_progress()


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


def make_executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="cronman-io")


def _job_tracer(pattern: str) -> Callable[[str, Execution, str], None]:
    """A firer trace that logs the steps of the executions of jobs whose id matches ``pattern``."""

    def trace(step: str, e: Execution, detail: str) -> None:
        if fnmatchcase(e.d.job_id, pattern):
            log.info(
                "execution step",
                extra={
                    "step": step,
                    "job_id": e.d.job_id,
                    "execution_id": e.id,
                    "scheduled_ms": e.scheduled_ms,
                    "detail": detail,
                },
            )

    return trace
