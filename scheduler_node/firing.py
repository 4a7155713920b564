"""The firing path of a node: the timer, claims, takeovers, throttle permits, deliveries,
retries, history rows and done marks. Every step that talks to Redis does so once per timer pass
for all the executions it has, never once per execution.

Life of an occurrence:
1. the timer pops every due (job, time), makes one execution per event, and claims them all in
   one Redis round trip;
2. won: wait for a throttle permit if the job names a policy, deliver (renewing the claim while
   in flight), record history, retry with backoff, then mark the claim done (coalesced with other
   marks into one round trip);
3. lost: check back after the holder's deadline; if it vanished without finishing, take over
   (verifying first against the history when Redis had no record at all).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import os
import random
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from cronman import signing
from cronman.execution import Status, Trigger, backoff_ms, execution_id
from cronman.timeutil import iso
from scheduler_node.dispatch import Delivery, Outcome
from scheduler_node.execution import Execution
from scheduler_node.feed import delete_completed, finished_executions
from scheduler_node.history import HistoryRow, row_to_text
from scheduler_node.jobs import HttpCall, OwnedJob, SqsSend

if TYPE_CHECKING:
    import itertools
    from collections.abc import Callable, Coroutine
    from typing import Any

    from sqlalchemy import Engine

    from cronman.keys import Keys
    from cronman.settings import Settings
    from scheduler_node.claims import ClaimStore
    from scheduler_node.dispatch import Dispatcher
    from scheduler_node.feed import ClusterConfig
    from scheduler_node.history import HistoryWriter
    from scheduler_node.metrics import NodeMetrics
    from scheduler_node.throttle import ThrottleGate

log = logging.getLogger("cronman.node")

MAX_BATCH = 5000  # due executions handled per timer pass
# A timer pass costs a Redis round trip or two whatever its size, so under load passes are at least
# this far apart: each then handles many executions (up to this much later than due).
TICK_SECONDS = 0.02
CHECK_MARGIN_MS = 300
FINAL = frozenset({Status.SUCCEEDED.value, Status.PERMANENTLY_FAILED.value, Status.SKIPPED.value})
_OVERLAP = "overlap: the previous execution of this job was still in flight"


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait for ``event`` at most ``timeout`` seconds. (asyncio.wait_for on Python 3.11 can swallow
    a cancellation that races with the event; asyncio.timeout does not.)"""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass


