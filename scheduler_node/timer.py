"""The timer: each pass claims what came due on time, then what was queued (triggers,
redeliveries, backfills, the backlog's late occurrences as far as delivery keeps up), and takes
back the retries parked here that are due; between passes it sleeps until the next entry is due
or it is woken. What it publishes of its firing (a standing) when it stands by for a slot's
leader, and how far it got (through the node's Progress)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from cronman.errors import TransientError
from cronman.model.execution import Trigger, backfill_of
from scheduler_node.acquire import Acquirer
from scheduler_node.aio import wait_event
from scheduler_node.backlog import Backlog
from scheduler_node.delivery import Deliveries
from scheduler_node.execution import Execution, Stage
from scheduler_node.leases import Leases
from scheduler_node.lifecycle import next_occurrence
from scheduler_node.metrics import NodeMetrics
from scheduler_node.progress import Progress
from scheduler_node.schedule_book import ScheduleBook
from scheduler_node.standby import BUSY_MS, Held, Standby, Standing
from scheduler_node.throttle import ThrottleGate
from scheduler_node.timetable import Timetable

if TYPE_CHECKING:
    from scheduler_node.firer import FirerConfig

log = logging.getLogger("cronman.node")

MAX_BATCH = 5000  # due executions handled per timer pass
# An occurrence the timer comes to this late is catch-up work (a load, an outage): it waits in the
# backlog with the catch-up's other late occurrences (see take_queued), at most LATE_MOVED a pass.
LATE_MS = 5000
LATE_MOVED = 50_000


class TimerHost(Protocol):
    """What the timer asks of the firer it runs for."""

    @property
    def stopping(self) -> bool: ...
    @property
    def standby(self) -> Standby | None: ...


class Timer:
    def __init__(
        self,
        host: TimerHost,
        cfg: FirerConfig,
        *,
        table: Timetable,
        book: ScheduleBook,
        backlog: Backlog,
        leases: Leases,
        acquirer: Acquirer,
        delivery: Deliveries,
        progress: Progress,
        throttle: ThrottleGate | None,
        metrics: NodeMetrics,
        clock: Callable[[], int],
    ) -> None:
        self.host = host
        self.cfg = cfg
        self.table = table
        self.book = book
        self.backlog = backlog
        self.leases = leases
        self.acquirer = acquirer
        self.delivery = delivery
        self.progress = progress
        self.throttle = throttle
        self.metrics = metrics
        self.clock = clock
        # retries: (due ms, seq, execution)
        self.retries: list[tuple[int, int, Execution]] = []
        self.due: list[Execution] = []  # to claim at the next pass (triggers, catch-up)
        # What the pass in progress claims (taken from ``due``; what it could not claim goes back)
        self.claiming: list[Execution] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        # What this node last published of its own firing, when it stands by for slots' leaders:
        self.standing: Standing | None = None
        self.left_to_leader = 0  # occurrences this node held back and the slot's leader claimed
        self._passes = 0

    def enqueue(self, executions: Iterable[Execution], verify: bool | None = None) -> None:
        """Executions to claim at the next timer pass (triggers, redeliveries, catch-up); with
        ``verify``, each is (or is not) checked against history before it is sent, whatever
        ScheduleBook.occurrence said."""
        if verify is not None:
            executions = list(executions)
            for e in executions:
                e.verify = verify
        self.due.extend(executions)
        self._wake.set()

    def queued(self) -> int:
        """Executions waiting for a timer pass to claim them (the backlog's late ones included)."""
        return len(self.due) + len(self.backlog)

    def keep_due(self, wanted: Callable[[Execution], bool]) -> None:
        self.due = [e for e in self.due if wanted(e)]

    def wake(self) -> None:
        self._wake.set()

    def retry_at(self, when: int, e: Execution) -> None:
        self.later(when, e)
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.host.stopping:
            started = loop.time()
            now = self.clock()
            due: list[Execution] = []
            jobs, standby = self.table.jobs, self.host.standby
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
        table, standby = self.table, self.host.standby
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
        busy = len(self.leases.held) + taking
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
        busy = len(self.leases.held) + len(self.due)
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
        held = self.host.standby.oldest() if self.host.standby is not None else None
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
            if e.stage is Stage.PARKED and self.leases.parked.get(e.ticket.member) is e:
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
