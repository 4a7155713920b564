"""What a node does about the times nobody fired: outages of the whole cluster, losses of Redis's
data, and the progress it records so that a slot's next owner knows where to resume.

Outages. A node ready to fire decides under a lock on ``cluster_outages`` whether the cluster had an
outage (no firing for ``outage_after_seconds``) and records it, so that every node applies the
misfire policy to the same span (:meth:`Recovery.judge_outage`). A slot taken over is caught up
from the furthest point any of its owners reached (:meth:`Recovery.catch_up`): occurrences due
while a node was alive are delivered late; only those due in an outage get the misfire policy, also
when the execution carrying the plan is taken over (:meth:`Recovery.misfire_of`).

Losses of Redis's data. An emptied Redis answers heartbeats with a new epoch token. The node claims
again, checked against history, what the loss may have left unclaimed (:meth:`Recovery.heard`), and
records the loss, which lowers every node's recorded progress to the same point; a node first
reaching Redis records a loss nobody noticed (a power cut of it all).

Progress. Every ``progress_seconds`` a node records how far it has claimed what it owes, for the
slots whose catch-up it has claimed (:meth:`Recovery.save_progress`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from cronman.errors import TransientError
from cronman.model import misfire
from cronman.model.execution import Trigger
from cronman.model.schedule import Timing
from cronman.model.timeutil import iso
from scheduler_node.execution import Execution
from scheduler_node.jobs import OwnedJob
from scheduler_node.store import bitmap

if TYPE_CHECKING:
    from scheduler_node.node import Node

log = logging.getLogger("cronman.node")

_TRIGGERS_AGAIN_TRIES = 120  # reads of recent triggers after a loss of Redis's data, a second apart

Outage = tuple[int, int]


class Loss(NamedTuple):
    """Redis lost the data of an epoch, noticed when it answered with another."""

    lost: str
    current: str
    since: int  # occurrences from then on are claimed again (the recent past)
    reach: int  # and from as far back as this, where a node gone since had recorded less progress
    live: frozenset[str]  # incarnations heartbeating before the loss (they claim again what they hold)


class Recovery:
    """The node's outages, its view of Redis's epoch and the losses it noticed, and which slots its
    recorded progress speaks for. It reads the node's settings, clock, parts and firer, and writes
    none of them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._outages: list[Outage] = []
        self.epoch: str | None = None  # the Redis data's epoch token, as last seen
        self._epoch_ok_ms = 0
        self._losses: list[Loss] = []  # Redis data lost, to be recorded
        self._recording: asyncio.Task[bool] | None = None  # the heartbeat's recording of those
        self._unnoticed: asyncio.Task[None] | None = None  # looking for losses nobody recorded
        # Triggers to claim again after a loss of Redis's data, asked for from then (see _triggers_again)
        self._triggers_since: int | None = None
        self._triggering: asyncio.Task[None] | None = None
        self._cluster_progress_ms: int | None = None  # as Redis last reported it
        # Slots loaded since the firer last claimed through the time they were loaded at: what they
        # owe (their catch-up) is not claimed yet, so this node's progress does not speak for them.
        self._unsettled: dict[int, int] = {}  # slot -> loaded at (ms)
        # The open work's earliest time as last saved (see open_from): a stopping node hands its
        # open work over to the slots' owners through Redis, and its last save still speaks for it.
        self._open_saved: int | None = None

    # ------------------------------------------------------------------ outages
    def know_outages(self, outages: list[Outage]) -> None:
        """Add outages (as read from ``cluster_outages``) to those this node knows."""
        self._outages = merged([*self._outages, *outages])

    async def learn_outages(self, since: int) -> None:
        """Add the cluster's outages ending after ``since`` to those this node knows."""
        assert self.node.parts is not None
        self.know_outages(await self.node.parts.store.outages(since))

    def outages_from(self, earliest: int, now: int) -> int:
        """How far back this node must know the cluster's outages: what it catches up, and what a
        loss of Redis's data makes it claim again (whose misfire policies must not be undone: seed
        870158 with power cuts, an occurrence a skip policy skipped in an outage that ended before
        the node caught up from was claimed again after a loss, and fired)."""
        back = int(self.node.s.loss_lookback_seconds * 1000) + self.recent_past_ms
        return min(now - back, earliest)

    async def judge_outage(self, now: int) -> None:
        """The first ownership is loaded: if no node was firing, record the outage (decided once for
        the cluster), and read the outages what the loaded slots missed may fall in."""
        node = self.node
        assert node.parts is not None
        store = node.parts.store
        cluster_mark = (await store.slot_marks()).cluster
        if self._cluster_progress_ms is not None:  # nodes kept firing while PostgreSQL was away
            cluster_mark = max(cluster_mark or 0, self._cluster_progress_ms)
        since = node.loading.pending_since(now)
        # decided once for the cluster: nodes back at the same time, each by its own clock, could
        # each judge the gap differently, and one fire late what another skips (seed 82247)
        outage = await store.back(cluster_mark, now, int(node.s.outage_after_seconds * 1000), node.node_id)
        self._outages = await store.outages(min(since, self.outages_from(now, now)))
        if outage is not None:
            log.warning(
                "no scheduler was running: occurrences due then get their misfire policy",
                extra={"since": iso(outage[0]), "until": iso(outage[1])},
            )

    def catch_up(self, job: OwnedJob, start: int, now: int, tally: Tally) -> None:
        """Install a job taken over from ``start``: occurrences since then are delivered late,
        except those due during an outage of the whole cluster, which get the misfire policy."""
        firer = self.node.firer
        assert firer is not None
        if job.paused:
            firer.install(job, now)
            return
        timing = job.timing  # (made once: a job of a long interval makes it when asked)
        first = next_of(job, start, timing)
        if first is None:
            firer.install(job, start, timing)
            return
        if tally.merged_of is not self._outages:  # merged once a load, not once a job (a new list when they change)
            tally.merged_of, tally.merged = self._outages, merged(self._outages)
            tally.until = max(now, tally.merged[-1][1]) if tally.merged else now  # (disjoint, in order)
        if first > tally.until:  # nothing came due since, nor in an outage: no outage matters (most jobs)
            firer.book.install_at(job, first, start, timing)
            return
        # An outage is the one the first node back recorded, whole, by its clock: one that ends
        # after this node's now (recorded by a node whose clock runs ahead) is not cut short here.
        # Cut at now, this node fired the latest occurrence before its now as the misfire, and
        # the rest of the outage from its timer, besides the recorder's latest (seed 923708, every
        # fault: a power cut, clocks 2.2 s apart, five occurrences of one fire_once outage).
        windows = [(max(a, start), b) for a, b in tally.merged if b > start and a < now]
        if not windows:
            firer.install(job, start, timing)
            return
        cursor = start
        for a, b in windows:
            # Due while a node of the cluster was alive, before this outage: delivered late, like
            # any occurrence a node takes over (only the outage itself gets the misfire policy).
            times = misfire.between(timing, cursor, a)
            if len(times) == misfire.MAX_COUNTED and times[-1] < a:
                tally.bound(job.id)
            late = [e for t in times for e in firer.book.occurrence(job, t)]
            if late:
                firer.enqueue(late, verify=True)  # the previous owner may have delivered them
            # with its calendars: an occurrence on an excluded day was never due, so never missed
            plan = misfire.plan(
                self.node.configuration.timing_of(job, timing), a, b, job.opts.misfire, job.opts.catchup_ms
            )
            if plan.last_missed is not None:
                executions = [Execution.of(job, t, i) for t in plan.fire for i in range(job.opts.events)] or [
                    Execution.of(job, plan.last_missed)
                ]
                executions[0].misfire = plan
                firer.enqueue(executions, verify=True)
                tally.misfire(job.id, (a, b))
            cursor = b
        firer.install(job, cursor, timing)

    def misfire_of(self, e: Execution) -> misfire.MisfirePlan | None:
        """The misfire plan of an outage, if ``e`` (taken over from another holder) is the
        execution a catch-up claimed to carry it (see catch_up): its holder may have died, or
        lost the claim's answer, before applying it; the taker applies it instead of delivering
        the occurrence late (seed 930278, every fault: a skip policy's occurrence was fired)."""
        d = e.d
        if d.trigger != Trigger.SCHEDULE or d.suffix or d.event_index:
            return None
        t = d.scheduled_ms
        for a, b in merged(self._outages):
            if a < t <= b:
                job = e.job
                plan = misfire.plan(self.node.configuration.timing_of(job), a, b, job.opts.misfire, job.opts.catchup_ms)
                return plan if t == (plan.fire[0] if plan.fire else plan.last_missed) else None
        return None

    # ------------------------------------------------------------------ Redis's epoch and its losses
    def heard(self, epoch: str, cluster_progress_ms: int | None) -> None:
        """A heartbeat's answer: the Redis data's epoch, and how far the cluster has fired."""
        node = self.node
        if self.epoch is not None and epoch != self.epoch:
            self._redis_lost(self.epoch, epoch, self._epoch_ok_ms)
        self.epoch = epoch
        firer = node.firer
        if firer is not None and firer.standby is not None:
            # after the loss's occurrences are queued: a standing of this epoch covers them
            firer.standby.epoch = epoch
        self._epoch_ok_ms = node.now_ms()
        if self._unnoticed is None:
            self._unnoticed = asyncio.create_task(self._find_unnoticed_losses(epoch))
        self._cluster_progress_ms = cluster_progress_ms

    def record_losses_soon(self) -> None:
        """Record the losses noticed, beside the heartbeats, not in their way: a PostgreSQL that
        hangs must not stop them."""
        if self._losses and (self._recording is None or self._recording.done()):
            self._recording = asyncio.create_task(self._record_losses())

    @property
    def unrecorded_loss_since(self) -> int | None:
        """From when a loss noticed and not on record yet claims again (it has not lowered the
        recorded marks yet)."""
        return min((loss.since for loss in self._losses), default=None)

    async def looked_for_unnoticed(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the look for losses nobody noticed: it may lower the marks."""
        if self._unnoticed is not None and not self._unnoticed.done():
            await asyncio.wait([self._unnoticed], timeout=timeout)

    def _redis_lost(self, lost: str, current: str, intact_ms: int) -> None:
        """Redis restarted empty (its epoch token changed): the claims it held are gone. What this
        node holds itself it claims again (renewals, parked retries); what nobody held in memory
        (claims of nodes that died or handed work over) is found again here: every occurrence of
        the owned jobs since shortly before Redis was last seen intact is claimed once more,
        checked against history first, so what was delivered is not delivered again.

        Progress recorded before the loss spoke for those claims: it is lowered to the same point
        (``NodeStore.lose_epoch``) before this node records progress again, so that a node dying
        before its claims are made again leaves its slots' next owner a mark it can resume from
        (seed 101319 with 50 ms passes). Recording it may reach further back (:meth:`_record_losses`)."""
        node = self.node
        s = node.s
        since = intact_ms - self.recent_past_ms
        reach = intact_ms - int(s.loss_lookback_seconds * 1000)
        # heartbeating when the loss was noticed: they claim again what they hold themselves
        recent = asyncio.get_running_loop().time() - 2 * s.heartbeat_interval_seconds - s.membership_poll_seconds
        live = frozenset([node.incarnation, *node.ownership.heard_since(recent)])
        self._losses.append(Loss(lost, current, since, min(reach, since), live))
        self._claim_again(since, node.now_ms())

    @property
    def recent_past_ms(self) -> int:
        """How far before Redis was last seen intact a loss of its data claims again: two leases,
        a heartbeat and 2 s (a claim older than that was taken over by a sweep)."""
        s = self.node.s
        return int((s.lease_seconds * 2 + s.heartbeat_interval_seconds + 2) * 1000)

    def _claim_again(self, since: int, until: int) -> None:
        """Claim once more, checked against history, every occurrence of the owned jobs from
        ``since`` through ``until`` (what a loss of Redis's data may have left unclaimed)."""
        node = self.node
        firer = node.firer
        if firer is None:
            return
        if not node.ready:  # what the loaded slots owe is caught up once ready: from no later than this
            if node.loading.lower_pending(since):
                for slot in node.owned:
                    firer.progress.verify_through_at_least(slot, until)
            return
        firer.progress.lower(since)  # until the next pass says how far the claims got again
        # Occurrences due while the whole cluster was down got their misfire policy, which is
        # not to be undone here (seed 65289: Redis lost its data seconds after an outage ended,
        # and a skip policy's occurrence was claimed again and fired).
        outages = [(a, b) for a, b in merged(self._outages) if b > since]
        again: list[Execution] = []
        for job in list(firer.jobs.values()):
            if job.paused:
                continue
            t = next_of(job, max(since, 0))
            while t is not None and t <= until and len(again) < 100_000:
                if not any(a < t <= b for a, b in outages):
                    again.extend(firer.book.occurrence(job, t))
                t = next_of(job, t)
        log.warning(
            "Redis lost its data: claiming recent occurrences again, checked against history",
            extra={"since": iso(since), "until": iso(until), "executions": len(again)},
        )
        firer.repark_all()
        firer.enqueue(again, verify=True)
        self._triggers_since = since if self._triggers_since is None else min(self._triggers_since, since)
        if self._triggering is None or self._triggering.done():
            self._triggering = asyncio.create_task(self._triggers_again())

    async def _triggers_again(self) -> None:
        """Claim again, checked against history, the manual triggers and redeliveries of the owned
        slots asked for since shortly before Redis lost its data and already read from the change
        feed: a claim of one may have gone with it, held by no node that knows (seed 918049: a
        take whose answer was lost, then the loss). Scheduled occurrences are claimed again by
        _claim_again."""
        node = self.node
        for _ in range(_TRIGGERS_AGAIN_TRIES):
            since = self._triggers_since
            if since is None or node.stopping or node.parts is None:
                return
            try:
                triggers = await node.parts.store.recent_triggers(sorted(node.owned), since)
            except TransientError as exc:
                log.warning("could not read recent triggers to claim them again: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if self._triggers_since == since:
                self._triggers_since = None
            node.feed.apply_triggers(triggers, verify=True, again=True)
        log.error("recent triggers were not claimed again after a loss of Redis's data: PostgreSQL was away")

    async def _find_unnoticed_losses(self, current: str) -> None:
        """Once, when this process first reaches Redis: progress recorded in data Redis no longer
        has, whose loss nobody recorded (every node that saw it died first: a power cut of Redis
        and the nodes). Recorded here, and the recent past of that data is claimed again, checked
        against history: the deliveries whose history rows died with the nodes and Redis's copy
        of them are delivered again and recorded (tests/cluster/test_power_cut.py). The same for
        such a loss another node recorded lately: nodes back from a power cut together each claim
        it again for the slots they own, whoever recorded it (seed 951099: the node that recorded
        it handed the slot of an occurrence on before claiming it, and the slot's owners, whose
        catch-up began before the loss lowered its mark, did not claim it again)."""
        node = self.node
        assert node.parts is not None
        found: list[tuple[str, int]] | None = None  # (once recorded, they are no longer unnoticed)
        for _ in range(600):  # PostgreSQL may be away for a while; a node that has waited that long gives up
            if node.stopping:
                return
            reach = node.now_ms() - int(node.s.loss_lookback_seconds * 1000)
            try:
                if found is None:
                    found = await node.parts.store.unnoticed_losses(current, reach, self.recent_past_ms, node.node_id)
                if found:
                    await self.learn_outages(min(t for _, t in found))
                break
            except TransientError as exc:
                log.warning("could not look for losses of Redis's data: %s", exc)
                await asyncio.sleep(1.0)
        else:
            return
        for epoch, since in found:
            log.warning(
                "Redis lost data no node noticed: claiming its recent past again, checked against history",
                extra={"epoch": epoch, "since": iso(since)},
            )
            self._claim_again(since, node.now_ms())

    async def _record_losses(self) -> bool:
        """Record the losses of Redis data this node noticed (oldest first); False while some are
        not recorded yet."""
        node = self.node
        assert node.parts is not None
        while self._losses:
            loss = self._losses[0]
            try:
                since = await node.parts.store.lose_epoch(
                    loss.lost, loss.current, loss.since, node.node_id, loss.reach, loss.live
                )
                if since < loss.since:  # what is claimed again from there must not undo a misfire
                    await self.learn_outages(since)  # policy: outages this node may not have read
            except TransientError as exc:
                log.warning("could not record that Redis lost its data: %s", exc)
                return False
            if loss in self._losses:  # (the heartbeat and a progress save may both record it)
                self._losses.remove(loss)
                if since < loss.since:
                    # a node gone before the loss had last recorded progress from further back: its
                    # claims made late, and lost before a sweep took them over, are older than the
                    # recent past (seed 820315: claimed 3 s late, holder killed, Redis lost 5 s later)
                    self._claim_again(since, loss.since - 1)
        return True

    # ------------------------------------------------------------------ how far this node fired
    def slots_loaded(self, slots: list[int] | frozenset[int], at_ms: int) -> None:
        """Slots loaded at ``at_ms``: this node's progress speaks for them once the firer has
        claimed through then."""
        self._unsettled.update(dict.fromkeys(slots, at_ms))

    def slots_dropped(self, slots: frozenset[int]) -> None:
        for slot in slots:
            self._unsettled.pop(slot, None)

    def all_settled(self) -> None:
        """The catch-up of every slot loaded is queued: the progress worked out after it speaks for
        them all at once. (Left out until the catch-up was claimed, the first owners of a slot at a
        cold start recorded no mark for it if they died before their next save, PostgreSQL away:
        its next owner caught up from a lease ago, not from their start, seed 7500088.)"""
        self._unsettled.clear()

    async def progress_loop(self) -> None:
        node = self.node
        while not node.stopping:
            await asyncio.sleep(node.s.progress_seconds)
            if node.ready:
                await self.save_progress()

    async def save_progress(self) -> None:
        """Record how far this node has claimed what it owes (``node_progress``), once the losses
        of Redis's data it noticed and the history rows it holds are written."""
        node = self.node
        assert node.parts is not None
        firer = node.firer
        if firer is None or firer.progress.claimed_ms is None or not node.ready:
            return
        if self._losses and not await self._record_losses():
            return  # progress of the new data is saved once the old data's loss is on record
        history = node.history
        if history is not None and history.last_error is not None and not await history.flush():
            # Rows held since PostgreSQL was away are in this node's buffer and Redis's copy only,
            # and a skip's row is all there is of its occurrence: progress saved past them would
            # let a loss of both that nobody notices (a power cut) claim again too short a past
            # (seed 927326, every fault: two overlap skips' rows held 12 s, PostgreSQL back 1.9 s
            # before the cut, the writer waiting out its 5 s backoff while progress was saved).
            # They are written first; until they are, progress stays where it was.
            return
        # A slot counts once the firer has claimed through the time it was loaded: before that, its
        # mark stays what its previous owners recorded, and whoever takes it next catches up from
        # there. (This node's progress predates the slot's catch-up; saved for the slot while the
        # claim store was away, it lost the catch-up of a node killed meanwhile: seed 100656.)
        unsettled = self._unsettled
        if unsettled:
            for slot in [s for s, at in unsettled.items() if firer.progress.claimed_ms >= at]:
                del unsettled[slot]
        firer.progress.forget_verified()
        owned = node.owned.difference(unsettled) if unsettled else node.owned
        open_ms = open_from(firer.held.values(), firer.parked.values())
        if node.stopping and self._open_saved is not None:  # (what it held is handed over now)
            open_ms = self._open_saved if open_ms is None else min(open_ms, self._open_saved)
        try:
            await node.parts.store.save_progress(
                node.node_id,
                node.incarnation,
                firer.progress.claimed_ms,
                bitmap(owned, node.slot_count),
                self.epoch,
                firer.progress.firing_ms,
                open_ms,
            )
            self._open_saved = open_ms
        except TransientError as exc:
            log.warning("could not record how far this node fired: %s", exc)


def open_from(*groups: Iterable[Execution]) -> int | None:
    """The earliest scheduled time of the occurrences among ``groups`` (what a node holds, what it
    has parked: claimed, not ended), or None. Their claims are in Redis only; a loss of its data
    after this node is gone loses them, and the nodes claim again from no later than this
    (NodeStore.lose_epoch; sim seed 9712454: an occurrence waiting on PostgreSQL for what its job
    requires, parked by a node that left while PostgreSQL was away, so that the slot's next owners
    could not load it, was lost with Redis's data 5 s later and never delivered). Occurrences only:
    a manual trigger or a redelivery is not claimed again by a loss."""
    least: int | None = None
    for group in groups:
        for e in group:
            if e.d.trigger == Trigger.SCHEDULE and (least is None or e.d.scheduled_ms < least):
                least = e.d.scheduled_ms
    return least


def next_of(job: OwnedJob, after_ms: int, timing: Timing | None = None) -> int | None:
    """The job's next occurrence after ``after_ms``; None also for a schedule that cannot say."""
    try:
        return (job.timing if timing is None else timing).next_after(after_ms)
    except Exception:  # noqa: BLE001 - one job's schedule never stops the others
        return None


def merged(outages: list[Outage]) -> list[Outage]:
    """Outages recorded by several nodes coming back at once, merged: an outage ended when the
    first of them was back (the earliest end among those that overlap). Two outages that only
    touch are two: the cluster came back and stopped again before a node marked any progress, so
    the second starts where the first ended (``decide_outage``); merged, the second was lost, and
    its occurrences were delivered late instead of getting their misfire policy (seeds 401891 and
    402048, every fault)."""
    out: list[Outage] = []
    for a, b in sorted(outages):
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], min(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class Tally:
    """What one load's catch-up did, logged once (one line per job floods the log at scale): how
    many jobs, and the first few of them (not every id: a load can hold millions)."""

    SAMPLE = 10

    def __init__(self) -> None:
        self.misfired = 0
        self.misfired_ids: list[str] = []
        self.outages: set[Outage] = set()
        self.bounded = 0
        self.bounded_ids: list[str] = []
        self.merged_of: list[Outage] | None = None  # the node's outages, and them merged
        self.merged: list[Outage] = []
        self.until = 0  # the later of the load's now and the end of the last of them

    def misfire(self, job_id: str, outage: Outage) -> None:
        self.misfired += 1
        if len(self.misfired_ids) < self.SAMPLE:
            self.misfired_ids.append(job_id)
        self.outages.add(outage)

    def bound(self, job_id: str) -> None:
        self.bounded += 1
        if len(self.bounded_ids) < self.SAMPLE:
            self.bounded_ids.append(job_id)

    def log(self) -> None:
        if self.misfired:
            log.info(
                "applying the misfire policy",
                extra={
                    "jobs": self.misfired,
                    "job_ids": self.misfired_ids,
                    "outages": [f"{iso(a)}/{iso(b)}" for a, b in sorted(self.outages)[: self.SAMPLE]],
                },
            )
        if self.bounded:
            log.warning(
                "catch-up bounded: occurrences due before an outage after the first %d are not delivered",
                misfire.MAX_COUNTED,
                extra={"jobs": self.bounded, "job_ids": self.bounded_ids},
            )
