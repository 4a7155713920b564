"""What a won claim becomes before it is sent: handed back if its slot moved, cancelled if its
job was deleted or paused (or parked again, taken over in a view of the job older than it), its
misfire plan's skips recorded, screened by the cluster's configuration (a calendar's excluded
day, a cancelled backfill), else dispatched for delivery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cronman.model.calendars import SkipSummary
from cronman.model.execution import Status, Trigger
from scheduler_node.aio import Trace
from scheduler_node.delivery import Deliveries
from scheduler_node.execution import Execution
from scheduler_node.finishing import Finisher
from scheduler_node.leases import Leases
from scheduler_node.lifecycle import Lifecycle
from scheduler_node.progress import Progress
from scheduler_node.schedule_book import ScheduleBook
from scheduler_node.waits import Waits, waits_for_something

# What the cluster's configuration says of a won execution before it is sent (Firer.screen): end it
# with this status and reason, and for a skipped span of excluded days, what its row stands for.
Verdict = tuple[Status, str] | tuple[Status, str, SkipSummary | None]

PAUSE_RECHECK_MS = 1000  # a takeover this node cannot judge paused yet is parked again this long


class AdmitHost(Protocol):
    """What admitting a won claim asks of the firer."""

    @property
    def trace(self) -> Trace | None: ...


class Admission:
    __slots__ = ("host", "book", "lifecycle", "leases", "progress", "finisher", "delivery", "waits", "screen", "clock")

    def __init__(
        self,
        host: AdmitHost,
        *,
        book: ScheduleBook,
        lifecycle: Lifecycle,
        leases: Leases,
        progress: Progress,
        finisher: Finisher,
        delivery: Deliveries,
        waits: Waits,
        screen: Callable[[Execution], Verdict | None],
        clock: Callable[[], int],
    ) -> None:
        self.host = host
        self.book = book
        self.lifecycle = lifecycle
        self.leases = leases
        self.progress = progress
        self.finisher = finisher
        self.delivery = delivery
        self.waits = waits
        self.screen = screen
        self.clock = clock

    def proceed(self, e: Execution) -> None:
        """``e`` is won (and checked against history if it had to be): is it still wanted?"""
        current = self.book.table.jobs.get(e.d.job_id)
        trace = self.host.trace
        if e.job.slot not in self.book.slots:
            # The slot moved to other nodes while this one was claiming: theirs to do.
            if trace:
                trace("release", e, "the slot moved")
            self.leases.hand_back(e)
            return
        if current is not None and current.incarnation != e.job.incarnation:
            self.lifecycle.adopt_claimed(current, e)  # claimed for the earlier incarnation
        if current is None or current.incarnation != e.job.incarnation:
            self.finisher.cancel(e, "the job was deleted")
            return
        if current.paused and e.trigger in (Trigger.SCHEDULE, Trigger.AFTER) and not e.d.suffix:
            read = self.progress.feed_read_ms
            if e.taken and (read is None or read < e.scheduled_ms):
                # Taken over from another node, which fired the occurrence (it saw the job live
                # then), while what this node read of the job is older than that: the pause it
                # read may have been undone since (seed 82449). Not this node's to end on that
                # view: parked again shortly, for the slot's owners (this one too, once it has read
                # the job again).
                if trace:
                    trace("defer", e, "paused in a view of the job older than the occurrence")
                self.leases.park(e, self.clock() + PAUSE_RECHECK_MS, here=False)
                return
            self.finisher.cancel(e, "the job was paused")
            return
        if e.job is not current:  # a newer definition applies to what has not been sent yet
            e.job, e.payload = current, current.payload
        plan = e.misfire
        if plan is not None:
            for t in plan.skip:
                if t != e.scheduled_ms:
                    self.finisher.record_skip(e.job, t, 0, plan.reason)
            if e.scheduled_ms in plan.skip:  # nothing of the missed window is fired
                self.finisher.finish_with(e, Status.SKIPPED, plan.reason)
                return
        verdict = self.screen(e)  # e.g. an occurrence on a day one of the job's calendars excludes
        if verdict is not None:
            self.finisher.finish_with(e, *verdict)
            return
        if waits_for_something(e):  # upstreams, or asynchronous work (scheduler_node.waits)
            self.waits.admit(e)
            return
        self.delivery.dispatch(e)
