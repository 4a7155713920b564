"""Acquiring claims: a timer pass's due executions claimed in one call, and claims taken back from
the claim store (this node's parked retries when they are due, open claims of its slots whose
holder is gone, found by the sweep) in one call. A call whose answer was lost may have been
applied: what it asked for is named in the next call, which gives back what is this node's. A claim
this node finished by another path while a call for it was out starts nothing when the answer
comes. It owns those memories; what it wins it holds through the leases and hands to the firer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from cronman.model.execution import Status, Trigger
from scheduler_node.aio import Trace
from scheduler_node.execution import Execution, Stage
from scheduler_node.leases import Leases
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import ClaimResult, Claims, Hold, RenewResult, TakeState, Took

log = logging.getLogger("cronman.node")

OVERLAP = "overlap: the previous execution of this job was still in flight"
UNANSWERED_MAX = 1_000_000  # names of claims asked for without an answer, kept to ask again
RETAKE_MS = 250  # a parked retry whose take found a live lease is taken again at least this much later


class AcquireHost(Protocol):
    """What acquiring asks of the firer it claims for."""

    @property
    def trace(self) -> Trace | None: ...
    @property
    def slots(self) -> frozenset[int]: ...

    def won(self, e: Execution) -> None:
        """``e``'s claim is this node's (held): what comes next."""

    def finish_with(self, e: Execution, status: Status, reason: str) -> None:
        """End ``e`` without an attempt (an overlap's skip)."""

    def later(self, when: int, e: Execution) -> None:
        """The timer takes ``e`` (parked here) back at ``when``."""


class Acquirer:
    def __init__(
        self,
        host: AcquireHost,
        *,
        claims: Claims,
        leases: Leases,
        clock: Callable[[], int],
        metrics: NodeMetrics,
        lease_ms: int,
        done_ttl_ms: int,
    ) -> None:
        self.host = host
        self.claims = claims
        self.leases = leases
        self.clock = clock
        self.metrics = metrics
        self.lease_ms = lease_ms
        self.done_ttl_ms = done_ttl_ms  # how long a finished claim stays in the claim store
        # Claims asked for by a call whose answer never came (it may have been applied): asked for
        # again, a claim of ours found there is ours (the claim script reads it only for these).
        self._unanswered: set[str] = set()
        # The same for takes of other holders' claims (the sweep's takeovers), by claim name: the
        # take holds the claim a lease in this node's name, where no sweep takes it, this node's
        # included. Taken again at the next sweep, a claim of ours found there is ours, so a takeover
        # whose answer was lost is sent within a sweep, not left for leases (seed 924420).
        self._untaken: dict[str, Execution] = {}
        self.taking: set[str] = set()  # index members whose take is out
        # Claim and take calls out, by claim name, and the names among them this node finished
        # meanwhile by another path: an answer applied before the done mark and arriving after it
        # (a claim asked again after its answer was lost, while the sweep took the same claim
        # over) starts nothing (seed 917685).
        self._acquiring: dict[str, int] = {}
        self._finished_meanwhile: set[str] = set()

    async def claim(self, due: list[Execution]) -> None:
        # One claim per execution, however many times it was asked for; none for one this node
        # already works on (a catch-up of an occurrence it took over, say).
        leases = self.leases
        held, parked, closing = leases.held, leases.parked, leases.closing
        unique: dict[str, Execution] = {}
        for e in due:
            if e.ticket.name not in held and e.ticket.member not in parked and e.ticket.name not in closing:
                unique.setdefault(e.ticket.name, e)
        if len(unique) < len(due):
            for e in due:
                if unique.get(e.ticket.name) is not e:
                    e.stage = Stage.OVER
            due[:] = unique.values()
        if not due:
            return
        loop = asyncio.get_running_loop()
        asked = loop.time()
        unanswered = self._unanswered
        names = [e.ticket.name for e in due]
        self._acquire(names)
        try:
            results = await self.claims.claim([e.ticket for e in due], self.lease_ms, unanswered)
        except BaseException:
            self._acquired(names)
            if len(unanswered) > UNANSWERED_MAX:  # (an outage's backlog: any left are taken over late)
                unanswered.clear()
            unanswered.update(names)
            raise
        if unanswered:
            unanswered.difference_update(names)
        stale = self.clock() - self.done_ttl_ms // 2
        m = self.metrics
        won = lost = 0  # counted here, added to the metrics once (each inc takes a lock)
        try:
            meanwhile, trace = self._finished_meanwhile, self.host.trace
            for e, r in zip(due, results, strict=True):
                if trace:
                    trace("claim", e, r.name)
                if (
                    e.ticket.name in held
                    or e.ticket.member in parked
                    or e.ticket.name in closing
                    or (meanwhile and e.ticket.name in meanwhile)
                ):  # taken meanwhile, or taken and finished
                    e.stage = Stage.OVER
                    continue
                if r is ClaimResult.WON:
                    won += 1
                    if e.scheduled_ms < stale and e.d.trigger == Trigger.SCHEDULE and not e.d.suffix:
                        # Claimed so late that a finished claim of it may have expired (a catch-up
                        # queued in the backlog for minutes): the claim proves nothing, history does,
                        # so an occurrence delivered before is not delivered again (seed 7601620).
                        e.verify = True
                    leases.hold(e, asked)
                    self.host.won(e)
                elif r is ClaimResult.SKIPPED:
                    won += 1
                    self.host.finish_with(e, Status.SKIPPED, OVERLAP)  # its row kept in Redis until written
                else:
                    lost += 1
                    e.stage = Stage.OVER
        finally:
            self._acquired(names)
        if won:
            m.claim["won"].inc(won)
        if lost:
            m.claim["lost"].inc(lost)
        m.in_flight.set(len(held))

    def _acquire(self, names: list[str]) -> None:
        acquiring = self._acquiring
        for n in names:
            acquiring[n] = acquiring.get(n, 0) + 1

    def _acquired(self, names: list[str]) -> None:
        """The answers of a claim or take call for ``names`` are dealt with (see _acquiring)."""
        acquiring, meanwhile = self._acquiring, self._finished_meanwhile
        for n in names:
            left = acquiring.pop(n, 1) - 1
            if left > 0:
                acquiring[n] = left
            elif meanwhile:
                meanwhile.discard(n)

    async def take(self, items: list[Execution]) -> None:
        """Take executions whose time came back from the claim store: our own parked retries,
        and open claims of our slots whose holder is gone (found by the sweep)."""
        # One take of an execution at a time: the timer and the sweep both come to a parked retry
        # when it is due, and a second answer (HELD: the first take's own lease) must not end
        # what the first one started and leave its lease unrenewed (seed 100199).
        taking, leases = self.taking, self.leases
        unique = {e.ticket.member: e for e in items if e.ticket.member not in taking}
        if not unique:
            return
        items = list(unique.values())
        parked = {e.ticket.member for e in items if leases.parked.get(e.ticket.member) is e}
        taking.update(unique)
        loop = asyncio.get_running_loop()
        asked = loop.time()
        names = [e.ticket.name for e in items]
        self._acquire(names)
        untaken = self._untaken
        try:
            results = await self.claims.take([e.ticket for e in items], self.lease_ms, frozenset(untaken))
        except BaseException:
            self._acquired(names)
            if len(untaken) > UNANSWERED_MAX:  # (any left are taken over once their lease ran out)
                untaken.clear()
            untaken.update((e.ticket.name, e) for e in items if e.ticket.member not in parked)
            raise
        finally:
            taking.difference_update(unique)
        for n in names:
            untaken.pop(n, None)
        try:
            lost, taken_over = self._taken(items, results, parked, asked)
        finally:
            self._acquired(names)
        if taken_over:  # one line per batch (a dead node's slots can hold thousands)
            log.info(
                "took over executions",
                extra={
                    "executions": len(taken_over),
                    "job_ids": [e.d.job_id for e in taken_over[:10]],
                    "execution_ids": [e.id for e in taken_over[:10]],
                },
            )
        if lost:
            leases.repark_all()  # Redis lost keys: it lost the other parked retries too
            results2 = await self.claims.renew([Hold(e.ticket, e.attempt, self.lease_ms) for e in lost])
            for e, r in zip(lost, results2, strict=True):
                # (claimed again meanwhile by this node, a loss's catch-up say: that one goes on)
                if r is RenewResult.LOST or e.ticket.name in leases.held or e.ticket.name in leases.closing:
                    e.stage = Stage.OVER
                    continue
                e.verify = True
                leases.hold(e, asked)
                self.host.won(e)

    def _taken(
        self, items: list[Execution], results: list[Took], parked: set[str], asked: float
    ) -> tuple[list[Execution], list[Execution]]:
        """Deal with a take's answers: (lost, taken over)."""
        lost: list[Execution] = []
        taken_over: list[Execution] = []
        meanwhile, leases, trace = self._finished_meanwhile, self.leases, self.host.trace
        for e, took in zip(items, results, strict=True):
            ours = leases.parked.get(e.ticket.member) is e
            if trace:
                trace("take", e, f"{took.state.name} attempt {took.attempt} ours={ours}")
            if meanwhile and not ours and e.ticket.name in meanwhile:
                e.stage = Stage.OVER  # finished here by another path while the take was out
                continue
            if ours:
                leases.unpark(e)
            elif e.ticket.member in parked or e.ticket.name in leases.held or e.ticket.name in leases.closing:
                # It left this node's hands while the take was out: closed (a pause or a delete
                # cancelled it; its done mark lands on the claim just taken), handed over (its
                # slot moved: parked again for the slot's owners), or held by another path.
                if (
                    e.ticket.member in parked
                    and e.stage is Stage.OVER
                    and took.state in (TakeState.TAKEN, TakeState.TAKEN_UNKNOWN)
                ):
                    e.attempt = max(e.attempt, took.attempt)
                    leases.park(e, self.clock(), here=False)
                continue
            if took.state in (TakeState.TAKEN, TakeState.TAKEN_UNKNOWN):
                if not ours:
                    self.metrics.claim["taken_over"].inc()
                    taken_over.append(e)
                e.attempt = max(e.attempt, took.attempt)
                # A claim taken from another holder may be behind what it did (it died before
                # parking its next attempt): history says which attempt comes next, or that it ended.
                e.verify = took.state is TakeState.TAKEN_UNKNOWN or not ours
                e.taken = not ours
                # The claim is this node's again: a loss of it learned while this take was out (a
                # park answered LOST) is past. Left set, delivery would refuse it forever, and the
                # renewer would keep its lease, so no other node could take it either (seed 83247).
                e.superseded = False
                leases.hold(e, asked)
                self.host.won(e)
            elif took.state is TakeState.UNKNOWN:
                # Redis lost the claim and its index entry since they were found: our parked retry,
                # still ours to make; or an open claim the sweep found (its holder gone, or work
                # handed over), which no node holds now and which may be older than what the loss
                # claims again: made again here like a takeover, checked against history, never
                # dropped (seed 933504).
                e.taken = e.taken or not ours
                lost.append(e)
            elif took.state is TakeState.HELD and ours:
                # Our retry, and the claim store shows a live lease: our clock is ahead of Redis's,
                # or the park of this attempt did not land (Redis was away) and the lease is the
                # attempt before's. Still parked here, taken again when that lease ends (the answer
                # says when, by Redis's clock), and not sooner than shortly: a lease another node
                # holds for a long backoff is not asked after all that time. The sweep, which goes by
                # Redis's clock, finds this same execution. Never dropped: a sweep would take it back
                # at the attempt before and send that again (seed 463).
                leases.keep_parked(e)
                self.host.later(max(self.clock() + RETAKE_MS, took.attempt), e)
            else:
                e.stage = Stage.OVER
        return lost, taken_over

    def retake(self, found: list[Execution]) -> None:
        """Add to ``found`` what was taken by a call whose answer was lost: taken again (not due:
        its lease is ours)."""
        if self._untaken:
            listed, slots, leases = {e.ticket.member for e in found}, self.host.slots, self.leases
            for name, e in list(self._untaken.items()):
                if e.job.slot not in slots or name in leases.held or name in leases.closing:
                    del self._untaken[name]
                elif e.ticket.member not in listed:
                    found.append(e)

    def landed(self, name: str) -> None:
        """The done mark of claim ``name`` landed: a claim or take of it still out starts nothing."""
        if self._acquiring and name in self._acquiring:  # (see _acquiring)
            self._finished_meanwhile.add(name)
