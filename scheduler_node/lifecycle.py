"""What a job's schedule says of its executions: its next occurrence, and whether an execution of
an earlier incarnation of a job created again is an occurrence of the new one (adopted by it)."""

from __future__ import annotations

import logging

from cronman.execution import Trigger
from cronman.schedule import Timing
from scheduler_node.execution import Descriptor
from scheduler_node.jobs import OwnedJob

log = logging.getLogger("cronman.node")


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
