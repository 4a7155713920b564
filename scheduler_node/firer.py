"""The firing core: the timer over the jobs a node owns, and each execution's way through claim,
send, record, retry and done. It talks to the outside only through its parts (a clock, the claim
store, the senders, the history writer, the node store), so the same code runs in production and
in the deterministic simulation.

Life of an execution:
1. due (an occurrence, a manual trigger, a redelivery, a catch-up): claimed in one batch per timer
   pass; the loser forgets it, because the claim itself is the durable record: it sits in the
   slot's index of open claims, where any owner of the slot finds it if its holder dies;
2. won: wait for a throttle permit and for the node's (and the namespace's) delivery capacity,
   renewing the lease meanwhile; then send, and record the outcome in history;
3. a failed attempt with attempts left parks the claim until its retry is due: the holder takes
   it back then, or, if the holder is gone, whoever owns the slot does;
4. a final outcome marks the claim done (coalesced into one round trip), keeping the history row
   in the claim store until it is known to be written.

Whatever one execution holds, no exception from it leaves it: it becomes that execution's
failed attempt, with the error recorded.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cronman.calendars import SkipSummary
from cronman.errors import TransientError
from cronman.execution import Status, Trigger, backfill_of
from cronman.misfire import MisfirePlan
from cronman.schedule import Timing
from scheduler_node.acquire import Acquirer
from scheduler_node.aio import Tasks, wait_event
from scheduler_node.backlog import Backlog
from scheduler_node.delivery import Deliveries
from scheduler_node.execution import Execution, Stage
from scheduler_node.finishing import Finisher
from scheduler_node.history import HistoryRow, HistoryWriter
from scheduler_node.jobs import OwnedJob
from scheduler_node.leases import Leases
from scheduler_node.lifecycle import Lifecycle, next_occurrence
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import (
    Claims,
    Outcome,
)
from scheduler_node.progress import Progress
from scheduler_node.schedule_book import ScheduleBook
from scheduler_node.senders import Senders
from scheduler_node.standby import BUSY_MS, Held, Standby, Standing
from scheduler_node.store import NodeStore
from scheduler_node.sweeper import Sweeper
from scheduler_node.throttle import ThrottleGate
from scheduler_node.timetable import Timetable
from scheduler_node.tracing import Tracing
from scheduler_node.verify import Verifier

# What the cluster's configuration says of a won execution before it is sent (Firer.screen): end it
# with this status and reason, and for a skipped span of excluded days, what its row stands for.
Verdict = tuple[Status, str] | tuple[Status, str, SkipSummary | None]

log = logging.getLogger("cronman.node")

MAX_BATCH = 5000  # due executions handled per timer pass
# An occurrence the timer comes to this late is catch-up work (a load, an outage): it waits in the
# backlog with the catch-up's other late occurrences (see take_queued), at most LATE_MOVED a pass.
LATE_MS = 5000
LATE_MOVED = 50_000
PAUSE_RECHECK_MS = 1000  # a takeover this node cannot judge paused yet is parked again this long


@dataclass(frozen=True, slots=True)
class FirerConfig:
    node_id: str
    lease_ms: int
    max_in_flight: int = 1000
    namespace_share: float = 0.5
    tick_seconds: float = 0.05  # timer passes are at least this far apart under load (timer_tick_seconds)
    idle_seconds: float = 0.1  # and at most this far apart when nothing is due
    sweep_seconds: float = 1.0
    unrecorded_after_ms: int = 30_000  # a delivered row not written by then: an owner writes it
    done_ttl_ms: int = 60_000  # how long a finished claim stays in the claim store (done_ttl_seconds)
    slots: int = 4096  # how many slots job ids hash to (cronman.hashing.SLOTS)
    # Late occurrences queued (a catch-up, a loss's claims again) wait in the backlog while this
    # many executions are claimed and not sent (None: twice max_in_flight); at least backlog_min
    # of them join each pass all the same.
    backlog_room: int | None = None
    backlog_min: int = 50


class Firer:
    def __init__(
        self,
        cfg: FirerConfig,
        *,
        clock: Callable[[], int],
        claims: Claims,
        senders: Senders,
        history: HistoryWriter,
        store: NodeStore,
        metrics: NodeMetrics,
        throttle: ThrottleGate | None = None,
        secrets: Callable[[str], tuple[str, ...] | None] = lambda namespace: None,
        screen: Callable[[Execution], Verdict | None] = lambda e: None,
        misfire: Callable[[Execution], MisfirePlan | None] = lambda e: None,
        rng: random.Random | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.cfg = cfg
        self.tracing = tracing or Tracing()
        self.clock = clock
        self.claims = claims
        self.senders = senders
        self.history = history
        self.store = store
        self.metrics = metrics
        self.throttle = throttle
        # What the cluster's configuration says of a won execution before it is sent: skip it (a
        # calendar excludes its day; the row may stand for the rest of the span: see Verdict) or
        # cancel it (its backfill was cancelled); None: send it.
        self.screen = screen
        self.rng = rng or random.Random()
        self.lease_s = cfg.lease_ms / 1000
        # What happens to executions, step by step, for whoever watches (the simulation's --trace).
        self.trace: Callable[[str, Execution, str], None] | None = None
        # what the node owns: its jobs and their timer entries (scheduler_node.timetable)
        self.table = Timetable()
        # retries: (due ms, seq, execution)
        self.retries: list[tuple[int, int, Execution]] = []
        self.due: list[Execution] = []  # to claim at the next pass (triggers, catch-up)
        # late scheduled occurrences queued beyond what delivery keeps up with (see take_queued)
        self.backlog = Backlog()
        # What the pass in progress claims (taken from ``due``; what it could not claim goes back)
        self.claiming: list[Execution] = []
        self._seq = itertools.count()
        self.tasks = Tasks()
        self._wake = asyncio.Event()
        self.stopping = False
        # Standing by for the other owner of a slot, when it leads (scheduler_node.standby); None:
        # every occurrence is claimed on time. What this node last published of its own firing:
        self.standby: Standby | None = None
        self.standing: Standing | None = None
        self.left_to_leader = 0  # occurrences this node held back and the slot's leader claimed
        self._passes = 0
        self._compose(cfg, claims, senders, history, store, throttle, secrets, misfire)

    def _compose(
        self,
        cfg: FirerConfig,
        claims: Claims,
        senders: Senders,
        history: HistoryWriter,
        store: NodeStore,
        throttle: ThrottleGate | None,
        secrets: Callable[[str], tuple[str, ...] | None],
        misfire: Callable[[Execution], MisfirePlan | None],
    ) -> None:
        """The firer's parts (docs/architecture.md, the firing core), each the one owner of its state;
        those that call back are given the firer as the small protocol they need (SweepHost,
        LeaseHost, AcquireHost, DeliveryHost, FinishHost, LifecycleHost, BookHost)."""
        clock, metrics = self.clock, self.metrics
        self.verifier = Verifier(
            store=store,
            history=history,
            misfire_of=misfire,
            proceed=self._proceed,
            close=self._close,
            spawn=self.tasks.spawn,
        )
        self.leases = Leases(
            self,
            claims=claims,
            clock=clock,
            metrics=metrics,
            memory=self.verifier,
            spawn=self.tasks.spawn,
            lease_ms=cfg.lease_ms,
        )
        self.acquirer = Acquirer(
            self,
            claims=claims,
            leases=self.leases,
            clock=clock,
            metrics=metrics,
            lease_ms=cfg.lease_ms,
            done_ttl_ms=cfg.done_ttl_ms,
        )
        self.delivery = Deliveries(
            self,
            senders=senders,
            throttle=throttle,
            clock=clock,
            renew=self.leases.renew,
            secrets=secrets,
            tracing=self.tracing,
            lease_ms=cfg.lease_ms,
            max_in_flight=cfg.max_in_flight,
            namespace_share=cfg.namespace_share,
        )
        self.finisher = Finisher(
            self,
            leases=self.leases,
            memory=self.verifier,
            history=history,
            metrics=metrics,
            store=store,
            senders=senders,
            throttle=throttle,
            tracing=self.tracing,
            clock=clock,
            rng=self.rng,
            spawn=self.tasks.spawn,
            node_id=cfg.node_id,
        )
        self.lifecycle = Lifecycle(self, table=self.table, leases=self.leases, backlog=self.backlog)
        self.progress = Progress(verifier=self.verifier, claimed_through=self.claimed_through)
        self.book = ScheduleBook(
            self,
            table=self.table,
            lifecycle=self.lifecycle,
            leases=self.leases,
            backlog=self.backlog,
            verifier=self.verifier,
            progress=self.progress,
            clock=clock,
        )
        self.sweeper = Sweeper(
            self,
            claims=claims,
            store=store,
            history=history,
            spawn=self.tasks.spawn,
            rng=self.rng,
            every_s=cfg.sweep_seconds,
            rows_after_ms=cfg.unrecorded_after_ms,
            slot_count=cfg.slots,
        )

    @property
    def jobs(self) -> dict[str, OwnedJob]:
        """The jobs this node owns, by id (the table's: see Timetable)."""
        return self.table.jobs

    @property
    def held(self) -> dict[str, Execution]:
        """Executions claimed here and not over, by claim name (the leases')."""
        return self.leases.held

    @property
    def parked(self) -> dict[str, Execution]:
        """Executions waiting here to retry, by index member (the leases')."""
        return self.leases.parked

    @property
    def closing(self) -> dict[str, Execution]:
        """Executions finished here whose done marks are on their way, by claim name (the leases')."""
        return self.leases.closing

    @property
    def sending(self) -> dict[asyncio.Future[Outcome], tuple[Execution, int]]:
        """The attempts in flight: (execution, when sent) by the sender's future (delivery's)."""
        return self.delivery.sending

    @property
    def backlogged(self) -> int:
        """Late occurrences queued through the backlog (it was not empty, or they were more than
        its room)."""
        return self.backlog.queued

    # ------------------------------------------------------------------ jobs
    # (the schedule book's: see ScheduleBook)
    def install(self, job: OwnedJob, after_ms: int, timing: Timing | None = None) -> bool:
        return self.book.install(job, after_ms, timing)

    def stage(self, job: OwnedJob) -> None:
        """Keep a job read before the node is ready, without a timer entry (see Timetable.stage)."""
        self.table.stage(job)

    def compact(self) -> None:
        """Size the table of jobs for what it holds, when it is well over that (see Timetable)."""
        self.table.compact()

    def remove(self, job_id: str, reason: str) -> None:
        self.lifecycle.remove(job_id, reason)

    def halt(self, job_id: str, reason: str) -> bool:
        return self.book.halt(job_id, reason)

    def set_slots(self, slots: frozenset[int]) -> None:
        self.book.set_slots(slots)

    @property
    def slots(self) -> frozenset[int]:
        """The slots this node owns (the schedule book's)."""
        return self.book.slots

    def enqueue(self, executions: Iterable[Execution], verify: bool | None = None) -> None:
        """Executions to claim at the next timer pass (triggers, redeliveries, catch-up); with
        ``verify``, each is (or is not) checked against history before it is sent, whatever
        :meth:`occurrence` said."""
        if verify is not None:
            executions = list(executions)
            for e in executions:
                e.verify = verify
        self.due.extend(executions)
        self._wake.set()

    def queued(self) -> int:
        """Executions waiting for a timer pass to claim them (the backlog's late ones included)."""
        return len(self.due) + len(self.backlog)

    def sweep_soon(self) -> None:
        """Sweep now, not at the next interval: slots were just taken over, and what a holder gone
        from them left (claims whose lease ran out) is taken at once."""
        self.sweeper.soon()

    def stop(self) -> None:
        """The timer and the sweeper end after the pass they are in."""
        self.stopping = True
        self._wake.set()
        self.sweeper.soon()

    # ------------------------------------------------------------------ the timer
    async def run_timer(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopping:
            started = loop.time()
            now = self.clock()
            due: list[Execution] = []
            jobs, standby = self.jobs, self.standby
            # what this pass's standing will say: the cursor, the slots led and the Redis data's epoch
            # before it began (a loss noticed since has its occurrences waiting in self.due)
            cursor, led, epoch = (standby.cursor, standby.led(), standby.epoch) if standby is not None else (0, b"", "")
            self.pop_fires(now, due)  # what is due on time first
            if standby is not None and standby.held:
                for h in standby.release(now, loop.time()):
                    job = jobs.get(h.job_id)
                    if job is not None and self.table.generation(job) == h.gen:
                        due.extend(self.book.occurrence(job, h.when))
                if standby.covered:
                    self.metrics.claim["covered"].inc(standby.covered)
                    self.left_to_leader += standby.covered
                    standby.covered = 0
            self.take_queued(due)
            full = len(due) >= MAX_BATCH
            retries = self.pop_retries(now)
            ok = await self.timer_pass(due, retries)
            self.metrics.tally.flush()
            # (passed or not: a node whose claims wait for Redis is running, and delivers what
            # came due once Redis answers; Redis away is not an outage of the cluster: seed 982324)
            firing = self._claimed(now, now + 1)
            if not ok:
                self.progress.passed(firing, None)
            else:
                pending = self.pending_ms(now)
                claimed = self._claimed(now, pending)
                held = standby.oldest() if standby is not None else None
                self.progress.passed(firing, claimed if held is None else min(claimed, held - 1))
                if standby is not None:
                    self._passes += 1
                    # due work left over (a burst): a full batch popped, or catch-up work waiting
                    # (not a timer merely late: a leader's hiccup is what the grace covers)
                    busy = full or pending < self.clock() - BUSY_MS
                    self.standing = Standing(claimed, cursor, led, self._passes, busy, epoch=epoch)
            await self._sleep(started + self.cfg.tick_seconds - loop.time())

    def pop_fires(self, now: int, due: list[Execution]) -> None:
        """The occurrences due by ``now`` join ``due`` (up to ``MAX_BATCH``), or the backlog if
        they are more than ``LATE_MS`` late, or are held back for a slot's leader; each job's
        next occurrence takes its place in the timer."""
        table, standby = self.table, self.standby
        late = now - LATE_MS  # entries due by then are late
        moved = 0
        if len(due) >= MAX_BATCH:
            return
        for job, when, place in table.due(now):
            if standby is not None and (leader := standby.defers(job.slot)) is not None:
                # another owner leads the slot: held back until it is known to have claimed
                standby.hold(leader, Held(when, job.id, table.generation(job), job.slot, standby.until(when, now)))
            elif when <= late:
                self.backlog.push(self.book.occurrence(job, when))
                moved += 1
            else:
                due.extend(self.book.occurrence(job, when))
            table.schedule(job, place, next_occurrence(job, when))
            if len(due) >= MAX_BATCH or moved >= LATE_MOVED:
                break

    def pending_ms(self, now: int) -> int:
        # (a backfill's occurrences lie in the past on purpose: they say nothing of progress)
        pending = min((e.scheduled_ms for e in self.due if not backfill_of(e.trigger)), default=now + 1)
        oldest = self.backlog.oldest_ms()
        return pending if oldest is None else min(pending, oldest)

    def take_queued(self, due: list[Execution]) -> None:
        """What the node queued since the last pass joins this one, after what came due on time.
        Late scheduled occurrences among it (a catch-up after an outage or a load, a loss's claims
        again: hundreds of thousands at once) join only as far as delivery keeps up, oldest first,
        and wait in the backlog meanwhile: claimed all at once, they held a lease each while every
        occurrence due on time since waited behind them to be sent (a node's probes every second,
        seconds late for as long as the catch-up took). Triggers, redeliveries and backfills
        (paced by their drivers) join at once."""
        queued, self.due = self.due, []
        backlog = self.backlog
        if not backlog and len(queued) <= self._room(len(due)):
            due.extend(queued)
            return
        try:
            late: list[Execution] = []
            for e in queued:
                (late if e.d.trigger == Trigger.SCHEDULE and not e.d.suffix else due).append(e)
            if late:
                backlog.push(late)
            backlog.take(self._room(len(due)), due)
        finally:
            self.metrics.backlog.set(len(backlog))

    def _room(self, taking: int) -> int:
        """How many queued late occurrences may join a pass that claims ``taking`` already:
        delivery has room while fewer than twice max_in_flight claimed executions wait to be sent
        or are out (those waiting for a throttle's permits aside)."""
        busy = len(self.held) + taking
        if self.throttle is not None and self.throttle.waiting:
            busy -= self.throttle.waiting_count()
        cfg = self.cfg
        return max(cfg.backlog_min, (2 * cfg.max_in_flight if cfg.backlog_room is None else cfg.backlog_room) - busy)

    def spare_room(self) -> int:
        """How many executions that can wait (a backfill's) may be queued now, behind on-time
        work: none while late occurrences wait in the backlog; else what is left of
        max_in_flight by the executions claimed or queued (those waiting for a throttle's permits
        aside), keeping the other half of the backlog's room for a catch-up."""
        if self.backlog:
            return 0
        busy = len(self.held) + len(self.due)
        if self.throttle is not None and self.throttle.waiting:
            busy -= self.throttle.waiting_count()
        return max(0, self.cfg.max_in_flight - busy)

    def _claimed(self, now: int, pending: int) -> int:
        """How far every occurrence of the slots this node claims on time has been claimed: not
        past the timer's head or what waits to be claimed (``pending``, from :meth:`pending_ms`)."""
        head = self.table.head_ms()
        if head is None:
            head = now + 1
        return min(now, head - 1, pending - 1)

    def claimed_through(self, now: int) -> int:
        """How far every occurrence this node owes has been claimed: :meth:`_claimed`, and not
        past what it holds back for a slot's leader."""
        out = self._claimed(now, self.pending_ms(now))
        held = self.standby.oldest() if self.standby is not None else None
        return out if held is None else min(out, held - 1)

    async def timer_pass(self, due: list[Execution], retries: list[Execution]) -> bool:
        """One timer pass; False when the claim store could not be reached for the due work (it
        is tried again at the next pass)."""
        ok = True
        self.claiming = due
        try:
            if self.delivery.to_confirm:
                await self.delivery.confirm()
            if due:
                await self.acquirer.claim(due)
            if retries:
                await self.acquirer.take(retries)
            if self.throttle is not None and self.throttle.waiting:
                for e in await self.throttle.grant(self.clock()):
                    self.delivery.granted(e)
        except TransientError as exc:
            ok = False
            log.warning("timer pass could not reach the claim store, retrying: %s", exc)
            self.due[:0] = [e for e in due if e.stage is Stage.NEW]
            for e in retries:
                if e.stage is Stage.PARKED:
                    self.later(self.clock() + 500, e)
            await asyncio.sleep(0.2)
        except Exception:  # noqa: BLE001 - a bug must not stop the timer; the work is retried
            ok = False
            log.exception("timer pass failed")
            self.due[:0] = [e for e in due if e.stage is Stage.NEW]
            await asyncio.sleep(0.2)
        finally:
            self.claiming = []
        return ok

    def pop_retries(self, now: int) -> list[Execution]:
        """The retries parked here that are due by ``now`` (up to ``MAX_BATCH``), taken out of the timer."""
        out: list[Execution] = []
        heap = self.retries
        while heap and heap[0][0] <= now and len(out) < MAX_BATCH:
            e = heapq.heappop(heap)[2]
            if e.stage is Stage.PARKED and self.parked.get(e.ticket.member) is e:
                out.append(e)
        return out

    async def _sleep(self, rest_of_tick: float) -> None:
        if self.due or self.delivery.to_confirm or self.backlog:
            await asyncio.sleep(max(0.0, rest_of_tick))
            return
        heads = [h[0][0] for h in (self.retries,) if h]
        head = self.table.head_ms()
        if head is not None:
            heads.append(head)
        cap = 0.05 if self.throttle is not None and self.throttle.waiting else self.cfg.idle_seconds
        delay = cap if not heads else max(0.0, min(cap, (min(heads) - self.clock()) / 1000))
        delay = max(delay, rest_of_tick)
        if delay <= 0:
            await asyncio.sleep(0)
            return
        self._wake.clear()
        await wait_event(self._wake, delay)

    def later(self, when: int, e: Execution) -> None:
        e.due_ms = when
        heapq.heappush(self.retries, (when, next(self._seq), e))

    # ------------------------------------------------------------------ claims
    async def take(self, items: list[Execution]) -> None:
        """Take ``items`` back from the claim store (see Acquirer.take)."""
        await self.acquirer.take(items)

    def won(self, e: Execution) -> None:
        """A claim is ours: first learn from history where it stands if it must (a takeover, a
        claim Redis had lost), then check it is still wanted, then queue it for delivery."""
        if e.verify:
            self.verifier.check(e)
            return
        self._proceed(e)

    def _proceed(self, e: Execution) -> None:
        current = self.jobs.get(e.d.job_id)
        if e.job.slot not in self.slots:
            # The slot moved to other nodes while this one was claiming: theirs to do.
            if self.trace:
                self.trace("release", e, "the slot moved")
            self.leases.hand_back(e)
            return
        if current is not None and current.incarnation != e.job.incarnation:
            self.lifecycle.adopt_claimed(current, e)  # claimed for the earlier incarnation
        if current is None or current.incarnation != e.job.incarnation:
            self.cancel(e, "the job was deleted")
            return
        if current.paused and e.trigger == Trigger.SCHEDULE and not e.d.suffix:
            read = self.progress.feed_read_ms
            if e.taken and (read is None or read < e.scheduled_ms):
                # Taken over from another node, which fired the occurrence (it saw the job live
                # then), while what this node read of the job is older than that: the pause it
                # read may have been undone since (seed 82449). Not this node's to end on that
                # view: parked again shortly, for the slot's owners (this one too, once it has read
                # the job again).
                if self.trace:
                    self.trace("defer", e, "paused in a view of the job older than the occurrence")
                self.leases.park(e, self.clock() + PAUSE_RECHECK_MS, here=False)
                return
            self.cancel(e, "the job was paused")
            return
        e.job = current  # a newer definition applies to what has not been sent yet
        plan = e.misfire
        if plan is not None:
            for t in plan.skip:
                if t != e.scheduled_ms:
                    self.finisher.record_skip(e.job, t, 0, plan.reason)
            if e.scheduled_ms in plan.skip:  # nothing of the missed window is fired
                self.finish_with(e, Status.SKIPPED, plan.reason)
                return
        verdict = self.screen(e)  # e.g. an occurrence on a day one of the job's calendars excludes
        if verdict is not None:
            self.finish_with(e, *verdict)
            return
        self.delivery.dispatch(e)

    # ------------------------------------------------------------------ sweeping
    async def run_sweeper(self, ready: Callable[[], bool]) -> None:
        """The sweeper's loop (see Sweeper.run)."""
        await self.sweeper.run(ready)

    async def sweep(self, rows: bool = True) -> None:
        await self.sweeper.sweep(rows)

    def recorded(self, rows: list[HistoryRow]) -> None:
        """The history writer wrote these rows: drop their copies from the claim store."""
        self.sweeper.recorded(rows)

    def parked_here(self, member: str) -> Execution | None:
        return self.parked.get(member)

    def holds(self, name: str) -> bool:
        return name in self.held or name in self.closing

    def retake(self, found: list[Execution]) -> None:
        self.acquirer.retake(found)

    # ------------------------------------------------------------------ leases
    async def run_renewer(self) -> None:
        """The leases' renewal loop (see Leases.run_renewer)."""
        await self.leases.run_renewer()

    def retry_at(self, when: int, e: Execution) -> None:
        self.later(when, e)
        self._wake.set()

    def landed(self, name: str) -> None:
        self.acquirer.landed(name)

    async def beat(self) -> None:
        if self.throttle is not None:
            await self.throttle.renew(self.clock())
        self.senders.maintain()
        self.metrics.waiting_for_connection.set(self.delivery.hosts.queued)

    def repark_all(self) -> None:
        """Park again every retry parked here (Redis lost its data: it lost them too)."""
        self.leases.repark_all()

    async def run_done(self) -> None:
        """The done marks' loop (see Leases.run_done)."""
        await self.leases.run_done()

    async def flush_done(self) -> None:
        await self.leases.flush_done()

    # ------------------------------------------------------------------ delivery
    def unwait(self, e: Execution) -> None:
        self.delivery.unwait(e)

    def wake(self) -> None:
        self._wake.set()

    def outcome(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        self.finisher.outcome(e, outcome, fired, finished)

    # ------------------------------------------------------------------ outcomes
    def finish_with(self, e: Execution, status: Status, reason: str, summary: SkipSummary | None = None) -> None:
        self.finisher.finish_with(e, status, reason, summary)

    def cancel(self, e: Execution, reason: str) -> None:
        self.finisher.cancel(e, reason)

    def keep_due(self, wanted: Callable[[Execution], bool]) -> None:
        self.due = [e for e in self.due if wanted(e)]

    def _close(self, e: Execution, status: str, row: str) -> None:
        self.finisher.close(e, status, row)

    # ------------------------------------------------------------------ handing over
    def hand_over(self, which: Callable[[Execution], bool], patience: float = 3.0) -> None:
        """Executions claimed but not yet sent go back to the claim store at once, for whoever
        owns their slot (this node included, if it still does)."""
        waiting = [e for e in self.held.values() if e.stage is Stage.WAITING and which(e)]
        if not waiting:
            return
        # (one waiting for a slot holds its host's place: the next for that host takes it)
        moved = self.delivery.forget(which)
        for e in waiting:
            if self.trace:
                self.trace("hand over", e, f"attempt {e.attempt}")
            self.delivery.unwait(e)
            self.leases.let_go(e)
            e.stage = Stage.OVER
        self.delivery.flow(moved, [])
        self.tasks.spawn(self.leases.release(waiting, patience))

    async def drain(self, timeout: float, handover_seconds: float = 20.0) -> None:
        """Stop: let deliveries in flight finish (their retries are parked like any), hand the
        rest over, and mark what finished done. While the claim store is unreachable, the handover
        is retried for ``handover_seconds``."""
        self.stopping = True
        pending: list[asyncio.Future[Any]] = [*self.sending, *self.tasks.pending()]
        if pending:  # (what a task makes ready to send meanwhile waits, and is handed over below)
            await asyncio.wait(pending, timeout=timeout)
        waiting = [e for e in self.held.values() if e.stage is Stage.WAITING]
        if waiting:
            self.hand_over(lambda e: True, patience=handover_seconds)
        if self.parked:
            await self.leases.repark(list(self.parked.values()), patience=handover_seconds)
        await self.tasks.wait(handover_seconds + 1)
        await self.leases.land(handover_seconds)

    async def settle(self, timeout: float) -> None:
        """Wait (a while) for the short tasks this firer started to end."""
        await self.tasks.wait(timeout)

    # ------------------------------------------------------------------ figures
    def figures(self) -> dict[str, Any]:
        fires_per_s, lag_p99_ms = self.finisher.rates(self.clock())
        return {
            "in_flight": len(self.held),
            "fires_per_s": fires_per_s,
            "lag_p99_ms": lag_p99_ms,
            "parked": len(self.parked),
            "backlog": len(self.backlog),  # late occurrences waiting for delivery to keep up
            "held_for_leader": len(self.standby) if self.standby is not None else 0,
            "claimed_after_holding": dict(self.standby.claimed_because) if self.standby is not None else {},
        }
