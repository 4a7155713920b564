"""The change feed of the slots a node owns: job rows and triggers whose transaction id is at least
the ``xmin`` of the previous read (no late commit skipped), installed, updated or removed in the
firer, and the triggers (manual, redeliveries) queued once each. A stop heard on notice
(scheduler_node.stops) holds a job paused until the feed brings a change at least as new.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cronman.model.execution import Trigger
from scheduler_node.execution import Descriptor, Execution
from scheduler_node.jobs import JobRow, OwnedJob
from scheduler_node.loading import TRIGGER_LOOKBACK_MS
from scheduler_node.store import TriggerRow

if TYPE_CHECKING:
    from scheduler_node.node import Node

log = logging.getLogger("cronman.node")


class Feed:
    """Where the node has read the change feed to, and the triggers it has queued. It reads the
    node's clock, parts, firer and owned slots, and writes none of them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.cursor: int | None = None  # read up to here (None: before the first load)
        self._seen_triggers: dict[int, int] = {}  # trigger id -> asked for at (ms)

    def loaded(self, cursor: int) -> None:
        """A load read the feed up to ``cursor``: the feed goes on from no later than that."""
        self.cursor = cursor if self.cursor is None else min(self.cursor, cursor)

    def apply_row(self, row: JobRow) -> bool:
        """Install, update or remove one job from a change-feed row."""
        node = self.node
        firer = node.firer
        assert firer is not None
        row = node.stops.row(row)  # (paused, if older than a stop heard of the job)
        old = firer.jobs.get(row.id)
        if old is not None and row.version <= old.version:
            return False
        if row.deleted:
            if old is not None:
                firer.remove(row.id, "the job was deleted")
            return False
        try:
            job = node.decoder.job(row)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("cannot schedule job: %s", exc, extra={"job_id": row.id})
            if old is not None:
                firer.remove(row.id, f"the job cannot be scheduled: {exc}")
            return False
        if not node.ready:
            node.loading.stage(job, row.updated_ms - 1)
            return True
        return firer.install(job, row.updated_ms - 1)

    async def poll(self) -> None:
        """Read the feed once, from where the last read got to."""
        node = self.node
        firer = node.firer
        assert node.parts is not None and firer is not None
        if self.cursor is None:
            return
        started = node.now_ms()
        cursor, rows, triggers = await node.parts.store.poll_changes(self.cursor, node.owned)
        if any(node.configuration.names_unknown_calendar(row) for row in rows if row.slot in node.owned):
            # a calendar made just before the job that names it: know it before the job fires
            node.configuration.set(await node.parts.store.cluster_config())
        for row in rows:
            if row.slot in node.owned and self.apply_row(row):
                node.metrics.changes_applied.inc()
        self.apply_triggers(triggers, verify=False)
        node.stops.read(started)
        if firer.standby is not None:
            firer.standby.feed_read(cursor, [(row.slot, row.xid) for row in rows if row.slot in node.owned])
        if len(self._seen_triggers) > 10_000:
            cutoff = node.now_ms() - 2 * TRIGGER_LOOKBACK_MS
            self._seen_triggers = {k: v for k, v in self._seen_triggers.items() if v > cutoff}
        self.cursor = cursor
        firer.progress.feed_read(started)
        node.metrics.jobs_owned.set(len(node.jobs))

    def apply_triggers(self, triggers: list[TriggerRow], verify: bool, again: bool = False) -> None:
        """Queue the triggers not queued before (``again``: only those, claimed again after a loss
        of Redis's data), ``verify``: checked against history first."""
        firer = self.node.firer
        assert firer is not None
        out: list[Execution] = []
        for t in triggers:
            # Again: only what the feed brought before, with the job's changes up to it (one the
            # feed has not brought yet comes with them: seed 400050, a trigger read before the
            # job's resume was, fired on a paused job's terms, which retry nothing).
            if (t.id in self._seen_triggers) != again:
                continue
            job = firer.jobs.get(t.job_id)
            if job is None or (t.incarnation is not None and t.incarnation != job.incarnation):
                continue
            self._seen_triggers[t.id] = t.requested_ms
            out.extend(_triggered(job, t))
        if out:
            firer.enqueue(out, verify=verify)


def _triggered(job: OwnedJob, t: TriggerRow) -> list[Execution]:
    if t.kind == "redeliver" and t.scheduled_ms is not None:
        # The same execution again, under its own id, as the next attempt; a claim of its own.
        d = Descriptor(
            job.id, job.incarnation, t.scheduled_ms, t.event_index or 0, t.trigger or Trigger.SCHEDULE, f"r{t.id}"
        )
        e = Execution(job, d)
        e.attempt = t.attempt or 1
        return [e]
    trigger = Trigger.AFTER if t.kind == "after" else Trigger.MANUAL  # (after: its upstreams succeeded)
    return [Execution.of(job, t.requested_ms, i, trigger) for i in range(job.opts.events)]
