"""The cluster-wide configuration a node reads whole: throttle policies, signing secrets and
calendars (small tables), every few seconds and at once on a change notification. Calendars decide
what is due: ``timing_of`` is a job's timing with them (``cronman.model.calendars.timing_with``), and an
occurrence on an excluded day is skipped before it is sent (``screen``), its row standing for the
excluded span.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from cronman.errors import TransientError
from cronman.model.calendars import CalendarTiming, SkipSummary, skip_summary, timing_with
from cronman.model.execution import Status, Trigger, backfill_of
from cronman.model.schedule import Timing
from scheduler_node.aio import wait_event
from scheduler_node.execution import Execution
from scheduler_node.jobs import CalendarBook, JobRow, OwnedJob, WithCalendars
from scheduler_node.store import ClusterConfig

if TYPE_CHECKING:
    from scheduler_node.node import Node

log = logging.getLogger("cronman.node")

_CONFIG_SECONDS = 5.0  # throttle policies, signing secrets and calendars


class Configuration:
    """The configuration as last read, and the calendars the timings of jobs that name them look
    up. It reads the node's parts, firer, decoder and backfills, and writes none of them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.current = ClusterConfig({}, {})
        self.calendars = CalendarBook()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Read the configuration now (a change notification)."""
        self._wake.set()

    async def loop(self) -> None:
        """Read the configuration every few seconds, and when woken."""
        node = self.node
        assert node.parts is not None
        while not node.stopping:
            try:
                self.set(await node.parts.store.cluster_config())
            except TransientError as exc:
                log.warning("could not refresh throttle policies, signing secrets and calendars: %s", exc)
            await wait_event(self._wake, _CONFIG_SECONDS)  # a change notification wakes it early
            self._wake.clear()
            await asyncio.sleep(0.2)

    def set(self, config: ClusterConfig) -> None:
        """The configuration as read: the throttle gate's policies, and the calendars (the jobs
        naming one that changed work out their next occurrence again)."""
        node = self.node
        assert node.parts is not None
        self.current = config
        if node.parts.throttle is not None:
            node.parts.throttle.policies = config.throttles
        changed = self.calendars.take(config.calendars)
        if changed and node.firer is not None:
            # The timer may have jumped over days a calendar excluded before: the jobs that name a
            # changed calendar work out their next occurrence again (only those: found by name).
            for timing in self.calendars.users(changed):
                node.firer.book.retime(timing.job_id, timing, timing.resume_after)

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
        found = {n: c for n in names if (c := self.current.calendars.get((job.namespace, n))) is not None}
        return timing_with(timing, names, found)

    def screen(self, e: Execution) -> tuple[Status, str] | tuple[Status, str, SkipSummary | None] | None:
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
        if backfill is not None and backfill in self.node.backfills.cancelled:
            return Status.CANCELLED, f"the backfill {backfill} was cancelled"
        return None

    def names_unknown_calendar(self, row: JobRow) -> bool:
        """Whether a change-feed row names a calendar this node does not know yet."""
        if row.deleted or '"calendars"' not in row.options_text:
            return False
        try:
            names = self.node.decoder.options(row.options_text).calendars
        except (ValueError, TypeError):
            return False
        return any((row.namespace, n) not in self.current.calendars for n in names)

    def _excluded_by(self, job: OwnedJob, t: int) -> str | None:
        for name in job.opts.calendars:
            cal = self.current.calendars.get((job.namespace, name))
            if cal is not None and cal.excludes(t):
                return f"calendar {name}: {cal.local_date(t).isoformat()} is excluded ({cal.timezone})"
        return None
