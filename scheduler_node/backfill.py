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

What a node knows of backfills follows what changed: it reads the running ones (and the newest
cancelled ones of each namespace) once, without their timing documents, then only the rows whose
``change_xid`` moved (created, cancelled, all handed out); a backfill's timing document is read
when the node starts driving it. A cancelled backfill's executions waiting to retry are cancelled
whenever they come due.

Behind on-time work, at a fair share: a driver hands out executions only while its node's
delivery has room beyond what is due on time (none while a catch-up waits in the firer's backlog),
and at the rate :func:`cronman.model.backfills.fair_rates` gives each backfill: the cluster's backfill
rate shared max-min fairly between the namespaces, each at most its quota.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cronman.errors import TransientError
from cronman.model.backfills import fair_rates, timing_of
from cronman.model.execution import backfill_trigger
from cronman.model.hashing import slot_of
from cronman.model.schedule import Timing
from scheduler_node.aio import wait_event
from scheduler_node.execution import Execution, Stage
from scheduler_node.firer import Firer
from scheduler_node.store import CANCELLED_KEPT_PER_NAMESPACE, BackfillRow, NodeStore

log = logging.getLogger("cronman.node.backfill")

TICK_SECONDS = 0.05  # how often drivers hand out executions
RENEW_SECONDS = 1.0  # how often leases are renewed and cursors recorded (and new backfills looked for)
MAX_PER_TICK = 500  # occurrences handed out per backfill per tick at most
_DROPPED_AFTER_S = 5.0  # handed out, never claimed, and no longer queued: the firer dropped it
_VERIFY_SECONDS = 10.0  # a new driver checks history for what its predecessor may have handed out lately
_BURST_SECONDS = 0.1  # the most a driver hands out at once: a tenth of a second's worth (or one), and one more


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
    rate: float = 0.0  # executions a second: the backfill's fair share of the cluster's rate (see fair_rates)
    tokens: float = 1.0  # executions that may be handed out now (a token bucket filled at the rate)
    sure_until: float = 0.0  # loop time until which the lease surely holds (half a lease after a renewal)
    batches: deque[_Batch] = field(default_factory=deque)
    exhausted: bool = False  # no occurrence left after the cursor

    @property
    def done(self) -> bool:
        return self.exhausted and not self.batches


class BackfillDriver:
    def __init__(
        self,
        firer: Firer,
        store: NodeStore,
        holder: str,
        lease_ms: int,
        *,
        cluster_rate: float = 1000.0,
        namespace_rate: float = 100.0,
    ) -> None:
        self.firer = firer
        self.store = store
        self.holder = holder
        self.lease_ms = lease_ms
        self.cluster_rate = cluster_rate
        self.namespace_rate = namespace_rate
        self.drives: dict[str, Drive] = {}
        self.known: dict[str, BackfillRow] = {}  # running backfills, without their timing documents
        self.rates: dict[str, float] = {}  # the rate each of them is handed out at (fair_rates)
        self.cancelled: set[str] = set()  # their executions still to retry are cancelled
        self._cancelled_order: dict[str, deque[str]] = {}  # by namespace, oldest first
        self._cursor: int | None = None
        self._seen: dict[str, int] = {}  # when (node clock) each known backfill was read
        self._retry: dict[str, float] = {}  # loop time a lease held elsewhere is asked for again
        self._turn = 0  # which drive hands out first (round robin)
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
        """Learn what changed; record how far each drive got and keep its lease; start driving
        backfills nobody drives."""
        await self.learn()
        for drive in list(self.drives.values()):
            await self._record(drive, release=self._lost(drive))
        now = asyncio.get_running_loop().time()
        for row in list(self.known.values()):
            if row.id not in self.drives and self._retry.get(row.id, 0.0) <= now:
                await self._consider(row)

    async def learn(self) -> None:
        """Read the backfills that changed since the last look (all of them the first time)."""
        cursor, rows, whole = await self.store.backfill_changes(self._cursor)
        now = self.firer.clock()
        if whole:
            seen = {r.id for r in rows}
            for gone in [i for i in self.known if i not in seen]:
                self._forget(gone)
        for row in rows:
            if row.state == "running":
                if row.id not in self.known:
                    self._seen[row.id] = now
                self.known[row.id] = row
                self._retry.pop(row.id, None)  # (changed: looked at again at once)
            else:
                self._forget(row.id)
                if row.state == "cancelled":
                    self._remember_cancelled(row)
        self._cursor = cursor
        self.rates = fair_rates(
            ((r.id, r.namespace, r.rate) for r in self.known.values()), self.cluster_rate, self.namespace_rate
        )
        for drive in self.drives.values():
            drive.rate = self.rates.get(drive.row.id, drive.row.rate)

    def _forget(self, backfill_id: str) -> None:
        self.known.pop(backfill_id, None)
        self._seen.pop(backfill_id, None)
        self._retry.pop(backfill_id, None)

    def _remember_cancelled(self, row: BackfillRow) -> None:
        if row.id in self.cancelled:
            return
        self.cancelled.add(row.id)
        order = self._cancelled_order.setdefault(row.namespace, deque())
        order.append(row.id)
        while len(order) > CANCELLED_KEPT_PER_NAMESPACE:
            self.cancelled.discard(order.popleft())

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
            await self._end_orphaned(row)
            return
        job = self.firer.jobs.get(row.job_id)
        if job is None or job.incarnation != row.incarnation:
            # Deleted (or created again) since the row was read, as this node's jobs say once its
            # job feed was read after the row, or its slot taken over and still loading here (the
            # firer owns a slot before its jobs are installed): the database tells which.
            read = self.firer.progress.feed_read_ms
            mine = slot_of(row.job_id, self.firer.cfg.slots) in self.firer.slots
            if mine and read is not None and read > self._seen.get(row.id, read):
                await self._end_orphaned(row)
            return  # (or not loaded yet)
        if job.slot not in self.firer.slots:
            return  # not this node's to drive
        got = await self.store.lease_backfill(row.id, self.holder, self.lease_ms)
        if got is None:  # driven by another owner: asked for again a third of a lease later
            self._retry[row.id] = asyncio.get_running_loop().time() + self.lease_ms / 3000
            return
        cursor = row.from_ms - 1 if got[0] is None else got[0]
        document = row.timing or await self.store.backfill_timing(row.id)
        try:
            if document is None:
                raise ValueError("the backfill is gone")
            timing = timing_of(document, row.job_id, job.namespace)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("cannot compute a backfill's occurrences: %s", exc, extra={"backfill_id": row.id})
            await self._end(row, f"its occurrences cannot be computed: {exc}")
            return
        now = asyncio.get_running_loop().time()
        verify = int(row.rate * _VERIFY_SECONDS) + 20  # (a driver before this one may have handed them out)
        trigger = backfill_trigger(row.id)
        drive = Drive(row, timing, trigger, cursor, got[1], cursor, got[1], now, verify_left=verify)
        drive.rate = self.rates.get(row.id, row.rate)
        drive.sure_until = now + self.lease_ms / 2000
        self.drives[row.id] = drive
        log.info("driving a backfill", extra={"backfill_id": row.id, "job_id": row.job_id, "dispatched": got[1]})

    async def _end_orphaned(self, row: BackfillRow) -> None:
        """End a backfill whose job looks gone, if the database says it is; if it lives (its slot
        is still loading here), look again a third of a lease later."""
        if await self.store.end_orphaned_backfill(row.id):
            log.info("backfill ended: the job was deleted", extra={"backfill_id": row.id, "job_id": row.job_id})
            self._forget(row.id)
        else:
            self._retry[row.id] = asyncio.get_running_loop().time() + self.lease_ms / 3000

    async def _end(self, row: BackfillRow, reason: str) -> None:
        await self.store.end_backfill(row.id, reason)
        self._forget(row.id)

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
                queued = {id(e) for e in self.firer.timer.due} | {id(e) for e in self.firer.timer.claiming}
            if any(id(e) in queued for e in waiting):
                return
            drive.batches.clear()
            drive.cursor, drive.count, drive.exhausted = drive.confirmed, drive.confirmed_count, False
            return

    # ------------------------------------------------------------------ handing out
    def hand_out(self, now: float) -> None:
        """Hand out what each drive's rate allows, while the node's delivery has room beyond its
        on-time work (drives take turns being first)."""
        room = self.firer.timer.spare_room()
        if room <= 0 or not self.drives:
            return
        out: list[Execution] = []
        drives = list(self.drives.values())
        self._turn = (self._turn + 1) % len(drives)
        for drive in drives[self._turn :] + drives[: self._turn]:
            if room - len(out) <= 0:
                break
            if drive.row.id in self.cancelled or now > drive.sure_until:
                continue  # (a lease not renewed lately may be another node's by now)
            job = self.firer.jobs.get(drive.row.job_id)
            if job is None or job.paused or job.incarnation != drive.row.incarnation:
                continue
            rate = drive.rate
            # (one more than the burst: what a tick leaves short of a whole execution is kept; capped
            # at one, a rate below one a tick lost a third of itself to rounding)
            burst = max(1.0, rate * _BURST_SECONDS) + 1.0
            drive.tokens = min(burst, drive.tokens + (now - drive.paced_at) * rate)
            drive.paced_at = now
            for _ in range(MAX_PER_TICK):
                if drive.tokens < 1 or drive.exhausted or len(out) >= room:
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
