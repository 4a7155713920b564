"""Payloads out of memory: a node keeps a job's payload only while the job's next occurrence is
within the payload horizon (``payload_horizon_seconds``, 10 minutes by default), and payloads of
up to ALWAYS_KEPT_BYTES always. At millions of jobs of hourly and daily schedules, that is a few
percent of the payloads, where the payload was most of what a job cost a node's memory.

- A node's load leaves the longer payloads out (Decoder.payload_limit).
- When a job is scheduled (Timetable.schedule) with its next occurrence after ``keep_until``, it
  lets its payload go; an execution made before keeps the payload it was made with (its retries
  send the same).
- The read-ahead (:class:`PayloadReader`) moves ``keep_until`` to now plus the horizon every pass
  (a twentieth of the horizon, 2 to 30 s apart) and reads the payloads of the jobs due by then
  that have none, by primary key, READ_BATCH at a time: those the table's ``unread`` heap holds
  (Timetable.unread_by), so a pass costs what came within its reach since the last. A payload
  read applies to the job only if the job is still the one in the table at the version read (a
  newer version comes from the change feed with its payload).
- An execution whose job has no payload when it is about to be delivered (a manual trigger or a
  redelivery of a job due later, a claim taken over, the read-ahead behind) waits, holding its
  claim, for a read of its own, batched with the others waiting (Deliveries). A read that fails
  is tried again; one that finds the job deleted (or created again) cancels the execution.

So a PostgreSQL outage shorter than the horizon, less one pass, delays no occurrence: everything
due in that time was read before it began (after a load, once the read-ahead has reached the
horizon, soonest due first, over ten passes: see PayloadReader.wake). A longer one delays the
occurrences due after that (they wait for PostgreSQL, and are delivered, late, when it is back),
where every payload held in memory kept them firing: the price of the memory.
``payload_horizon_seconds=0`` keeps every payload in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from cronman.errors import TransientError
from scheduler_node.aio import wait_event
from scheduler_node.jobs import OwnedJob
from scheduler_node.metrics import NodeMetrics
from scheduler_node.store.port import PayloadRow
from scheduler_node.timetable import PLACE, PLACE_BITS, Timetable

log = logging.getLogger("cronman.node")

READ_BATCH = 5000  # payloads read by one statement
PASS_MOST = 1_000_000  # payloads read by one pass of the read-ahead at most (the rest at the next)

ReadPayloads = Callable[[Sequence[str]], Awaitable[dict[str, PayloadRow]]]


def pass_seconds(horizon_ms: int) -> float:
    """How far apart the read-ahead's passes are: a twentieth of the horizon, 2 to 30 s."""
    return min(30.0, max(2.0, horizon_ms / 20_000))


class PayloadReader:
    """Reads payloads left out of memory: ahead of their jobs' time (:meth:`run`), or when an
    execution needs one now (:meth:`read`)."""

    def __init__(
        self,
        *,
        table: Timetable,
        read: ReadPayloads,
        clock: Callable[[], int],
        horizon_ms: int,
        metrics: NodeMetrics,
    ) -> None:
        self.table = table
        self._read = read
        self.clock = clock
        self.horizon_ms = horizon_ms
        self.metrics = metrics
        self.every_s = pass_seconds(horizon_ms)
        # How far ahead a pass reads: the horizon, reached step by step after a load (see wake)
        self.step_ms = min(horizon_ms, int(2000 * self.every_s))
        self.reach_ms = self.step_ms
        self._ahead = metrics.payloads_read.labels("ahead")
        self._needed = metrics.payloads_read.labels("needed")
        self._wake = asyncio.Event()
        self._failing_since: float | None = None
        self._left: list[OwnedJob] = []  # taken for a read that failed

    def wake(self) -> None:
        """Read ahead soon: jobs were loaded, each without its payload. What they need is read
        over the next passes, soonest due first, a pass reaching a step further than the last
        (2 passes' worth, up to the horizon): a node starting with millions of jobs read 6 % of
        them at once (400,000 payloads a node at 10M jobs), a burst of PostgreSQL's and the node's
        CPU that made every occurrence of the next minute late on a busy machine."""
        self.reach_ms = self.step_ms
        self._wake.set()

    async def read(self, job_ids: Sequence[str]) -> dict[str, PayloadRow]:
        """The stored payloads of these jobs, for executions that need them now (TransientError
        when PostgreSQL cannot be reached)."""
        rows = await self._call(job_ids)
        self._needed.inc(len(rows))
        return rows

    async def _call(self, job_ids: Sequence[str]) -> dict[str, PayloadRow]:
        try:
            return await self._read(job_ids)
        except TransientError:
            self.metrics.payload_read_failures.inc()
            raise

    def keep(self, job: OwnedJob, row: PayloadRow | None, needed: bool = False) -> bool:
        """``row``, read for ``job``, becomes its payload if ``job`` is still the table's at that
        version and has none; one ``needed`` by an execution (a manual trigger of a job due
        tomorrow) only if the job is due within the horizon: else the job would hold it until its
        next occurrence."""
        if (
            row is None
            or job.payload is not None
            or row.version != job.version
            or row.incarnation != job.incarnation
            or self.table.jobs.get(job.id) is not job
        ):
            return False
        if needed and (job.key is None or job.key <= PLACE or job.key >> PLACE_BITS > self.table.keep_until):
            return False
        job.payload = row.payload
        return True

    async def ahead(self) -> int:
        """One pass: the jobs next due within the horizon that have no payload get theirs (those
        scheduled since the last pass, and any a failed read left); how many did."""
        now = self.clock()
        self.table.keep_until = now + self.horizon_ms
        until = now + self.reach_ms
        self.reach_ms = min(self.horizon_ms, self.reach_ms + self.step_ms)
        kept = 0
        for _ in range(PASS_MOST // READ_BATCH):
            if self._left:  # (what a failed read took: still wanting?)
                chunk = [j for j in self._left if j.payload is None and self.table.jobs.get(j.id) is j]
                self._left = []
            else:
                chunk = self.table.unread_by(until, READ_BATCH)
            if not chunk:
                if self.table.unread and self.table.unread[0] >> PLACE_BITS <= until:
                    continue
                break
            try:
                rows = await self._call([j.id for j in chunk])
            except TransientError:
                self._left = chunk  # (read first at the next pass)
                raise
            self._ahead.inc(len(rows))
            kept += sum(self.keep(job, rows.get(job.id)) for job in chunk)
        return kept

    async def run(self, stopping: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        while not stopping():
            try:
                await self.ahead()
                if self._failing_since is not None:
                    failed_s = round(loop.time() - self._failing_since, 1)
                    log.info("payloads read ahead again", extra={"after_s": failed_s})
                    self._failing_since = None
            except TransientError as exc:
                if self._failing_since is None:
                    self._failing_since = loop.time()
                    log.warning("cannot read payloads ahead, retrying: %s", exc)
            except Exception:  # noqa: BLE001 - a bug must not stop the read-ahead; it runs again
                log.exception("payload read-ahead failed")
            self._wake.clear()
            await wait_event(self._wake, self.every_s)