class Firing:
    """Mixed into Node; uses its clients, settings and state, declared here."""

    s: Settings
    node_id: str
    keys: Keys
    lease_ms: int
    metrics: NodeMetrics
    config: ClusterConfig
    engine: Engine
    claims: ClaimStore
    throttle: ThrottleGate
    dispatcher: Dispatcher
    history: HistoryWriter
    jobs: dict[str, OwnedJob]
    fires: list[tuple[int, str, int]]
    retries: list[tuple[int, int, Execution]]
    checks: list[tuple[int, int, Execution]]
    manual: list[Execution]
    held: dict[str, Execution]
    _done_pending: list[tuple[Execution, str, str]]
    _seq: itertools.count[int]
    _attempts: set[asyncio.Task[None]]
    _sending: dict[asyncio.Future[Outcome], tuple[Execution, int]]  # delivery -> (execution, sent at)
    _queued: collections.deque[Execution]  # waiting for one of max_in_flight
    _reverify: list[Execution]
    _marking: set[str]  # history rows whose done mark (which remembers them in Redis) is on its way
    _already_written: set[str]  # of those, the rows already written to PostgreSQL
    _wake: asyncio.Event
    _done_wake: asyncio.Event
    _stopping: bool

    def now_ms(self) -> int:
        raise NotImplementedError

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    def _forget(self, rows: list[str]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ the timer
    async def _timer_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            pass_started = loop.time()
            now = self.now_ms()
            due: list[Execution] = self.manual
            self.manual = []
            fires = self.fires
            while fires and fires[0][0] <= now and len(due) < MAX_BATCH:
                when, job_id, gen = heapq.heappop(fires)
                job = self.jobs.get(job_id)
                if job is None or job.gen != gen:
                    continue
                due.extend(self._occurrence(job, when))
                nxt = job.timing.next_after(when)
                if nxt is not None:
                    heapq.heappush(fires, (nxt, job_id, gen))
            retries = self._pop_due(self.retries, now)
            checks = self._pop_due(self.checks, now)
            try:
                if self._reverify:
                    await self._confirm_late()
                if due:
                    await self._claim(due)
                for e in retries:
                    if not e.lost:
                        self._dispatch(e)
                if checks:
                    await self._check(checks)
                if self.throttle.waiting:
                    for e in await self.throttle.grant(self.now_ms()):
                        self._granted(e)
            except Exception:  # noqa: BLE001 - never let one pass stop the timer
                log.exception("timer pass failed")
            await self._sleep_until_next(pass_started + TICK_SECONDS - loop.time())

    def _occurrence(self, job: OwnedJob, when: int) -> list[Execution]:
        """The executions of one occurrence: one per event, guarded by the job's running execution
        when the job skips overlapping runs."""
        out = []
        for i in range(job.opts.events):
            e = Execution(job, when, self.keys, event_index=i)
            if job.opts.overlap_skip:
                e.guard = f"{self.keys.running(job.id)}:{i}"
            out.append(e)
        return out

    @staticmethod
    def _pop_due(heap: list[tuple[int, int, Execution]], now: int) -> list[Execution]:
        out: list[Execution] = []
        while heap and heap[0][0] <= now and len(out) < MAX_BATCH:
            out.append(heapq.heappop(heap)[2])
        return out

    async def _sleep_until_next(self, rest_of_tick: float) -> None:
        if self.manual or self._reverify:
            await asyncio.sleep(max(0.0, rest_of_tick))
            return
        heads = [h[0][0] for h in (self.fires, self.retries, self.checks) if h]
        cap = 0.05 if self.throttle.waiting else 0.1
        delay = cap if not heads else max(0.0, min(cap, (min(heads) - self.now_ms()) / 1000))
        delay = max(delay, rest_of_tick)
        if delay <= 0:
            await asyncio.sleep(0)
            return
        self._wake.clear()
        await wait_event(self._wake, delay)

    def _later(self, heap: list[tuple[int, int, Execution]], when: int, e: Execution) -> None:
        heapq.heappush(heap, (when, next(self._seq), e))

    # ------------------------------------------------------------------ claims
    async def _claim(self, due: list[Execution]) -> None:
        now = self.now_ms()
        deadline = now + self.lease_ms
        try:
            won = await self.claims.claim([e.key for e in due], deadline, now, [e.guard for e in due])
        except (RedisError, OSError) as exc:
            log.warning("claims failed, will check back: %s", exc, extra={"executions": len(due)})
            for e in due:
                self._later(self.checks, now + 500, e)
            return
        m = self.metrics
        for e, w in zip(due, won, strict=True):
            if w == 1:
                e.deadline_ms = deadline
                self.held[e.key] = e
                m.claim["won"].inc()
                self._won(e)
            elif w == 2:  # won, but the previous execution is still in flight: skipped
                m.claim["won"].inc()
                self._record_skip(e.job, e.scheduled_ms, e.event_index, _OVERLAP, e.id, e.trigger)
            else:
                m.claim["lost"].inc()
                self._later(self.checks, deadline + CHECK_MARGIN_MS, e)
        m.in_flight.set(len(self.held))

    def _won(self, e: Execution) -> None:
        plan = e.misfire
        if plan is not None:
            for t in plan.skip:
                if t != e.scheduled_ms:
                    self._record_skip(e.job, t, 0, plan.reason)
            if e.scheduled_ms in plan.skip:  # nothing of the missed window is fired
                self.held.pop(e.key, None)
                self._finish_skipped(e, plan.reason)
                return
        self._dispatch(e)

    async def _check(self, checks: list[Execution]) -> None:
        """Check back on executions another node claimed; take over those it abandoned."""
        now = self.now_ms()
        try:
            results = await self.claims.check([e.key for e in checks], now, now + self.lease_ms)
        except (RedisError, OSError) as exc:
            log.warning("claim checks failed: %s", exc)
            for e in checks:
                self._later(self.checks, now + 1000, e)
            return
        taken: list[Execution] = []
        for e, r in zip(checks, results, strict=True):
            if r.state == -1:
                self._later(self.checks, max(r.value, now) + CHECK_MARGIN_MS, e)
            elif r.state in (1, 2):
                e.attempt = max(1, r.value)
                e.deadline_ms = now + self.lease_ms
                taken.append(e)
        if not taken:
            return
        try:
            finished = await self._in_thread(finished_executions, self.engine, [e.ident for e in taken])
        except Exception as exc:  # noqa: BLE001 - cannot verify: deliver (at least once)
            log.warning("could not verify takeovers against history: %s", exc)
            finished = set()
        for e in taken:
            current = self.jobs.get(e.job.id)
            if e.ident in finished or current is None:
                self._queue_done(e, "verified")
                continue
            e.job = current
            self.held[e.key] = e
            self.metrics.claim["taken_over"].inc()
            log.info("took over execution", extra={"job_id": e.job.id, "execution_id": e.id, "attempt": e.attempt})
            self._won(e)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.s.lease_seconds / 3)
            try:
                await self._renew(list(self.held.values()))
                await self.throttle.renew(self.now_ms())
                self.dispatcher.http.prune()
            except (RedisError, OSError) as exc:
                log.warning("lease renewal failed: %s", exc)

    async def _renew(self, items: list[Execution]) -> None:
        if not items:
            return
        deadline = self.now_ms() + self.lease_ms
        results = await self.claims.renew(
            [e.key for e in items], [self.claims.claim_value(e.attempt, deadline) for e in items]
        )
        for e, r in zip(items, results, strict=True):
            if r == 0:
                self._lose(e)
            else:
                e.deadline_ms = deadline

    def _lose(self, e: Execution) -> None:
        if e.lost:
            return
        e.lost = True
        self.throttle.release(e)
        self.held.pop(e.key, None)
        self._superseded(e, "lost the claim on an execution")

    def _superseded(self, e: Execution, message: str) -> None:
        """Count an execution another node took over, once, however this node learned of it."""
        if not e.superseded:
            e.superseded = True
            self.metrics.claim["superseded"].inc()
            log.warning(message, extra={"job_id": e.job.id, "execution_id": e.id})

    def _queue_done(self, e: Execution, status: str, row: str = "") -> None:
        self._done_pending.append((e, status, row))
        if row:
            self._marking.add(row)
        self._done_wake.set()

    async def _done_loop(self) -> None:
        while True:
            await self._done_wake.wait()
            # No waiting to gather more: between a delivery and its done mark, a node that dies
            # leaves the replica to deliver again, so that window stays one round trip.
            self._done_wake.clear()
            try:
                await self._flush_done()
            except (RedisError, OSError) as exc:
                log.warning("marking executions done failed, retrying: %s", exc)
                await asyncio.sleep(0.5)
                self._done_wake.set()

    async def _flush_done(self) -> None:
        """Coalesced: whatever finished while the previous round trip was out goes in the next."""
        while self._done_pending:
            batch, self._done_pending = self._done_pending, []
            # A row already in PostgreSQL (its write beat this mark) need not be remembered.
            rows = ["" if row in self._already_written else row for _, _, row in batch]
            try:
                ok = await self.claims.done(
                    [e.key for e, _, _ in batch],
                    [f"d|{self.node_id}|{st}|{e.attempt}" for e, st, _ in batch],
                    rows,
                    self.keys.unrecorded(self.node_id),
                )
            except BaseException:
                self._done_pending[:0] = batch
                raise
            late = []
            for row in rows:
                if row:
                    self._marking.discard(row)
                    if row in self._already_written:  # written while this mark was on its way
                        late.append(row)
            for _, _, row in batch:
                self._already_written.discard(row)
            if late:
                self._forget(late)
            for (e, _, _), marked in zip(batch, ok, strict=True):
                if not marked:
                    e.lost = True
                    self._superseded(e, "another node took over an execution this node delivered")

    # ------------------------------------------------------------------ throttles and delivery
    def _dispatch(self, e: Execution) -> None:
        """Deliver now, or queue for a permit of the job's throttle policy."""
        policy = self.throttle.policy_of(e)
        if policy is None:
            self._start_attempt(e)
        else:
            self.throttle.wait(policy, e, self.now_ms())
            self._wake.set()

    def _granted(self, e: Execution) -> None:
        if e.waiting_since_ms is not None:
            e.throttle_wait_ms += self.now_ms() - e.waiting_since_ms
            e.waiting_since_ms = None
        if e.lost:
            self.throttle.release(e)
            return
        self._start_attempt(e)

    def _start_attempt(self, e: Execution) -> None:
        """Send now if fewer than max_in_flight deliveries are out, else queue (oldest first)."""
        if len(self._sending) < self.s.max_in_flight:
            self._send(e)
        else:
            self._queued.append(e)

    def _send(self, e: Execution) -> None:
        if e.lost or (self._stopping and e.attempt > 1):
            self.throttle.release(e)
            return
        now = self.now_ms()
        if now > e.deadline_ms - self.lease_ms // 5:
            # The lease may have run out (the process was paused or starved): the next timer pass
            # confirms it, for every such execution at once, before anything is sent.
            self._reverify.append(e)
            self._wake.set()
            return
        if "exit_after_claim" in self.s.faults:
            os._exit(137)  # test fault: die holding a claim, before sending
        future = self.dispatcher.submit(e.job.target, self._delivery(e, now))
        self._sending[future] = (e, now)
        future.add_done_callback(self._delivered)

    def _delivered(self, future: asyncio.Future[Outcome]) -> None:
        e, fired = self._sending.pop(future)
        finished = self.now_ms()
        if self.throttle.release(e) and self.throttle.waiting:
            self._wake.set()  # a permit is free: hand it out now, not at the next pass
        self._finish(e, future.result(), fired, finished)
        while self._queued and len(self._sending) < self.s.max_in_flight:
            self._send(self._queued.popleft())

    async def _confirm_late(self) -> None:
        """Renew, in one round trip, the claims of executions whose lease ran out before they
        were sent; send those still held, drop those another node took over."""
        items, self._reverify = self._reverify, []
        try:
            await self._renew(items)
        except (RedisError, OSError):
            self._reverify[:0] = items
            return
        for e in items:
            if e.lost:
                self.throttle.release(e)
            else:
                self._send(e)

    def _delivery(self, e: Execution, now_ms: int) -> Delivery:
        job = e.job
        secrets = self.config.secrets.get(job.namespace)
        signature = signing.sign(secrets, job.payload, now_ms // 1000) if secrets else None
        return Delivery(job.id, e.id, iso(e.scheduled_ms), e.attempt, job.payload, e.event_index, signature)

    # ------------------------------------------------------------------ outcomes
    def _finish(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        job = e.job
        m = self.metrics
        if e.attempt == 1:
            m.lag.observe(max(0, fired - e.scheduled_ms - e.throttle_wait_ms) / 1000)
        m.latency["http" if isinstance(job.target, HttpCall) else "sqs"].observe((finished - fired) / 1000)
        retry = job.retry
        error = outcome.error
        if outcome.ok:
            status = Status.SUCCEEDED
        elif e.attempt >= retry.max_attempts:
            status = Status.PERMANENTLY_FAILED
        else:
            fraction = random.uniform(0.5, 1.0) if retry.jitter else 1.0
            delay = backoff_ms(e.attempt, retry.backoff_seconds, retry.max_backoff_seconds, fraction)
            if retry.max_age_ms is not None and finished + delay - e.scheduled_ms > retry.max_age_ms:
                status = Status.PERMANENTLY_FAILED
                error = f"{error} (no retry: older than max_event_age_seconds)"
            else:
                status = Status.FAILED
        if status is Status.PERMANENTLY_FAILED and job.opts.dead_letter and not e.lost:
            self._background(self._dead_letter(e, outcome.http_status, error, fired, finished))
            return
        row = self._record(e, status, outcome.http_status, error, fired, finished)
        if e.lost:
            return
        if status is Status.FAILED:
            e.attempt += 1  # when stopping, _drain hands it to the replica instead
            self._later(self.retries, finished + delay, e)
            self._wake.set()
            return
        self._close(e, status, row)

    def _record(
        self,
        e: Execution,
        status: Status,
        http_status: int | None,
        error: str | None,
        fired: int | None,
        finished: int | None,
        dead_lettered: bool | None = None,
    ) -> HistoryRow:
        self.metrics.status[status.value].inc()
        row = self.history.add(
            HistoryRow(
                e.job.id,
                e.scheduled_ms,
                e.event_index,
                e.attempt,
                e.id,
                e.trigger,
                status.value,
                self.node_id,
                fired,
                finished,
                None if fired is None else fired - e.scheduled_ms,
                http_status,
                error,
                e.throttle_wait_ms or None,
                dead_lettered,
            )
        )
        self.metrics.history_buffered.set(len(self.history))
        return row

    def _close(self, e: Execution, status: Status, row: HistoryRow) -> None:
        """A final outcome: release the claim (done), and delete a job that has nothing left."""
        self.held.pop(e.key, None)
        self._queue_done(e, status.value, row_to_text(row))
        self.metrics.in_flight.set(len(self.held))
        job = e.job
        if (
            job.opts.delete_after
            and e.trigger == Trigger.SCHEDULE
            and e.event_index == job.opts.events - 1
            and job.timing.next_after(e.scheduled_ms) is None
        ):
            self._background(self._delete_completed(job))

    async def _delete_completed(self, job: OwnedJob) -> None:
        try:
            if await self._in_thread(delete_completed, self.engine, job.id, job.version):
                log.info("deleted a completed job", extra={"job_id": job.id})
        except Exception as exc:  # noqa: BLE001 - the job stays, completed
            log.warning("could not delete completed job: %s", exc, extra={"job_id": job.id})

    async def _dead_letter(
        self, e: Execution, http_status: int | None, error: str | None, fired: int, finished: int
    ) -> None:
        job = e.job
        assert job.opts.dead_letter is not None
        extra: tuple[tuple[str, str], ...] = (("Cronman-Error", (error or "")[:256]),)
        if http_status is not None:
            extra += (("Cronman-Http-Status", str(http_status)),)
        d = Delivery(job.id, e.id, iso(e.scheduled_ms), e.attempt, job.payload, e.event_index, None, extra)
        outcome = await self.dispatcher.send(SqsSend(job.opts.dead_letter, None), d)
        if not outcome.ok:
            error = f"{error}; dead-letter queue: {outcome.error}"
            log.warning("could not dead-letter an execution", extra={"job_id": job.id, "execution_id": e.id})
        row = self._record(e, Status.PERMANENTLY_FAILED, http_status, error, fired, finished, outcome.ok)
        if not e.lost:
            self._close(e, Status.PERMANENTLY_FAILED, row)

    def _finish_skipped(self, e: Execution, reason: str) -> None:
        row = self._record(e, Status.SKIPPED, None, reason, None, None)
        self._close(e, Status.SKIPPED, row)

    def _record_skip(
        self,
        job: OwnedJob,
        t: int,
        event_index: int,
        reason: str,
        exec_id: str | None = None,
        trigger: str = Trigger.SCHEDULE,
    ) -> None:
        self.metrics.status[Status.SKIPPED.value].inc()
        self.history.add(
            HistoryRow(
                job.id,
                t,
                event_index,
                1,
                exec_id or execution_id(job.id, t, event_index, trigger),
                trigger,
                Status.SKIPPED.value,
                self.node_id,
                None,
                None,
                None,
                None,
                reason,
            )
        )
