"""A job's changes as its executions see them: a pause or a delete cancels what waits (one in
flight finishes, unretried); a job created again adopts the earlier incarnation's executions of
the occurrences its schedule has. And what a job's schedule says: its next occurrence, and whether
an execution of an earlier incarnation is an occurrence of the new one (adoptable)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from cronman.model.execution import Trigger
from cronman.model.schedule import Timing
from scheduler_node.aio import Trace
from scheduler_node.backlog import Backlog
from scheduler_node.execution import Descriptor, Execution, Stage
from scheduler_node.jobs import OwnedJob
from scheduler_node.leases import Leases
from scheduler_node.timetable import Timetable

log = logging.getLogger("cronman.node")

RECREATED_KEPT = 10_000  # jobs deleted and created again remembered for adoption (the latest)


class LifecycleHost(Protocol):
    """What a job's changes ask of the firer whose executions they end or adopt."""

    @property
    def trace(self) -> Trace | None: ...
    @property
    def due(self) -> list[Execution]: ...

    def keep_due(self, wanted: Callable[[Execution], bool]) -> None:
        """Of the executions waiting for a timer pass to claim them, keep those ``wanted``."""

    def unwait(self, e: Execution) -> None:
        """``e`` no longer waits: it gives back its throttle permit and its host's place."""

    def cancel(self, e: Execution, reason: str) -> None:
        """End ``e``, cancelled (its row recorded, its claim marked done)."""


class Lifecycle:
    __slots__ = ("host", "table", "leases", "backlog", "_recreated")

    def __init__(self, host: LifecycleHost, *, table: Timetable, leases: Leases, backlog: Backlog) -> None:
        self.host = host
        self.table = table
        self.leases = leases
        self.backlog = backlog
        # Jobs deleted and created again: (new incarnation, scheduled from), for executions of the
        # earlier one that were on their way to a claim when the new one arrived (see adopt_claimed).
        self._recreated: dict[str, tuple[int, int]] = {}

    def recreated(self, job: OwnedJob, after_ms: int) -> None:
        """``job`` replaces an earlier incarnation of its id (deleted and created again), scheduled
        from ``after_ms``: what of the earlier one it has is its, the rest is cancelled."""
        self._recreated[job.id] = (job.incarnation, after_ms)
        while len(self._recreated) > RECREATED_KEPT:
            del self._recreated[next(iter(self._recreated))]
        self.adopt(job, after_ms)
        self.cancel_job(job.id, "the job was deleted and created again", keep=job.incarnation)

    def remove(self, job_id: str, reason: str) -> None:
        """The job is gone from this node (deleted, or its schedule broken): nothing more of it."""
        self.table.pop(job_id)
        self.cancel_job(job_id, reason)

    def adopt(self, job: OwnedJob, since_ms: int) -> None:
        """A job deleted and created again (``job`` is the new incarnation, scheduled from
        ``since_ms``): an execution of the earlier incarnation held here, or waiting for its
        claim, goes on as the new one's when the new one has the same occurrence. Its id and
        claim do not depend on the incarnation, so the new incarnation's owners cannot claim it
        while this node holds it: cancelling it would lose the new incarnation's occurrence."""
        waiting = self.backlog.waiting(job.id)
        leases, trace = self.leases, self.host.trace
        for e in [*leases.held.values(), *leases.parked.values(), *self.host.due, *waiting]:
            if (
                e.job.incarnation != job.incarnation
                and e.job.namespace == job.namespace  # (another tenant's job: its own accounting)
                and adoptable(job, e.d, since_ms)
            ):
                if trace:
                    trace("adopt", e, f"by incarnation {job.incarnation}")
                e.job, e.payload = job, job.payload

    def adopt_claimed(self, current: OwnedJob, e: Execution) -> None:
        """``e`` was claimed for an earlier incarnation of ``current`` while ``current`` arrived (a
        claim made again after the job was created again): ``current``'s when it has the
        occurrence, as :meth:`adopt` does for what is held. Its timer does not derive the
        occurrence again (the same schedule keeps its timer entry). Seed 74337."""
        since = self._recreated.get(current.id)
        if since is not None and since[0] == current.incarnation and adoptable(current, e.d, since[1]):
            trace = self.host.trace
            if trace:
                trace("adopt", e, f"by incarnation {current.incarnation} (just claimed)")
            e.job, e.payload = current, current.payload

    def cancel_job(self, job_id: str, reason: str, keep: int | None = None) -> None:
        """No further attempt of a deleted or paused job (one in flight finishes), except what
        incarnation ``keep`` (the job created again) adopted."""
        host, leases = self.host, self.leases
        for e in [e for e in leases.held.values() if e.d.job_id == job_id and e.stage is Stage.WAITING]:
            if e.job.incarnation == keep:
                continue
            host.unwait(e)
            host.cancel(e, reason)
        for e in [e for e in leases.parked.values() if e.d.job_id == job_id]:
            if e.job.incarnation == keep:
                continue
            leases.unpark(e)
            host.cancel(e, reason)
        host.keep_due(lambda e: e.d.job_id != job_id or (keep is not None and e.job.incarnation == keep))
        self.backlog.cancel(job_id, keep)  # those in the backlog are let go as they come out of it


def adoptable(job: OwnedJob, d: Descriptor, since_ms: int) -> bool:
    """Whether an execution of an earlier incarnation of ``job``'s id is an occurrence of ``job``
    (created again, scheduled from ``since_ms``): a scheduled one, after then, on its schedule."""
    return (
        d.job_id == job.id
        and d.incarnation != job.incarnation
        and d.trigger == Trigger.SCHEDULE
        and not d.suffix
        and not job.paused
        and d.scheduled_ms > since_ms
        and next_occurrence(job, d.scheduled_ms - 1) == d.scheduled_ms
    )


def next_occurrence(job: OwnedJob, after_ms: int, timing: Timing | None = None) -> int | None:
    """The job's next occurrence; a schedule that cannot compute one has none (logged)."""
    try:
        return (job.timing if timing is None else timing).next_after(after_ms)
    except Exception:  # noqa: BLE001 - one job's schedule never stops the timer
        log.exception("cannot compute the next occurrence", extra={"job_id": job.id})
        return None
