"""Delivery: a won execution waits for its job's payload if the node had let it go (see
scheduler_node.payloads), a throttle permit, a place at its receiver (its host's connections, see
gates.PerHost) and a delivery slot (the node's and its namespace's, see gates.InFlight), then is
sent; its outcome goes back to the firer. It owns the gates, the attempts in flight, the
executions waiting for a payload and those whose lease must be confirmed before they are sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from cronman.errors import TransientError
from cronman.model import signing
from cronman.model.execution import backfill_of
from cronman.model.timeutil import iso
from scheduler_node.aio import Trace
from scheduler_node.execution import Execution, Stage
from scheduler_node.gates import InFlight, PerHost
from scheduler_node.parts import Delivery, Outcome
from scheduler_node.payloads import READ_BATCH, PayloadReader
from scheduler_node.senders import Senders
from scheduler_node.store.port import PayloadRow
from scheduler_node.throttle import ThrottleGate
from scheduler_node.tracing import Tracing


class DeliveryHost(Protocol):
    """What delivery asks of the firer it delivers for."""

    @property
    def stopping(self) -> bool: ...
    @property
    def trace(self) -> Trace | None: ...

    def wake(self) -> None:
        """Run a timer pass soon (a throttle's permits to hand out, leases to confirm)."""

    def outcome(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        """``e``'s attempt ended (sent at ``fired``, answered at ``finished``)."""

    def cancel(self, e: Execution, reason: str) -> None:
        """End ``e`` without an attempt (its job is gone)."""


# An execution whose job's payload is not found (the job deleted, or created again, and the change
# feed has not said so yet) is read again this often, and cancelled after this many reads: the
# feed's change ends it before then (see Lifecycle.cancel_job, Lifecycle.adopt).
MISSING_RETRY_S = 1.0
MISSING_READS = 10


class Deliveries:
    def __init__(
        self,
        host: DeliveryHost,
        *,
        senders: Senders,
        throttle: ThrottleGate | None,
        clock: Callable[[], int],
        renew: Callable[[list[Execution]], Awaitable[None]],
        secrets: Callable[[str], tuple[str, ...] | None],
        tracing: Tracing,
        lease_ms: int,
        max_in_flight: int,
        namespace_share: float,
        payloads: PayloadReader | None = None,
        spawn: Callable[[Awaitable[None]], None] | None = None,
    ) -> None:
        self.host = host
        self.senders = senders
        self.throttle = throttle
        self.clock = clock
        self.renew = renew  # renews claims in one round trip (see Leases.renew)
        self.secrets = secrets
        self.tracing = tracing
        self.lease_s = lease_ms / 1000
        self.gate: InFlight[Execution] = InFlight(max_in_flight, namespace_share)
        self.hosts: PerHost[Execution] = PerHost(senders.places)
        self.sending: dict[asyncio.Future[Outcome], tuple[Execution, int]] = {}
        self.to_confirm: list[Execution] = []  # whose lease may have run out before they were sent
        # Executions waiting for their job's payload (see scheduler_node.payloads), read in batches
        # by one task at a time; how often each was read and not found.
        self.payloads = payloads
        self.spawn = spawn
        self.needing: list[Execution] = []
        self._reading = False
        self._missing: dict[Execution, int] = {}

    def forget(self, which: Callable[[Execution], bool]) -> list[Execution]:
        """Executions ``which`` names are handed over: they no longer wait for a slot, a permit or
        a confirmation. What that lets have its host's place is returned, for :meth:`flow`."""
        moved: list[Execution] = []
        for e in self.gate.remove_waiting(lambda e: not which(e)):
            self._next_at(e, moved)
        if self.throttle is not None:
            self.throttle.forget(lambda e: not which(e))
        self.to_confirm = [e for e in self.to_confirm if not which(e)]
        self.needing = [e for e in self.needing if not which(e)]
        return moved

    async def confirm(self) -> None:
        """Renew, in one round trip, the claims of executions whose lease ran out before they
        were sent; send those still held, drop those another node took over."""
        items, self.to_confirm = self.to_confirm, []
        try:
            await self.renew(items)
        except TransientError:
            self.to_confirm[:0] = items
            raise
        for e in items:
            if e.stage is Stage.WAITING and not e.superseded:
                self._start(e)
            elif e.stage is Stage.WAITING:
                self.unwait(e)

    def dispatch(self, e: Execution) -> None:
        """Deliver now, or wait for its job's payload, a throttle permit, or delivery capacity."""
        e.stage = Stage.WAITING
        if e.payload is None:
            e.payload = e.job.payload
            if e.payload is None and self.payloads is not None and self.spawn is not None:
                self.needing.append(e)
                if not self._reading:
                    self._reading = True
                    self.spawn(self._read_payloads())
                return
        self._admit(e)

    def _admit(self, e: Execution) -> None:
        policy = self.throttle.policy_of(e) if self.throttle is not None else None
        if policy is None:
            self._start(e)
        else:
            assert self.throttle is not None
            self.throttle.wait(policy, e, self.clock())
            self.host.wake()

    async def _read_payloads(self) -> None:
        """Read the payloads executions wait for, a batch per statement, until none waits; a read
        that fails is tried again (backing off to 2 s) for as long as the node runs."""
        assert self.payloads is not None
        metrics = self.payloads.metrics
        delay = 0.05
        try:
            while self.needing and not self.host.stopping:
                metrics.waiting_for_payload.set(len(self.needing))
                batch, self.needing = self.needing[:READ_BATCH], self.needing[READ_BATCH:]
                live = [e for e in batch if e.stage is Stage.WAITING and not e.superseded]
                if len(live) < len(batch) and self._missing:
                    for e in batch:
                        if e.stage is not Stage.WAITING or e.superseded:
                            self._missing.pop(e, None)  # (left meanwhile: handed over, cancelled)
                if not live:
                    continue
                try:
                    rows = await self.payloads.read(sorted({e.job.id for e in live}))
                except TransientError:
                    self.needing[:0] = live
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)
                    continue
                delay = 0.05
                again = [e for e in live if not self._read_for(e, rows.get(e.job.id))]
                if again:
                    self._read_again_later(again)
        finally:
            self._reading = False
            metrics.waiting_for_payload.set(len(self.needing))

    def _read_for(self, e: Execution, row: PayloadRow | None) -> bool:
        """``e`` goes on with the payload read for it; False when it is to be read again."""
        if e.stage is not Stage.WAITING or e.superseded or e.payload is not None:
            self._missing.pop(e, None)
            if e.stage is Stage.WAITING and not e.superseded:
                self._admit(e)  # (its job was replaced meanwhile, with its payload)
            return True
        assert self.payloads is not None
        if row is None or row.incarnation != e.job.incarnation:
            misses = self._missing[e] = self._missing.get(e, 0) + 1
            if misses < MISSING_READS:
                return False
            del self._missing[e]
            self.host.cancel(e, "the job was deleted: its payload is gone")
            return True
        self._missing.pop(e, None)
        self.payloads.keep(e.job, row, needed=True)
        e.payload = row.payload
        self._admit(e)
        return True

    def _read_again_later(self, executions: list[Execution]) -> None:
        """Read these executions' payloads again in a while."""
        assert self.spawn is not None

        async def later() -> None:
            await asyncio.sleep(MISSING_RETRY_S)
            self.needing.extend(executions)
            if not self._reading and not self.host.stopping:
                self._reading = True
                await self._read_payloads()

        self.spawn(later())

    def granted(self, e: Execution) -> None:
        if e.waiting_since_ms is not None:
            e.throttle_wait_ms += self.clock() - e.waiting_since_ms
            e.waiting_since_ms = None
        if e.stage is not Stage.WAITING:
            if self.throttle is not None:
                self.throttle.release(e)
            return
        self._start(e)

    def _start(self, e: Execution) -> None:
        """Send when its host has a connection place free (and the node a delivery slot), or wait
        in its host's queue, in due order, holding nothing another host's deliveries need, for as
        long as the host answers the deliveries ahead of it (see _waited)."""
        host = e.host = self.senders.route(e.job.target)
        e.waited = 0.0
        if host is not None:
            place = self.hosts.admit(host, e.job.namespace, e.due_ms, e)
            if place is not None:
                e.place = place
                loop = asyncio.get_running_loop()
                place.since = loop.time()
                place.timer = loop.call_later(e.job.target.timeout, self._waited, e)
                return
        self.flow([e], [])

    def flow(self, asking: list[Execution], done: list[Execution]) -> None:
        """``asking``: executions that hold their host's place (or need none) and ask for a
        delivery slot; ``done``: executions giving back what they hold (their attempt is over, or
        it could not be sent). Whoever that lets go is sent; one that cannot be gives back in turn."""
        gate = self.gate
        while asking or done:
            if asking:
                e = asking.pop()
                if e.stage is not Stage.WAITING or e.superseded:  # left while it waited for its host
                    self._next_at(e, asking)
                elif gate.admit(e.job.namespace, e) and not self._send(e):
                    done.append(e)
                continue
            e = done.pop()
            for ready in gate.release(e.job.namespace):
                if not self._send(ready):
                    done.append(ready)
            self._next_at(e, asking)

    def _next_at(self, e: Execution, asking: list[Execution]) -> None:
        """``e`` gives its host's place back: the next waiting for that host take it."""
        host, e.host = e.host, None
        if host is None:
            return
        places = self.hosts.release(host)
        if places:
            now = asyncio.get_running_loop().time()
            for place in places:
                if place.timer is not None:
                    place.timer.cancel()
                nxt = place.item
                nxt.place = None
                nxt.waited = now - place.since
                asking.append(nxt)

    def _waited(self, e: Execution) -> None:
        """``e`` waited its target's timeout for a place at its host. While the host answers the
        deliveries ahead of it, it waits on: a burst queues, it does not time out. A host that
        answered nothing in that time (down, black-holed, hanging every request) fails it, unsent,
        like an attempt that timed out: it is retried like any."""
        place = e.place
        if place is None or not place.live:
            return
        timeout = e.job.target.timeout
        host = e.host
        if host is not None and self.senders.answering(host, timeout):
            place.timer = asyncio.get_running_loop().call_later(timeout, self._waited, e)
            return
        e.place, e.host = None, None
        self.hosts.withdraw(place)
        if e.stage is not Stage.WAITING or e.superseded:
            return
        error = f"timed out after {timeout:g}s waiting for a connection to {host}"
        now = self.clock()
        self.host.outcome(e, Outcome(False, None, error), now, now)

    def unwait(self, e: Execution) -> None:
        if self.throttle is not None:
            self.throttle.release(e)
        place, e.place = e.place, None
        if place is not None and self.hosts.withdraw(place):
            e.host = None
            if place.timer is not None:
                place.timer.cancel()

    def _send(self, e: Execution) -> bool:
        """Send an execution that holds a delivery slot; False when it was not sent (the caller
        gives the slot back)."""
        if e.stage is not Stage.WAITING or e.superseded:
            return False
        if self.host.stopping:  # nothing new goes out from a node that stops: it is handed over instead
            return False
        loop = asyncio.get_running_loop()
        if loop.time() > e.lease_until - self.lease_s / 5:
            # The lease may have run out (the process was paused or starved): the next timer
            # pass confirms it, for every such execution at once, before anything is sent.
            self.to_confirm.append(e)
            self.host.wake()
            return False
        now = self.clock()
        e.stage = Stage.SENDING
        trace = self.host.trace
        if trace:
            trace("send", e, f"attempt {e.attempt}")
        try:
            future = self.senders.submit(e.job.target, self._delivery(e, now))
        except Exception as exc:  # noqa: BLE001 - e.g. signing a payload; becomes this attempt's failure
            future = loop.create_future()
            future.set_result(Outcome(False, None, f"cannot send: {type(exc).__name__}: {exc}"))
        self.sending[future] = (e, now)
        future.add_done_callback(self._delivered)
        return True

    def _delivered(self, future: asyncio.Future[Outcome]) -> None:
        e, fired = self.sending.pop(future)
        finished = self.clock()
        try:
            outcome = future.result()
        except Exception as exc:  # noqa: BLE001 - a sender broke its contract: still this attempt's failure
            outcome = Outcome(False, None, f"{type(exc).__name__}: {exc}")
        self.host.outcome(e, outcome, fired, finished)
        self.flow([], [e])

    def _delivery(self, e: Execution, now_ms: int) -> Delivery:
        job = e.job
        payload = e.payload if e.payload is not None else job.payload
        if payload is None:  # (its job was replaced by one without, after the payload was read)
            raise TransientError("the job's payload was not read yet; the attempt is retried")
        secrets = self.secrets(job.namespace)
        signature = signing.sign(secrets, payload, now_ms // 1000) if secrets else None
        trace = self.tracing.begin(e.ticket.name, e.id, e.attempt, job.id, now_ms)
        backfill = backfill_of(e.trigger)
        return Delivery(
            job.id,
            e.id,
            iso(e.scheduled_ms),
            e.attempt,
            payload,
            e.event_index,
            signature,
            ((("Cronman-Backfill-Id", backfill),) if backfill else ()) + e.extra,
            job.namespace,
            trace,
            job.opts.capture,
            waited=e.waited,
        )
