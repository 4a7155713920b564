"""Delivery: a won execution waits for a throttle permit, a place at its receiver (its host's
connections, see gates.PerHost) and a delivery slot (the node's and its namespace's, see
gates.InFlight), then is sent; its outcome goes back to the firer. It owns the gates, the
attempts in flight and the executions whose lease must be confirmed before they are sent."""

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
from scheduler_node.senders import Senders
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

    def forget(self, which: Callable[[Execution], bool]) -> list[Execution]:
        """Executions ``which`` names are handed over: they no longer wait for a slot, a permit or
        a confirmation. What that lets have its host's place is returned, for :meth:`flow`."""
        moved: list[Execution] = []
        for e in self.gate.remove_waiting(lambda e: not which(e)):
            self._next_at(e, moved)
        if self.throttle is not None:
            self.throttle.forget(lambda e: not which(e))
        self.to_confirm = [e for e in self.to_confirm if not which(e)]
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
        """Deliver now, or wait for a throttle permit, or for delivery capacity."""
        e.stage = Stage.WAITING
        policy = self.throttle.policy_of(e) if self.throttle is not None else None
        if policy is None:
            self._start(e)
        else:
            assert self.throttle is not None
            self.throttle.wait(policy, e, self.clock())
            self.host.wake()

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
        secrets = self.secrets(job.namespace)
        signature = signing.sign(secrets, job.payload, now_ms // 1000) if secrets else None
        trace = self.tracing.begin(e.ticket.name, e.id, e.attempt, job.id, now_ms)
        backfill = backfill_of(e.trigger)
        return Delivery(
            job.id,
            e.id,
            iso(e.scheduled_ms),
            e.attempt,
            job.payload,
            e.event_index,
            signature,
            ((("Cronman-Backfill-Id", backfill),) if backfill else ()) + e.extra,
            job.namespace,
            trace,
            job.opts.capture,
            waited=e.waited,
        )
