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
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cronman.model.calendars import SkipSummary
from cronman.model.execution import Status
from cronman.model.misfire import MisfirePlan
from cronman.model.schedule import Timing
from scheduler_node.acquire import Acquirer
from scheduler_node.admission import Admission, Verdict
from scheduler_node.aio import Tasks
from scheduler_node.backlog import Backlog
from scheduler_node.delivery import Deliveries
from scheduler_node.execution import Execution, Stage
from scheduler_node.finishing import Finisher
from scheduler_node.history import HistoryRow, HistoryWriter
from scheduler_node.jobs import OwnedJob
from scheduler_node.leases import Leases
from scheduler_node.lifecycle import Lifecycle
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import (
    Claims,
    Outcome,
)
from scheduler_node.payloads import PayloadReader
from scheduler_node.progress import Progress
from scheduler_node.schedule_book import ScheduleBook
from scheduler_node.senders import Senders
from scheduler_node.standby import Standby
from scheduler_node.store import NodeStore
from scheduler_node.sweeper import Sweeper
from scheduler_node.throttle import ThrottleGate
from scheduler_node.timer import Timer
from scheduler_node.timetable import Timetable
from scheduler_node.tracing import Tracing
from scheduler_node.verify import Verifier
from scheduler_node.waits import Waits

log = logging.getLogger("cronman.node")


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
    slots: int = 4096  # how many slots job ids hash to (cronman.model.hashing.SLOTS)
    # Late occurrences queued (a catch-up, a loss's claims again) wait in the backlog while this
    # many executions are claimed and not sent (None: twice max_in_flight); at least backlog_min
    # of them join each pass all the same.
    backlog_room: int | None = None
    backlog_min: int = 50
    # A job keeps its payload in memory while its next occurrence is at most this far ahead (see
    # scheduler_node.payloads); 0: every job keeps its payload.
    payload_horizon_ms: int = 0


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
        # late scheduled occurrences queued beyond what delivery keeps up with (see Timer.take_queued)
        self.backlog = Backlog()
        self.tasks = Tasks()
        self.stopping = False
        # Standing by for the other owner of a slot, when it leads (scheduler_node.standby; the
        # node sets it, the timer defers to it); None: every occurrence is claimed on time.
        self.standby: Standby | None = None
        # Payloads out of memory beyond the horizon, read again ahead of time (None: kept)
        self.payloads = (
            PayloadReader(
                table=self.table, read=store.payloads, clock=clock, horizon_ms=cfg.payload_horizon_ms, metrics=metrics
            )
            if cfg.payload_horizon_ms > 0
            else None
        )
        self._compose(cfg, claims, senders, history, store, throttle, secrets, misfire)
        self._compose_timer(cfg)

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
        LeaseHost, AcquireHost, DeliveryHost, FinishHost, LifecycleHost)."""
        clock, metrics = self.clock, self.metrics
        self.verifier = Verifier(
            store=store,
            history=history,
            misfire_of=misfire,
            proceed=lambda e: self.admission.proceed(e),
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
            payloads=self.payloads,
            spawn=self.tasks.spawn,
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
        self.waits = Waits(
            self,
            store=store,
            leases=self.leases,
            finisher=self.finisher,
            delivery=self.delivery,
            clock=clock,
            spawn=self.tasks.spawn,
        )
        self.lifecycle = Lifecycle(self, table=self.table, leases=self.leases, backlog=self.backlog)
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

    def _compose_timer(self, cfg: FirerConfig) -> None:
        """The timer's parts: the schedule book, progress, the timer, and what a won claim becomes
        before it is sent (given the firer as BookHost, TimerHost, AdmitHost)."""
        self.progress = Progress(verifier=self.verifier, claimed_through=lambda now: self.timer.claimed_through(now))
        self.book = ScheduleBook(
            self,
            table=self.table,
            lifecycle=self.lifecycle,
            leases=self.leases,
            backlog=self.backlog,
            verifier=self.verifier,
            progress=self.progress,
            clock=self.clock,
        )
        self.timer = Timer(
            self,
            cfg,
            table=self.table,
            book=self.book,
            backlog=self.backlog,
            leases=self.leases,
            acquirer=self.acquirer,
            delivery=self.delivery,
            progress=self.progress,
            throttle=self.throttle,
            metrics=self.metrics,
            clock=self.clock,
        )
        self.admission = Admission(
            self,
            book=self.book,
            lifecycle=self.lifecycle,
            leases=self.leases,
            progress=self.progress,
            finisher=self.finisher,
            delivery=self.delivery,
            waits=self.waits,
            screen=self.screen,
            clock=self.clock,
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

    def sweep_soon(self) -> None:
        """Sweep now, not at the next interval: slots were just taken over, and what a holder gone
        from them left (claims whose lease ran out) is taken at once."""
        self.sweeper.soon()

    def stop(self) -> None:
        """The timer and the sweeper end after the pass they are in."""
        self.stopping = True
        self.timer.wake()
        self.sweeper.soon()

    # ------------------------------------------------------------------ the timer
    # (the timer's: see Timer)
    async def run_payloads(self) -> None:
        """Read payloads ahead of their jobs' time (when the node lets them go: see scheduler_node.payloads)."""
        if self.payloads is not None:
            await self.payloads.run(lambda: self.stopping)

    async def run_timer(self) -> None:
        await self.timer.run()

    def enqueue(self, executions: Iterable[Execution], verify: bool | None = None) -> None:
        self.timer.enqueue(executions, verify)

    @property
    def due(self) -> list[Execution]:
        """Executions waiting for the next timer pass to claim them (the timer's)."""
        return self.timer.due

    def keep_due(self, wanted: Callable[[Execution], bool]) -> None:
        self.timer.keep_due(wanted)

    def later(self, when: int, e: Execution) -> None:
        self.timer.later(when, e)

    def retry_at(self, when: int, e: Execution) -> None:
        self.timer.retry_at(when, e)

    def wake(self) -> None:
        self.timer.wake()

    @property
    def left_to_leader(self) -> int:
        """Occurrences this node held back and the slot's leader claimed (the timer's count)."""
        return self.timer.left_to_leader

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
        self.admission.proceed(e)

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

    def outcome(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        self.finisher.outcome(e, outcome, fired, finished)

    # ------------------------------------------------------------------ outcomes
    def accepted(self, e: Execution) -> None:
        """The receiver accepted ``e``'s asynchronous work (see Waits.accepted)."""
        self.waits.accepted(e)

    def unaccepted(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        """The receiver did not accept ``e``'s asynchronous work (see Waits.unaccepted)."""
        self.waits.unaccepted(e, outcome, fired, finished)

    def finish_with(self, e: Execution, status: Status, reason: str, summary: SkipSummary | None = None) -> None:
        self.finisher.finish_with(e, status, reason, summary)

    def cancel(self, e: Execution, reason: str) -> None:
        self.finisher.cancel(e, reason)

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
