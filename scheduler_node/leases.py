"""The claims a node holds, and what keeps them: an execution's lease, renewed while it waits or is
sent; a retry's claim parked in the claim store until its time (parked by a few batched calls at a
time); a final outcome's done mark (coalesced: whatever finished while one call was out goes in the
next); and a handover of claims not sent yet to whoever owns their slots. It owns the executions
held (claimed and not over, by claim name), parked (by index member) and closing (done mark on its
way, by claim name): the firer reads them, and changes them through its methods."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from cronman.errors import TransientError
from cronman.model.execution import Trigger
from cronman.redis.scripts import resume_cancellation
from scheduler_node.aio import Spawn, Trace, wait_event
from scheduler_node.execution import Execution, Stage
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import Claims, Finish, Hold, RenewResult
from scheduler_node.verify import Verifier

log = logging.getLogger("cronman.node")

PARK_BATCH = 1000  # executions parked per call
PARK_CALLS = 4  # park calls out at once, of those sent within a third of a lease (see Leases.park)
WAITING_LEASES = 3  # an execution waiting for a permit or a slot is leased this many leases at a time


class LeaseHost(Protocol):
    """What the leases ask of the firer they hold claims for."""

    @property
    def trace(self) -> Trace | None: ...

    def retry_at(self, when: int, e: Execution) -> None:
        """The timer takes ``e`` (parked here) back at ``when``."""

    def unwait(self, e: Execution) -> None:
        """``e`` no longer waits: it gives back its throttle permit and its host's place."""

    def landed(self, name: str) -> None:
        """The done mark of claim ``name`` landed."""

    async def beat(self) -> None:
        """Each round of renewals: what else is kept on that beat (throttle permits, connections)."""


def _queued(e: Execution) -> bool:
    """Whether ``e`` waits only for capacity here (a throttle's permit, a place at its host, a
    delivery slot): leased WAITING_LEASES at a time, so a deep queue costs Redis few renewals.
    One that waits on PostgreSQL (its job's payload, a check of history, what it requires or
    follows, its work's record) is leased as one in flight: if this node dies meanwhile, it is
    taken over a lease after its last renewal, not three (sim seeds 9712429 and 9712193: a node
    that died holding such executions while PostgreSQL was away held them 36 s and 78 s past the
    bound of a takeover)."""
    if e.stage is not Stage.WAITING or e.payload is None or e.verify:
        return False
    opts = e.job.opts
    return opts.completion is None and opts.require is None and e.trigger != Trigger.AFTER


