"""Loading the jobs of the slots a node takes over, with what each slot still owes.

A slot taken over resumes from the furthest point any of its owners recorded (at most a day back),
with its triggers of the last hour, checked against history where a loss of Redis's data lowered
its mark. A node that is ready catches what it loads up at once (:meth:`Recovery.catch_up
<scheduler_node.recovery.Recovery.catch_up>`); one that is not yet keeps what each job owes until
it is (:meth:`Loading.catch_up_pending`), so that a cold start of the whole cluster classifies what
was missed once, after the outage is on record. How far a load has come (jobs read, then caught
up) is what the node's heartbeat says while it loads.
"""

from __future__ import annotations

import asyncio
import gc
from typing import TYPE_CHECKING

from scheduler_node.jobs import OwnedJob
from scheduler_node.recovery import Tally

if TYPE_CHECKING:
    from scheduler_node.node import Node

TRIGGER_LOOKBACK_MS = 3_600_000  # a slot taken over still fires triggers asked for this recently
MAX_CATCH_UP_MS = 86_400_000  # a slot taken over delivers at most this far back
YIELD_EVERY = 5000  # jobs installed between two turns of the event loop


class Loading:
    """The jobs loaded and not caught up yet (until the node is ready), and how far the load has
    come. It reads the node's settings, clock, parts and firer, and writes none of them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._pending: dict[str, int] = {}  # job id -> from when, until this node is ready
        self._caught_up = 0  # jobs this node's catch-up installed (its load's second half)

    def moved(self) -> int:
        """How far this node's load has come: jobs read, then jobs caught up. It grows while the
        load goes on, however long that takes (millions of jobs take minutes)."""
        parts = self.node.parts
        store = parts.store if parts is not None else None
        return (store.rows_loaded if store is not None else 0) + self._caught_up

    def stage(self, job: OwnedJob, since: int) -> None:
        """A job read before the node is ready: kept, to be caught up from ``since`` once it is
        (from the earliest such point, if it already waits)."""
        assert self.node.firer is not None
        self.node.firer.stage(job)
        self._pending.setdefault(job.id, since)

    def pending_since(self, now: int) -> int:
        """From when the jobs waiting to be caught up are (``now`` if none waits)."""
        return min(self._pending.values(), default=now)

    def lower_pending(self, since: int) -> bool:
        """What the waiting jobs owe is caught up from no later than ``since`` (a loss of Redis's
        data noticed before the node is ready); False if none waits."""
        if not self._pending:
            return False
        self._pending = {j: min(t, since) for j, t in self._pending.items()}
        return True

    async def load(self, added: list[int]) -> int:
        """Load the jobs of slots taken over, with what each slot still owes; the number loaded."""
        node = self.node
        firer, recovery = node.firer, node.recovery
        assert node.parts is not None and firer is not None
        store = node.parts.store
        # calendars decide what fires: know the current ones before firing what is loaded
        node.configuration.set(await store.cluster_config())
        cursor, loaded = await store.load_slots(added, node.decoder)
        await recovery.looked_for_unnoticed(10)  # it may lower the marks
        marks = await store.slot_marks()
        now = node.now_ms()
        floor = now - MAX_CATCH_UP_MS
        # Slots whose marks a loss of Redis's data lowered: what was fired after the lowered mark
        # may have been delivered before the loss, and is checked against history before sending.
        for slot in added:
            claimed, fired = marks.claimed.get(slot), marks.fired.get(slot)
            if claimed is not None and fired is not None and fired > claimed:
                firer.progress.verify_slot_through(slot, fired)
        # A loss noticed and not on record yet has not lowered the marks: from no later than it says.
        lost = recovery.unrecorded_loss_since
        if lost is not None:
            for slot in added:
                firer.progress.verify_through_at_least(slot, now)

        # (one int object for the many jobs that start at the same time, not one each: millions
        # of them, kept until the node is ready, leave their pages behind when they go)
        unmarked = now - node.lease_ms

        def start_of(job: OwnedJob, updated_ms: int) -> int:
            mark = marks.claimed.get(job.slot)
            start = unmarked if mark is None else mark
            if lost is not None:
                start = min(start, lost)
            return max(start, updated_ms - 1, floor)

        # (computed where used, not kept in a second list: millions of short-lived pairs made
        # after the jobs fragment the heap they leave behind)
        count = len(loaded)
        gc.freeze()  # the loaded jobs live long: keep them out of every future collection
        if node.ready:
            earliest = min((start_of(job, updated_ms) for job, updated_ms in loaded), default=now)
            await recovery.learn_outages(recovery.outages_from(earliest, now))
            tally = Tally()
            for i, (job, updated_ms) in enumerate(loaded):
                recovery.catch_up(job, start_of(job, updated_ms), now, tally)
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    await asyncio.sleep(0)  # millions of jobs: the timer, renewals and heartbeats go on
            tally.log()
        else:  # what was missed is classified once this node is ready (see catch_up_pending)
            # (without a turn of the loop: a loss of Redis's data noticed meanwhile lowers what is
            # pending, and must find all of it there)
            stage, pending = firer.stage, self._pending
            for job, updated_ms in loaded:
                stage(job)
                pending[job.id] = start_of(job, updated_ms)
            self._caught_up += count  # (the load moves: see moved)
        del loaded
        if firer.payloads is not None:
            firer.payloads.wake()  # the payloads of what is due soon, read ahead
        triggers = await store.recent_triggers(added, now - TRIGGER_LOOKBACK_MS)
        node.feed.apply_triggers(triggers, verify=True)
        node.feed.loaded(cursor)
        return count

    async def catch_up_pending(self, now: int) -> None:
        """The node becomes ready: catch up every job it loaded, from where each was owed (the
        outage already judged: see :meth:`Recovery.judge_outage
        <scheduler_node.recovery.Recovery.judge_outage>`)."""
        node = self.node
        firer = node.firer
        assert firer is not None
        tally = Tally()
        done = 0
        # Changes that arrive while this runs (it yields now and then) join the pending set, and
        # are caught up in the next round.
        for _ in range(1000):
            pending, self._pending = self._pending, {}
            if not pending:
                break
            for job_id, start in pending.items():
                # installed in its entry of the table: taking millions out and putting them back
                # grew the table to twice its size on the way (then copied at its size)
                job = firer.jobs.get(job_id)
                if job is not None:  # (not deleted meanwhile)
                    node.recovery.catch_up(job, start, now, tally)
                done += 1
                if done % YIELD_EVERY == 0:
                    self._caught_up += YIELD_EVERY
                    await asyncio.sleep(0)  # millions of jobs: heartbeats and renewals go on
        tally.log()
        if firer.payloads is not None:
            firer.payloads.wake()  # (the jobs have their timer entries now)
