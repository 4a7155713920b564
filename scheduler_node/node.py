"""The scheduler node: it wires its parts (scheduler_node.parts) around the firing core
(scheduler_node.firer) and runs the control plane on one asyncio loop: membership, which slots it
owns, the jobs of those slots and their changes, how far it has fired, and what a slot taken over
still owes.

Ownership. A slot belongs to the top ``replication_factor`` nodes by rendezvous score among the
nodes that are ready. A node that is still loading counts only for itself and, while its load
moves (its heartbeat says how many jobs it has read and caught up) and for ``load_grace_seconds``
after it last moved, for the slots others would hand it: they keep firing those until it is ready,
so a long load misses nothing, at a cold start of the whole cluster each node loads only its
share, and a node whose load has stalled is not waited for (when its grace runs out, ownership is
computed again at once: slots whose owners are all stuck loading go to ready nodes). A grace
counted from when the node was first seen loading made every node of a cluster holding a million
jobs load a slower neighbour's share, seconds before the neighbour was ready, and drop it again.

What a slot owes. Every node records how far it has fired the slots it owns (``node_progress``).
A node that takes a slot over resumes from the furthest point any of the slot's owners reached,
so occurrences due while any node was alive are delivered, late, whatever mix of crashes, joins
and leaves moved the slot. Only occurrences due while no scheduler ran at all (an outage of the
whole cluster, recorded in ``cluster_outages`` by the first node back) get the job's misfire policy.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os
import random
import secrets as tokens
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from cronman.calendars import CalendarTiming, SkipSummary, skip_summary, timing_with
from cronman.changes import Stop
from cronman.changes import decode as decode_changes
from cronman.cluster import overdue_after
from cronman.errors import TransientError
from cronman.execution import Status, Trigger, backfill_of
from cronman.hashing import shared_ownership
from cronman.keys import LAYOUT_VERSION
from cronman.schedule import LAZY_PHASE_MIN_MS, Timing
from cronman.settings import Settings
from cronman.timeutil import iso
from scheduler_node.backfill import BackfillDriver
from scheduler_node.execution import Execution
from scheduler_node.feed import Feed
from scheduler_node.firer import Firer, FirerConfig, wait_event
from scheduler_node.history import HistoryRow, HistoryWriter
from scheduler_node.jobs import CalendarBook, Decoder, JobRow, OwnedJob, WithCalendars
from scheduler_node.loading import Loading
from scheduler_node.membership import overdue
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import Claims, Membership
from scheduler_node.recovery import Recovery
from scheduler_node.senders import Senders
from scheduler_node.standby import Standby
from scheduler_node.stops import Stops
from scheduler_node.store import ClusterConfig, NodeStore
from scheduler_node.throttle import ThrottleGate
from scheduler_node.tracing import make_tracing

log = logging.getLogger("cronman.node")

_CONFIG_SECONDS = 5.0  # throttle policies, signing secrets and calendars
_TRIGGERS_AGAIN_TRIES = 120  # reads of recent triggers after a loss of Redis's data, a second apart


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
    # Runs until cancelled, calling back with each change notification's message (cronman.changes)
    notifications: Callable[[Callable[[bytes], None]], Coroutine[Any, Any, None]] | None = None
    extra_loops: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    close: Callable[[], Awaitable[None]] | None = None


PartsFactory = Callable[["Node"], Awaitable[NodeParts]]


class Node:
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
        cronman.schedule.IdPhasedInterval; the simulation lowers it to drive that way too)."""
        from cronman.hashing import SLOTS

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
        self.config = ClusterConfig({}, {})
        self.calendars = CalendarBook()  # the calendars the timings of jobs that name them look up
        self.live_ids: list[str] = [self.node_id]
        self.owned: frozenset[int] = frozenset()
        self.ready = False
        self.started_at = iso(self.now_ms())
        # node id -> (what its heartbeat last said it had loaded, when that was first seen): a
        # node still loading counts as loading while its load moves (see _wanted)
        self._loading: dict[str, tuple[Any, float]] = {}
        self._waited: frozenset[str] = frozenset()  # loading nodes whose load moved within the grace (see _wanted)
        self._absent_since: dict[str, float] = {}
        self._members: dict[str, bool] = {}  # node id -> ready, as last seen
        self.stopping = False
        self._seen: dict[str, float] = {}  # incarnation -> when its heartbeat was last seen (loop time)
        self.firer: Firer | None = None
        self.history: HistoryWriter | None = None
        self.stops = Stops(self.slot_count)  # jobs heard paused or deleted before the feed said so
        self.recovery = Recovery(self)
        self.loading = Loading(self)
        self.feed = Feed(self)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def jobs(self) -> dict[str, OwnedJob]:
        return self.firer.jobs if self.firer is not None else {}

    # ------------------------------------------------------------------ lifecycle
    async def run(self, stop: asyncio.Event) -> None:
        s = self.s
        # Jobs are many and long-lived, executions short-lived and freed by reference counting:
        # collect cycles less often than the default (every 700 allocations).
        gc.set_threshold(20_000, 20, 20)
        parts = self.parts = self.parts or await self._build_parts()
        m = self.metrics
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
            screen=self._screen,
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
        self.decoder = Decoder(parts.senders.decode, self.phased_from_ms, self.calendars)
        await parts.senders.start()
        self._sync_wake = asyncio.Event()
        self._config_wake = asyncio.Event()
        self._ownership_dirty = asyncio.Event()
        history_stop = asyncio.Event()
        web = None
        if self.parts_built and s.node_port >= 0:
            from scheduler_node.web import start_web

            web, self.port = await start_web(self, s.node_host, s.node_port)
        log.info("node starting", extra={"node": self.node_id, "incarnation": self.incarnation})

        loops = [
            self._spawn(c)
            for c in (
                self._heartbeat_loop(),
                self._membership_loop(),
                self._config_loop(),
                self._sync_loop(),
                self.recovery.progress_loop(),
                self._standing_loop(),
                self.backfills.run(lambda: self.ready),
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
        await self._withdraw_standing()
        try:  # what it drove goes on from where it got, driven by another owner of the slot
            await asyncio.wait_for(self.backfills.release_all(), 10)
        except TimeoutError:
            log.warning("could not release the backfills this node drove")
        await firer.drain(timeout=15.0)
        await self.recovery.save_progress()
        history_stop.set()
        await asyncio.wait(keepers[2:], timeout=10)  # let a write in progress finish
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(history) and loop.time() < deadline:
            if not await history.flush():
                await asyncio.sleep(0.5)
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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro, name=getattr(coro, "__qualname__", None))

    def _changed(self, message: bytes = b"") -> None:
        """A change notification: stop at once the jobs it names as paused or deleted, then read
        the feed and the configuration."""
        if message:
            self.stops_heard(decode_changes(message))
        self._sync_wake.set()
        self._config_wake.set()
        if self.firer is not None:
            self.backfills.wake.set()

    def stops_heard(self, stops: list[Stop]) -> None:
        """Jobs paused or deleted (a notification, or this node's own auto-pause): see scheduler_node.stops."""
        if self.firer is not None and stops:
            halted = self.stops.heard(self.firer, stops, self.owned, self.now_ms())
            if halted:
                log.info("jobs stopped on notice", extra={"jobs": halted})

    # ------------------------------------------------------------------ history bookkeeping
    def _history_written(self, rows: list[HistoryRow], duplicates: int) -> None:
        self.metrics.history_batch.observe(len(rows))
        if duplicates:
            self.metrics.duplicates.inc(duplicates)
            log.warning("duplicate deliveries detected in history", extra={"count": duplicates})
        if self.firer is not None:
            self.firer.recorded(rows)

    # ------------------------------------------------------------------ membership and ownership
    def _info(self) -> dict[str, Any]:
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

    async def _heartbeat_loop(self) -> None:
        assert self.parts is not None
        while not self.stopping:
            try:
                progress = self.firer.progress_ms if self.firer is not None and self.ready else None
                beat = await self.parts.membership.beat(self._info(), progress)
                self.metrics.heartbeat_age.set(0)
                self.recovery.heard(beat.epoch, beat.progress_ms)
            except TransientError as exc:
                log.warning("heartbeat failed: %s", exc)
            self.recovery.record_losses_soon()
            await asyncio.sleep(self.s.heartbeat_interval_seconds)

    async def _membership_loop(self) -> None:
        """Track the live set. A node counts as gone only after it has been missing for a heartbeat
        interval and more, so a Redis restart (every heartbeat lost at once) does not reshuffle
        ownership. The first ownership waits a moment for nodes starting at the same time."""
        assert self.parts is not None
        s = self.s
        loop = asyncio.get_running_loop()
        removal_grace = s.heartbeat_interval_seconds + s.membership_poll_seconds
        settle_until = loop.time() + min(s.heartbeat_interval_seconds, 1.0)
        settled = False
        late_after = overdue_after(s.heartbeat_interval_seconds)
        reached: float | None = None  # since when this node has read the live set without a failure
        while not self.stopping:
            try:
                members = await self.parts.membership.live()
                now = loop.time()
                reached = now if reached is None else reached
                for m in members:  # (a dead node's heartbeat stays listed until its TTL runs out)
                    self._seen[str(m.info.get("incarnation", ""))] = now - m.age_s
                if len(self._seen) > 4 * len(members) + 100:  # forget the long gone
                    ttl = s.heartbeat_ttl_seconds
                    self._seen = {i: t for i, t in self._seen.items() if now - t <= 2 * ttl}
                # Routed around at once, without the grace of a node missing from a read: silent for
                # two beats already (see membership.overdue).
                late = overdue(members, self.node_id, late_after, now - reached)
                seen = {m.node_id: m.ready for m in members if m.node_id not in late}
                moved = {m.node_id: m.info.get("loading") for m in members}
                seen[self.node_id] = self.ready
                for n in seen:
                    self._absent_since.pop(n, None)
                for n in late:
                    self._absent_since.pop(n, None)
                    self._loading.pop(n, None)
                for n in self._members:
                    if n not in seen and n not in late:
                        self._absent_since.setdefault(n, now)
                for n, t in list(self._absent_since.items()):
                    if now - t >= removal_grace:
                        del self._absent_since[n]
                        self._loading.pop(n, None)
                view = {**{n: self._members[n] for n in self._absent_since if n in self._members}, **seen}
                for n, ready in view.items():
                    if ready:
                        self._loading.pop(n, None)
                        continue
                    was, mark = self._loading.get(n), moved.get(n)
                    if was is None or (mark is not None and mark != was[0]):
                        self._loading[n] = (mark, now)
                # loading nodes still waited for: one whose load stopped moving is not, after the grace
                waited = frozenset(n for n, (_, t) in self._loading.items() if now - t < s.load_grace_seconds)
                if view != self._members or waited != self._waited:
                    if view != self._members:
                        log.info("membership changed", extra={"nodes": sorted(view), "before": sorted(self._members)})
                    self._members, self._waited = view, waited
                    if settled:
                        self._ownership_dirty.set()
                        self._sync_wake.set()
                if not settled and now >= settle_until:
                    settled = True
                    self._ownership_dirty.set()
                    self._sync_wake.set()
                self.live_ids = sorted(view)
                self.metrics.live_nodes.set(len(view))
            except TransientError as exc:
                log.warning("could not read the cluster membership: %s", exc)
                reached = None
            await asyncio.sleep(s.membership_poll_seconds)

    async def _wanted(self) -> frozenset[int]:
        """The slots this node should own now (see the module docstring). The rendezvous table is
        kept by :func:`cronman.hashing.shared_ownership` (each node's scores computed once); what a
        membership change costs, a whole table at a cold start, is paid in the node's worker
        threads, so timers and lease renewals on this loop never wait for it."""
        ready = {n for n, r in self._members.items() if r}
        loading = {n for n in self._waited if n in self._members}  # (their grace is judged in _membership_loop)
        me, ownership = self.node_id, shared_ownership(self.s.replication_factor, self.slot_count)
        with_loading, without = frozenset(ready | loading | {me}), frozenset(ready | {me})

        def compute() -> tuple[frozenset[int], frozenset[int]]:
            return ownership.owned(me, with_loading), ownership.owned(me, without)

        executor = self.parts.executor if self.parts is not None else None
        take, keep = await asyncio.get_running_loop().run_in_executor(executor, compute)
        if not self.ready:
            return take
        return take | (self.owned & keep)

    async def _apply_ownership(self) -> None:
        assert self.parts is not None and self.firer is not None
        new = await self._wanted()
        added, removed = new - self.owned, self.owned - new
        standby = self.firer.standby
        if removed:
            self.firer.set_slots(self.owned - removed)
            self.owned = self.owned - removed
            self.recovery.slots_dropped(removed)
            if standby is not None:
                standby.set_owned(self.owned)
            self.metrics.slots_moved.labels("dropped").inc(len(removed))
        loaded = 0
        if added:
            # The firer owns the slots before their jobs are installed: a catch-up occurrence its
            # timer claims meanwhile must not look like one of a slot that moved away.
            self.firer.set_slots(self.owned | added)
            try:
                loaded = await self.loading.load(sorted(added))
            except BaseException:
                self.firer.set_slots(self.owned)
                raise
            loaded_at = self.now_ms()
            self.recovery.slots_loaded(added, loaded_at)
            self.owned = self.owned | added
            if standby is not None:
                standby.loaded(sorted(added))
                standby.cursor = self.feed.cursor or 0
                standby.set_owned(self.owned)
            self.metrics.slots_moved.labels("loaded").inc(len(added))
            # What their holders left is taken now, not up to a sweep interval (3.1 s at the default
            # lease) later: a crashed node's claims, lost to a node that left before checking back
            # on them, waited for the departure's grace and then for that sweep, and were taken
            # over 14 s after they were due at the default timings, past the 13 s bound
            # (tests/cluster/test_incidents_at_defaults.py).
            self.firer.sweep_soon()
        self.metrics.slots_owned.set(len(self.owned))
        if added or removed:
            self.firer.compact()
        self.metrics.jobs_owned.set(len(self.jobs))
        log.info(
            "ownership applied",
            extra={
                "slots_owned": len(self.owned),
                "slots_loaded": len(added),
                "slots_dropped": len(removed),
                "jobs_loaded": loaded,
                "jobs_owned": len(self.jobs),
                "nodes": self.live_ids,
            },
        )

    async def _become_ready(self) -> None:
        """The first ownership is loaded: classify what the loaded slots missed, and if no node
        was firing, record the outage so that every node applies the misfire policy to it."""
        assert self.parts is not None and self.firer is not None
        now = self.now_ms()
        await self.recovery.judge_outage(now)
        await self.loading.catch_up_pending(now)
        self.firer.compact()  # (a table that grew as the load staged its jobs)
        self.ready = True
        self.firer.sweep_soon()  # what holders gone from the loaded slots left: taken now (see _apply_ownership)
        # Not past what the loaded slots still owe: a node that dies before claiming its catch-up
        # (or holding it back for a slot's leader) must not have recorded it as fired.
        self.firer.settle_progress(now)
        # Worked out after their catch-up was queued, it speaks for the slots just loaded.
        self.recovery.all_settled()
        await self.recovery.save_progress()

    def heard_since(self, t: float) -> list[str]:
        """The incarnations whose heartbeat was seen from ``t`` on (loop time)."""
        return [i for i, seen in self._seen.items() if seen >= t]

    # ------------------------------------------------------------------ leading and standing by
    async def _standing_loop(self) -> None:
        """Publish how far this node has claimed the slots it leads, and read how far the others
        have (scheduler_node.standby). A stopping node withdraws its standing at once."""
        assert self.parts is not None and self.firer is not None
        standby = self.firer.standby
        if standby is None:
            return
        loop = asyncio.get_running_loop()
        beats = itertools.count(1)
        while not self.stopping:
            firer = self.firer
            st = firer.standing
            mine = replace(st, beat=next(beats)).encode() if self.ready and st is not None else None
            try:
                texts = await self.parts.membership.stand(mine)
                live = frozenset(n for n, r in self._members.items() if r)
                standby.standings(texts, live, loop.time(), self.now_ms())
            except TransientError as exc:  # (heartbeats say so too) peers' standings go stale: claim
                log.debug("could not exchange standings: %s", exc)
            await asyncio.sleep(self.s.standby_publish_seconds)

    async def _withdraw_standing(self) -> None:
        """The node stopped firing: the slots it led are claimed on time by their other owners."""
        assert self.parts is not None
        if self.firer is None or self.firer.standby is None:
            return
        try:
            await asyncio.wait_for(self.parts.membership.stand(None), 2.0)
        except (TransientError, TimeoutError) as exc:
            log.warning("could not withdraw this node's standing (the others judge it stale within seconds): %s", exc)

    # ------------------------------------------------------------------ how far this node fired
    # ------------------------------------------------------------------ cluster-wide configuration
    async def _config_loop(self) -> None:
        """Throttle policies and signing secrets (small tables read whole)."""
        assert self.parts is not None
        while not self.stopping:
            try:
                self.set_config(await self.parts.store.cluster_config())
            except TransientError as exc:
                log.warning("could not refresh throttle policies, signing secrets and calendars: %s", exc)
            await wait_event(self._config_wake, _CONFIG_SECONDS)  # a change notification wakes it early
            self._config_wake.clear()
            await asyncio.sleep(0.2)

    def set_config(self, config: ClusterConfig) -> None:
        assert self.parts is not None
        self.config = config
        if self.parts.throttle is not None:
            self.parts.throttle.policies = config.throttles
        changed = self.calendars.take(config.calendars)
        if changed and self.firer is not None:
            # The timer may have jumped over days a calendar excluded before: the jobs that name a
            # changed calendar work out their next occurrence again (only those: found by name).
            for timing in self.calendars.users(changed):
                self.firer.retime(timing.job_id, timing, timing.resume_after)

    # ------------------------------------------------------------------ calendars and backfills
    def timing_of(self, job: OwnedJob, timing: Timing | None = None) -> Timing:
        """The job's timing with its calendars: the occurrences that are due at all. ``timing``:
        the job's own, when the caller has made it already (see OwnedJob.timing)."""
        if timing is None:
            timing = job.timing
        if isinstance(timing, WithCalendars):
            return timing.due()
        names = job.opts.calendars
        if not names:
            return timing
        found = {n: c for n in names if (c := self.config.calendars.get((job.namespace, n))) is not None}
        return timing_with(timing, names, found)

    def _screen(self, e: Execution) -> tuple[Status, str] | tuple[Status, str, SkipSummary | None] | None:
        """Before a won execution is sent: an occurrence on a day a calendar of its job excludes is
        skipped (a redelivery, asked for by a user, is not), its row standing for the occurrences of
        the excluded span from it on (the timer fires only the first of a span); one of a cancelled
        backfill is cancelled."""
        d = e.d
        if d.trigger == Trigger.SCHEDULE:
            if not e.job.opts.calendars or d.suffix:
                return None
            why = self._excluded_by(e.job, d.scheduled_ms)
            if why is None:
                return None
            due = self.timing_of(e.job)
            summary = skip_summary(due, d.scheduled_ms) if isinstance(due, CalendarTiming) else None
            if summary is not None and not summary.complete:
                why += f"; the first {summary.occurrences} occurrences of the span counted"
            return Status.SKIPPED, why, summary
        backfill = backfill_of(d.trigger)
        if backfill is not None and backfill in self.backfills.cancelled:
            return Status.CANCELLED, f"the backfill {backfill} was cancelled"
        return None

    def names_unknown_calendar(self, row: JobRow) -> bool:
        if row.deleted or '"calendars"' not in row.options_text:
            return False
        try:
            names = self.decoder.options(row.options_text).calendars
        except (ValueError, TypeError):
            return False
        return any((row.namespace, n) not in self.config.calendars for n in names)

    def _excluded_by(self, job: OwnedJob, t: int) -> str | None:
        for name in job.opts.calendars:
            cal = self.config.calendars.get((job.namespace, name))
            if cal is not None and cal.excludes(t):
                return f"calendar {name}: {cal.local_date(t).isoformat()} is excluded ({cal.timezone})"
        return None

    async def _sync_loop(self) -> None:
        while not self.stopping:
            try:
                if self._ownership_dirty.is_set():
                    self._ownership_dirty.clear()
                    try:
                        await self._apply_ownership()
                    except BaseException:
                        self._ownership_dirty.set()
                        raise
                    if not self.ready:
                        await self._become_ready()
                        self._ownership_dirty.set()  # now others' loading may count differently
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