class Leases:
    def __init__(
        self,
        host: LeaseHost,
        *,
        claims: Claims,
        clock: Callable[[], int],
        metrics: NodeMetrics,
        memory: Verifier,
        spawn: Spawn,
        lease_ms: int,
    ) -> None:
        self.host = host
        self.claims = claims
        self.clock = clock
        self.metrics = metrics
        self.memory = memory  # what this node did of executions another node took over
        self.spawn = spawn
        self.lease_ms = lease_ms
        self.lease_s = lease_ms / 1000
        # executions held: claimed and not over, by claim name
        self.held: dict[str, Execution] = {}
        self.parked: dict[str, Execution] = {}  # by index member
        # Finished here, their done marks on the way: until a mark lands the claim store still
        # shows the claim as this node's first attempt, which it would let this node win again.
        self.closing: dict[str, Execution] = {}
        self._renewing = 0  # renewal calls out (a handover waits for them: see release)
        self._renewed = asyncio.Event()
        # Executions waiting to retry whose claims are to be parked, with when they retry: parked by
        # a few calls at a time (PARK_CALLS, see park), as many as are waiting then each (a receiver
        # that times out a thousand requests at once makes a thousand of them in one pass, and a
        # call each ran the node's Redis connections out).
        self._to_park: list[tuple[Execution, int, bool]] = []  # (execution, due, advance: see Hold)
        # park calls out (loop time each was sent), at most PARK_CALLS sent within a third of a lease
        self._parking: dict[int, float] = {}
        self._park_calls = itertools.count()
        self._done_pending: list[tuple[Execution, str, str]] = []
        self._done_in_flight = 0  # done calls out (a stopping node waits for them: see land)
        self._done_wake = asyncio.Event()
        self._to_release: list[Execution] = []  # won for a slot that moved away meanwhile

    # -- what is held
    def hold(self, e: Execution, asked: float) -> None:
        """``e``'s claim (asked for at loop time ``asked``) is this node's: it waits to be sent."""
        e.lease_until = asked + self.lease_s
        e.stage = Stage.WAITING
        self.held[e.ticket.name] = e

    def let_go(self, e: Execution) -> None:
        """``e`` is no longer held here (over, parked, or handed over)."""
        self.held.pop(e.ticket.name, None)

    def keep_parked(self, e: Execution) -> None:
        """``e`` stays parked here (a take found its claim's lease live)."""
        self.parked[e.ticket.member] = e

    def unpark(self, e: Execution) -> None:
        """``e``, parked here, is taken back or cancelled."""
        del self.parked[e.ticket.member]

    def drop_parked(self, which: Callable[[Execution], bool]) -> None:
        """Forget the retries parked here that ``which`` names (their slots moved: they stay parked
        in the claim store for the slots' owners)."""
        for member in [m for m, e in self.parked.items() if which(e)]:
            self.parked.pop(member).stage = Stage.OVER

    # -- renewals
    async def run_renewer(self) -> None:
        """Keep the leases of what this node holds. An execution in flight is renewed every third
        of a lease; one waiting for a permit or a delivery slot gets leases of WAITING_LEASES
        leases, renewed when one lease is left, so a deep backlog costs Redis little. One finished
        whose done mark has not landed after a third of a lease (done marks go one round trip at
        a time, and a slow Redis queues them) is renewed too: its lease must not run out before
        the mark says it is over (seed 820443 with db_hang: a finished retry taken over and
        delivered again while its done mark waited behind a slow one)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                now = loop.time()
                soon, closed = now + self.lease_s * 1.5, now + self.lease_s * 2 / 3
                items = [
                    e
                    for e in self.held.values()
                    if e.stage is Stage.SENDING or (e.stage is Stage.WAITING and e.lease_until < soon)
                ]
                if self.closing:
                    items += [e for e in self.closing.values() if e.stage is Stage.FINISHING and e.lease_until < closed]
                await self.renew(items)
                await self.host.beat()
            except TransientError as exc:
                log.warning("lease renewal failed: %s", exc)

    async def renew(self, items: list[Execution]) -> None:
        if not items:
            return
        asked = asyncio.get_running_loop().time()
        lease = self.lease_ms
        durations = [lease * WAITING_LEASES if _queued(e) else lease for e in items]
        self._renewing += 1
        try:
            results = await self.claims.renew(
                [Hold(e.ticket, e.attempt, d) for e, d in zip(items, durations, strict=True)]
            )
        finally:
            self._renewing -= 1
            if not self._renewing:
                self._renewed.set()
        reclaimed = False
        for e, r, d in zip(items, results, durations, strict=True):
            if e.stage is Stage.FINISHING:  # the done mark's answer says whether it was still ours
                if r is not RenewResult.LOST:
                    e.lease_until = asked + d / 1000
            elif r is RenewResult.LOST:
                self._lose(e)
            elif e.stage in (Stage.WAITING, Stage.SENDING):
                e.lease_until = asked + d / 1000
            reclaimed = reclaimed or r is RenewResult.RECLAIMED
        if reclaimed:
            self.repark_all()  # Redis lost keys: put back the parked retries it lost too

    def _lose(self, e: Execution) -> None:
        """Another node took the execution over (our lease ran out: a pause, a stall)."""
        trace = self.host.trace
        if trace:
            trace("lost", e, e.stage.name)
        if e.stage is Stage.OVER:
            return
        self._superseded(e, "lost the claim on an execution")
        self.memory.remember_failed(e)
        if e.stage is Stage.WAITING:
            self.host.unwait(e)
        self.held.pop(e.ticket.name, None)
        if e.stage is not Stage.SENDING:
            e.stage = Stage.OVER
        else:
            e.superseded = True  # the attempt in flight finishes; nothing follows it here

    def _superseded(self, e: Execution, message: str) -> None:
        """Count an execution another node took over, once, however this node learned of it."""
        if not e.superseded:
            e.superseded = True
            self.metrics.claim["superseded"].inc()
            log.warning(message, extra={"job_id": e.d.job_id, "execution_id": e.id})

    # -- parking
    def park(self, e: Execution, due_ms: int, here: bool = True, advance: bool = False) -> None:
        """Wait to retry: the claim is parked in the claim store until then (so that whoever owns
        the slot may take it if this node is gone), and this node takes it back at that time
        (unless ``here`` is False: the slot is someone else's now). ``advance``: the park moves the
        claim on to the execution's next attempt, and is made once (see Hold)."""
        trace = self.host.trace
        if trace:
            trace("park", e, f"attempt {e.attempt} at {due_ms}" + ("" if here else " (for the slot's owners)"))
        self.held.pop(e.ticket.name, None)
        if here:
            e.stage = Stage.PARKED
            self.parked[e.ticket.member] = e
            self.host.retry_at(due_ms, e)
        else:
            e.stage = Stage.OVER
        self._to_park.append((e, due_ms, advance))
        # A park waits for a call of its own only behind calls Redis answers promptly: calls out
        # for a third of a lease (a slow Redis) hold no park back, which must land before its
        # attempt's lease runs out (seed 923251).
        now = asyncio.get_running_loop().time()
        if sum(1 for sent in self._parking.values() if sent > now - self.lease_s / 3) < PARK_CALLS:
            call = next(self._park_calls)
            self._parking[call] = now
            self.spawn(self._park_queued(call))

    async def bring_back(self, items: list[Execution]) -> None:
        """Executions parked here wanted back now (their work reported its end): each park moved to
        now, and only once that has landed does the timer take them back (a take before it lands
        finds the park's lease live, and waits for it to end: sim seed 9000011, a report taken up
        10 s late)."""
        items = [e for e in items if self._still_parked(e)]
        if not items:
            return
        results = await self.claims.renew([Hold(e.ticket, e.attempt, 0) for e in items])
        now = self.clock()
        for e, r in zip(items, results, strict=True):
            if r is RenewResult.LOST:
                if self.parked.get(e.ticket.member) is e:
                    self._superseded(e, "lost the claim on an execution whose work ran")
                    del self.parked[e.ticket.member]
                    e.stage = Stage.OVER
            elif self._still_parked(e):
                e.due_ms = now
                self.host.retry_at(now, e)

    def repark_all(self) -> None:
        """Park again every retry parked here (Redis lost its data: it lost them too)."""
        if self.parked:
            self.spawn(self.repark(list(self.parked.values())))

    async def repark(self, items: list[Execution], patience: float = 3.0) -> None:
        """Park again what waits to retry here (idempotent): after Redis lost keys, or before this
        node stops, so that whoever owns the slot finds it. Tried for ``patience`` seconds. Each is
        a park on to its attempt (``advance``): where the claim holds it already (the park made,
        or the retry taken back since, with a take still on its way) it changes nothing."""
        await self._keep_trying(
            lambda: self.claims.renew(
                [
                    Hold(e.ticket, e.attempt, max(0, e.due_ms - self.clock()), advance=True)
                    for e in items
                    if self._still_parked(e)
                ]
            ),
            patience,
            f"could not park {len(items)} executions waiting to retry",
        )

    def _still_parked(self, e: Execution) -> bool:
        """Parked here, not taken back meanwhile: a park tried again (its answer lost, maybe made)
        must not move the deadline of a claim this node has since taken back and is sending (seed
        300094: the other owner found it due and delivered the attempt again)."""
        return e.stage is Stage.PARKED and self.parked.get(e.ticket.member) is e

    async def _keep_trying(self, call: Callable[[], Awaitable[Any]], patience: float, what: str) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        pause = 0.2
        while True:
            try:
                await call()
                return True
            except TransientError as exc:
                if loop.time() + pause > deadline:
                    log.error("%s: %s", what, exc)
                    return False
                log.warning("%s, retrying: %s", what, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _park_queued(self, call: int) -> None:
        """Park what is queued, a batch a call, until nothing is (what comes meanwhile goes in the
        next call of one of the PARK_CALLS tasks that do this: a park never waits behind more
        than that many calls out, a slow one included, where one call at a time made a park wait
        until its lease had run out behind a slow spell of Redis, seed 100376; calls out longer than
        a third of a lease hold no park back, see park)."""
        try:
            for _ in range(1_000_000):  # bound: each round takes what is queued
                if not self._to_park:
                    return
                batch, self._to_park = self._to_park[:PARK_BATCH], self._to_park[PARK_BATCH:]
                self._parking[call] = asyncio.get_running_loop().time()
                await self._park_now(batch)
        finally:
            del self._parking[call]

    async def _park_now(self, items: list[tuple[Execution, int, bool]]) -> None:
        """Tried until it lands, for as long as the claims it moves can be held: a park that never
        lands leaves its claim held by this node, for up to WAITING_LEASES leases after a wait for
        a permit or a slot, and a node that gives its slot up meanwhile takes the retry along
        (seed 8102813: a node cut off from Redis 6 s parked retries that waited for a slot under a
        30 s lease; it gave up after 2 s, gave the slot up, and the retries waited 90 s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAITING_LEASES * self.lease_s
        for attempt in range(100_000):  # bound: the deadline ends it first
            if attempt:
                # What was taken back meanwhile is no longer to be parked (_still_parked); what was
                # queued meanwhile goes in this call, not after every try of this one (seed 300194).
                room = PARK_BATCH - len(items)
                if room > 0 and self._to_park:
                    items = items + self._to_park[:room]
                    self._to_park = self._to_park[room:]
                items = [item for item in items if item[0].stage is Stage.OVER or self._still_parked(item[0])]
                if not items:
                    return
            try:
                now = self.clock()
                results = await self.claims.renew(
                    [Hold(e.ticket, e.attempt, max(0, due - now), advance) for e, due, advance in items]
                )
                for (e, _, _), r in zip(items, results, strict=True):
                    if r is RenewResult.LOST:
                        self._superseded(e, "lost the claim on an execution waiting to retry")
                        self.memory.remember_failed(e)
                        self.parked.pop(e.ticket.member, None)
                        e.stage = Stage.OVER
                return
            except TransientError as exc:
                if loop.time() >= deadline:
                    break
                if attempt < 5:
                    log.warning("could not park %d executions waiting to retry: %s", len(items), exc)
                await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))
        # Left to the lease: the claim runs out while the execution waits here, and whoever owns the
        # slot then takes it; this node retries it at its time all the same (it is in ``parked``).
        log.error("gave up parking %d executions waiting to retry", len(items))

    # -- done marks
    def close(self, e: Execution, status: str, row: str) -> None:
        """A final outcome: the claim is marked done (with ``row``, kept in the claim store until
        written) by the next done call."""
        e.stage = Stage.FINISHING
        self.held.pop(e.ticket.name, None)
        self.parked.pop(e.ticket.member, None)
        self.closing[e.ticket.name] = e
        self._done_pending.append((e, status, row))
        self._done_wake.set()
        self.metrics.in_flight.set(len(self.held))

    async def run_done(self) -> None:
        while True:
            resume_cancellation()  # (a Redis call that swallowed it: see there)
            await self._done_wake.wait()
            # No waiting to gather more: between a delivery and its done mark, a node that dies
            # leaves the replica to deliver again, so that window stays one round trip.
            self._done_wake.clear()
            try:
                await self.flush_done()
            except TransientError as exc:
                log.warning("marking executions done failed, retrying: %s", exc)
                await asyncio.sleep(0.5)
                self._done_wake.set()

    async def flush_done(self) -> None:
        """Coalesced: whatever finished while the previous round trip was out goes in the next."""
        host = self.host
        while self._done_pending:
            batch, self._done_pending = self._done_pending, []
            self._done_in_flight += 1
            try:
                ok = await self.claims.done([Finish(e.ticket, st, e.attempt, row) for e, st, row in batch])
            except BaseException:
                self._done_pending[:0] = batch
                # The done loop tries them again, whoever's call this was (a stopping node's drain
                # that gives up leaves them to it: seed 7602992).
                self._done_wake.set()
                raise
            finally:
                self._done_in_flight -= 1
            for (e, _, row), marked in zip(batch, ok, strict=True):
                e.stage = Stage.OVER
                if self.closing.get(e.ticket.name) is e:
                    del self.closing[e.ticket.name]
                host.landed(e.ticket.name)
                if not marked:
                    self._superseded(e, "another node took over an execution this node delivered")
                    if row:
                        self.memory.remember_text(e, row)
            self.metrics.in_flight.set(len(self.held))

    async def land(self, handover_seconds: float) -> None:
        """A stopping node's done marks land (tried for ``handover_seconds``)."""
        # Done marks: what is pending, and what the done loop has out (a slow call of its own is
        # waited for, not cancelled with the loop: seed 300778).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + handover_seconds
        while (self._done_pending or self._done_in_flight) and loop.time() < deadline:
            if not self._done_pending:
                await asyncio.sleep(0.02)
                continue
            try:
                await asyncio.wait_for(self.flush_done(), max(0.01, deadline - loop.time()))
            except TimeoutError as exc:  # (left to the leases, as before)
                log.warning("could not mark executions done at shutdown: %s", exc)
                return
            except TransientError as exc:
                # Tried again while the handover time lasts: left to their leases, the executions
                # finished here would be taken over and delivered again (seed 7602992).
                log.warning("could not mark executions done at shutdown, retrying: %s", exc)
                await asyncio.sleep(0.2)
        if self._done_pending or self._done_in_flight:
            log.warning("could not mark executions done at shutdown", extra={"executions": len(self._done_pending)})

    # -- handing over
    def hand_back(self, e: Execution) -> None:
        """``e`` was won for a slot that moved away meanwhile: handed back (with the others so won)."""
        self.held.pop(e.ticket.name, None)
        e.stage = Stage.OVER
        self._to_release.append(e)
        if len(self._to_release) == 1:
            self.spawn(self._release_moved())

    async def _release_moved(self) -> None:
        """Hand back together what was won for slots that moved away meanwhile: after a large
        set of slots is dropped, the claims and checks in flight for them end by the thousand, and
        a call each was more concurrent calls than the connection pool holds (heartbeats, renewals
        and done marks failed with them, and leases ran out)."""
        await asyncio.sleep(0)
        items, self._to_release = self._to_release, []
        if items:
            await self.release(items)

    async def release(self, items: list[Execution], patience: float = 3.0) -> None:
        # After the renewals out: one sent before the handover and applied after it would hold
        # the claims for leases more, where nobody takes them (seed 920153).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.lease_s
        while self._renewing and loop.time() < deadline:
            self._renewed.clear()
            await wait_event(self._renewed, deadline - loop.time())
        await self._keep_trying(
            lambda: self.claims.renew([Hold(e.ticket, e.attempt, 0) for e in items]),
            patience,
            f"could not hand over {len(items)} executions",
        )
