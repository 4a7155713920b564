"""The jobs a node owns as its timer sees them: installed (a new version, a pause, a job created
again), retimed (a calendar changed), staged while the node loads, halted on notice, and the
slots they are in; and the executions an occurrence makes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from cronman.model.execution import Trigger
from cronman.model.schedule import Timing
from scheduler_node.backlog import Backlog
from scheduler_node.execution import Execution
from scheduler_node.jobs import OwnedJob
from scheduler_node.leases import Leases
from scheduler_node.lifecycle import Lifecycle, next_occurrence
from scheduler_node.progress import Progress
from scheduler_node.timetable import PLACE_BITS, Timetable
from scheduler_node.verify import Verifier

log = logging.getLogger("cronman.node")


class BookHost(Protocol):
    """What the schedule book asks of the firer whose timer it fills."""

    def wake(self) -> None:
        """Run a timer pass soon (a job's next occurrence changed)."""

    def keep_due(self, wanted: Callable[[Execution], bool]) -> None:
        """Of the executions waiting for a timer pass to claim them, keep those ``wanted``."""

    def hand_over(self, which: Callable[[Execution], bool]) -> None:
        """Executions claimed and not yet sent that are ``which`` go back to the claim store."""


class ScheduleBook:
    __slots__ = ("host", "table", "lifecycle", "leases", "backlog", "verifier", "progress", "clock", "slots")

    def __init__(
        self,
        host: BookHost,
        *,
        table: Timetable,
        lifecycle: Lifecycle,
        leases: Leases,
        backlog: Backlog,
        verifier: Verifier,
        progress: Progress,
        clock: Callable[[], int],
    ) -> None:
        self.host = host
        self.table = table
        self.lifecycle = lifecycle
        self.leases = leases
        self.backlog = backlog
        self.verifier = verifier
        self.progress = progress
        self.clock = clock
        self.slots: frozenset[int] = frozenset()  # the slots this node owns

    def install(self, job: OwnedJob, after_ms: int, timing: Timing | None = None) -> bool:
        """Install a job (or a newer version of it); its next occurrence is the first after
        ``after_ms``. Executions already held keep going, with the new definition. ``timing``:
        the job's, when the caller has made it already (see OwnedJob.timing). A job staged (see
        stage) is installed in its entry of the table."""
        jobs = self.table.jobs
        old = jobs.get(job.id)
        if old is job and job.key is None:
            old = None
        if old is not None:
            if job.version <= old.version:
                return False
            if old.incarnation != job.incarnation:
                self.lifecycle.recreated(job, after_ms)
            elif job.paused and not old.paused:
                self.lifecycle.cancel_job(job.id, "the job was paused")
            if old.same_timing(job) and old.paused == job.paused:
                self.table.place(job, old, keep=True)  # same timing: its pending entry stays valid
                jobs[job.id] = job
                return True
        # A new generation of the place: timer entries of any earlier object are stale.
        place = self.table.place(job, old)
        jobs[job.id] = job
        if not job.paused:
            nxt = next_occurrence(job, after_ms, timing)
            if nxt is not None:
                self.table.schedule(job, place, nxt)
        self.host.wake()
        return True

    def install_at(self, job: OwnedJob, nxt: int, after_ms: int, timing: Timing) -> None:
        """``install(job, after_ms, timing)`` for a caller that worked out the job's next occurrence
        already (``nxt``, after ``after_ms``): a node becoming ready installs millions of jobs, and
        working it out again was a sixth of the time it spent on each."""
        table = self.table
        if job.paused or job.key is not None or table.jobs.get(job.id, job) is not job:  # (install's to decide)
            self.install(job, after_ms, timing)
            return
        place = table.place(job, None)
        table.jobs[job.id] = job
        table.schedule(job, place, nxt)
        self.host.wake()

    def retime(self, job_id: str, timing: Timing, resume: Callable[[int], int | None] | None = None) -> None:
        """What the job's timing says changed (a calendar it names): its next occurrence is worked
        out again from where the timer is, not before it (an occurrence the timer passed stays as
        it was), by ``resume`` (default: the timing's next_after). ``timing``: the timing that
        changed; nothing happens if the job has another."""
        job = self.table.jobs.get(job_id)
        if job is None or job.paused or job.key is None or job.timing is not timing:
            return  # (a job staged has no timer entry yet: it is installed with the calendars of then)
        pending = job.key >> PLACE_BITS
        firing = self.progress.firing_ms
        through = firing if firing is not None else self.clock() - 1
        after = min(through, pending - 1) if pending else through
        place = self.table.place(job, job)  # a new generation: the pending entry is stale
        try:
            nxt = (resume or timing.next_after)(after)
        except Exception:  # noqa: BLE001 - one job's schedule never stops the others
            log.exception("cannot compute the next occurrence", extra={"job_id": job.id})
            nxt = None
        if nxt is not None:
            self.table.schedule(job, place, nxt)
        self.host.wake()

    def halt(self, job_id: str, reason: str) -> bool:
        """The job was paused or deleted, heard of before the change feed brings the change (see
        scheduler_node.stops): from now on it is paused here, its timer entry stale, and nothing
        of it not already being sent goes out (as when a paused version is installed). The
        feed's version of it then installs as usual. False if there was nothing to halt."""
        job = self.table.jobs.get(job_id)
        if job is None or job.paused:
            return False
        job.paused = True
        if job.key is not None:  # (a staged job has no place, nor a timer entry)
            self.table.place(job, job)
        self.lifecycle.cancel_job(job_id, reason)
        return True

    def set_slots(self, slots: frozenset[int]) -> None:
        """The slots this node owns now; jobs of slots it no longer owns are dropped, and their
        executions not yet sent are handed over (parked for the slot's new owners)."""
        dropped = self.slots - slots
        self.slots = slots
        if not dropped:
            return
        for job_id in [j.id for j in self.table.jobs.values() if j.slot in dropped]:
            self.table.pop(job_id)
        self.verifier.drop_slots(dropped)
        self.host.keep_due(lambda e: e.job.slot not in dropped)
        self.backlog.keep_only(lambda e: e.job.slot not in dropped)
        self.leases.drop_parked(lambda e: e.job.slot in dropped)  # stays parked in the claim store
        self.host.hand_over(lambda e: e.job.slot in dropped)

    def occurrence(self, job: OwnedJob, when: int, trigger: str = Trigger.SCHEDULE) -> list[Execution]:
        """The executions of ``job``'s occurrence at ``when`` (one per event of a fan-out), checked
        against history before sending if its slot's mark was lowered past ``when``."""
        out = [Execution.of(job, when, i, trigger) for i in range(job.opts.events)]
        through = self.verifier.through
        if through and when <= through.get(job.slot, -1):
            for e in out:  # its slot's mark was lowered by a loss of Redis's data past this time
                e.verify = True
        return out
