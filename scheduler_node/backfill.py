"""Driving backfills: handing a backfill's executions to the firing core at its rate.

One node drives a running backfill at a time: an owner of the job's slot that holds the backfill's
lease (kept in PostgreSQL, judged by the database's clock). The driver hands out the occurrences
after the backfill's cursor, at most ``max_per_second`` executions a second, as executions with
the trigger ``backfill:<id>``; from there they are executions like any other (claimed, sent,
retried, taken over when their holder dies, recorded).

The cursor moves only past occurrences whose executions were claimed (their claims are in the
claim store, where any owner of the slot finds them), and is recorded with each renewal of the
lease. A driver that dies loses nothing: the next one starts from the recorded cursor, and what
it hands out again is refused by the claims already made (the first few are also checked against
history, in case the claim store lost them). Only the lease holder hands out executions, so the
rate holds across the cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cronman.backfills import timing_of
from cronman.errors import TransientError
from cronman.execution import backfill_trigger
from cronman.schedule import Timing
from scheduler_node.execution import Execution, Stage
from scheduler_node.firer import Firer, wait_event
from scheduler_node.store import BackfillRow, NodeStore

log = logging.getLogger("cronman.node.backfill")

TICK_SECONDS = 0.05  # how often drivers hand out executions
RENEW_SECONDS = 1.0  # how often leases are renewed and cursors recorded (and new backfills looked for)
MAX_PER_TICK = 500  # occurrences handed out per backfill per tick at most
_DROPPED_AFTER_S = 5.0  # handed out, never claimed, and no longer queued: the firer dropped it
_VERIFY_SECONDS = 10.0  # a new driver checks history for what its predecessor may have handed out lately
_BURST_SECONDS = 0.1  # the most a driver hands out at once: a tenth of a second's worth (or one)


@dataclass
class _Batch:
    at_ms: int  # the occurrence
    executions: list[Execution]
    handed_out: float  # loop time


@dataclass
class Drive:
    """A backfill this node drives."""

    row: BackfillRow
    timing: Timing
    trigger: str
    cursor: int  # the last occurrence handed out
    count: int  # executions handed out, up to the cursor
    confirmed: int  # the last occurrence whose executions (and all before) are claimed
    confirmed_count: int
    paced_at: float  # loop time the tokens were counted at
    verify_left: int  # executions still to check against history before sending
    tokens: float = 1.0  # executions that may be handed out now (a token bucket filled at the rate)
    sure_until: float = 0.0  # loop time until which the lease surely holds (half a lease after a renewal)
    batches: deque[_Batch] = field(default_factory=deque)
    exhausted: bool = False  # no occurrence left after the cursor

    @property
    def done(self) -> bool:
        return self.exhausted and not self.batches


class BackfillDriver:
    def __init__(self, firer: Firer, store: NodeStore, holder: str, lease_ms: int) -> None:
        self.firer = firer
        self.store = store
        self.holder = holder
        self.lease_ms = lease_ms
        self.drives: dict[str, Drive] = {}
        self.cancelled: frozenset[str] = frozenset()
        self.wake = asyncio.Event()

    # ------------------------------------------------------------------ loops
    async def run(self, ready: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        renew_at = 0.0
        while True:
            now = loop.time()
            if now >= renew_at or self.wake.is_set():
                self.wake.clear()
                renew_at = now + RENEW_SECONDS
                if ready():
                    try:
                        await self.renew()
                    except TransientError as exc:
                        log.warning("could not renew backfills: %s", exc)
                    except Exception:  # noqa: BLE001 - the next round tries again
                        log.exception("renewing backfills failed")
            self.hand_out(loop.time())
            await wait_event(self.wake, TICK_SECONDS if self.drives else RENEW_SECONDS)

    async def renew(self) -> None:
        """Record how far each drive got and keep its lease; start driving backfills nobody drives."""
        rows = await self.store.backfills()
        self.cancelled = frozenset(r.id for r in rows if r.state == "cancelled")
        for drive in list(self.drives.values()):
            await self._record(drive, release=self._lost(drive))
        for row in rows:
            if row.state == "running" and row.id not in self.drives:
                await self._consider(row)

    async def release_all(self) -> None:
        """Stop driving (the node stops): record how far each drive got and let others go on."""
        for drive in list(self.drives.values()):
            try:
                await self._record(drive, release=True)
            except TransientError as exc:
                log.warning("could not release a backfill: %s", exc, extra={"backfill_id": drive.row.id})

    # ------------------------------------------------------------------ leases
    async def _consider(self, row: BackfillRow) -> None:
        if row.live_incarnation != row.incarnation:
            await self.store.end_backfill(row.id, "the job was deleted")
            return
        job = self.firer.jobs.get(row.job_id)
        if job is None or job.incarnation != row.incarnation or job.slot not in self.firer.slots:
            return  # not this node's to drive (or not loaded yet)
        got = await self.store.lease_backfill(row.id, self.holder, self.lease_ms)
        if got is None:
            return
        cursor = row.from_ms - 1 if got[0] is None else got[0]
        try:
            timing = timing_of(row.timing, row.job_id, job.namespace)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("cannot compute a backfill's occurrences: %s", exc, extra={"backfill_id": row.id})
            await self.store.end_backfill(row.id, f"its occurrences cannot be computed: {exc}")
            return
        now = asyncio.get_running_loop().time()
        verify = int(row.rate * _VERIFY_SECONDS) + 20  # (a driver before this one may have handed them out)
        trigger = backfill_trigger(row.id)
        drive = Drive(row, timing, trigger, cursor, got[1], cursor, got[1], now, verify_left=verify)
        drive.sure_until = now + self.lease_ms / 2000
        self.drives[row.id] = drive
        log.info("driving a backfill", extra={"backfill_id": row.id, "job_id": row.job_id, "dispatched": got[1]})

    def _lost(self, drive: Drive) -> bool:
        """Whether this node should stop driving: the job's slot moved away, or the job is gone."""
        job = self.firer.jobs.get(drive.row.job_id)
        return job is None or job.incarnation != drive.row.incarnation or job.slot not in self.firer.slots

    async def _record(self, drive: Drive, *, release: bool) -> None:
        self._confirm(drive)
        row = drive.row
        cursor = None if drive.confirmed < row.from_ms else drive.confirmed
        kept = await self.store.renew_backfill(
            row.id, self.holder, self.lease_ms, cursor, drive.confirmed_count, done=drive.done, release=release
        )
        drive.sure_until = asyncio.get_running_loop().time() + self.lease_ms / 2000
        if not kept or release or drive.done:
            self.drives.pop(row.id, None)
            if drive.done:
                log.info("backfill handed out", extra={"backfill_id": row.id, "dispatched": drive.confirmed_count})

    def _confirm(self, drive: Drive) -> None:
        """Move the confirmed point past batches whose executions are all claimed; hand out again
        from there what the firer dropped unclaimed (a pause, a slot moving away)."""
        queued: set[int] | None = None
        now = asyncio.get_running_loop().time()
        while drive.batches:
            batch = drive.batches[0]
            waiting = [e for e in batch.executions if e.stage is Stage.NEW]
            if not waiting:
                drive.batches.popleft()
                drive.confirmed = batch.at_ms
                drive.confirmed_count += len(batch.executions)
                continue
            if now - batch.handed_out < _DROPPED_AFTER_S:
                return
            if queued is None:  # (waiting to be claimed, or in a claim call out now)
                queued = {id(e) for e in self.firer.due} | {id(e) for e in self.firer.claiming}
            if any(id(e) in queued for e in waiting):
                return
            drive.batches.clear()
            drive.cursor, drive.count, drive.exhausted = drive.confirmed, drive.confirmed_count, False
            return

    # ------------------------------------------------------------------ handing out
    def hand_out(self, now: float) -> None:
        out: list[Execution] = []
        for drive in self.drives.values():
            if drive.row.id in self.cancelled or now > drive.sure_until:
                continue  # (a lease not renewed lately may be another node's by now)
            job = self.firer.jobs.get(drive.row.job_id)
            if job is None or job.paused or job.incarnation != drive.row.incarnation:
                continue
            rate = drive.row.rate
            drive.tokens = min(max(1.0, rate * _BURST_SECONDS), drive.tokens + (now - drive.paced_at) * rate)
            drive.paced_at = now
            for _ in range(MAX_PER_TICK):
                if drive.tokens < 1 or drive.exhausted:
                    break
                t = drive.timing.next_after(drive.cursor)
                if t is None or t > drive.row.to_ms or t <= drive.cursor:
                    drive.exhausted = True
                    break
                executions = [Execution.of(job, t, i, drive.trigger) for i in range(drive.row.events)]
                for e in executions:
                    if drive.verify_left > 0:
                        e.verify = True
                        drive.verify_left -= 1
                drive.batches.append(_Batch(t, executions, now))
                drive.cursor, drive.count = t, drive.count + len(executions)
                drive.tokens -= len(executions)
                out.extend(executions)
        if out:
            self.firer.enqueue(out)
