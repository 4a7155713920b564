"""What an execution waits for besides its time: before it is sent, its upstreams (an ``after``
job's execution carries the upstream runs it follows, or is skipped because one failed; a job
that ``require``s others waits for their recent success up to its bound, then is skipped); after
it is sent, the end its asynchronous work reports (``completion``).

Asynchronous work, attempt by attempt: the attempt is recorded in PostgreSQL as running, with a
fresh token and its deadline, before it is sent (the token goes with it). The receiver's 2xx
accepts it: the claim stays this node's, parked RUNNING_RECHECK_MS at a time, so that the job's
overlap guard holds while the work runs and whoever owns the slot takes it over if this node dies.
A poll (POLL_S) of the runs parked here brings an execution back as soon as its work reported; a
running one is also looked at each time its park ends. The work's end is then its outcome: a
success, or a failed attempt retried by the job's policy under the same execution id; no end by
the deadline is a failed attempt too. What the row says decides, whichever node looks: an attempt
recorded as sent is never sent again, it is waited for.

Executions of such jobs need PostgreSQL to be sent: while it is away they wait (parked and looked at
again every UNAVAILABLE_RETRY_MS)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Callable
from typing import Protocol

from cronman.errors import TransientError
from cronman.model.execution import (
    COMPLETION_TOKEN_HEADER,
    RUNNING,
    UPSTREAM_REASON,
    UPSTREAMS_HEADER,
    Status,
    Trigger,
    execution_id,
)
from cronman.model.timeutil import iso
from scheduler_node.aio import Spawn, Trace
from scheduler_node.delivery import Deliveries
from scheduler_node.execution import Execution, Stage
from scheduler_node.finishing import Finisher
from scheduler_node.leases import Leases
from scheduler_node.parts import Outcome
from scheduler_node.store import AsyncRun, NodeStore, RunStart, Upstreams

log = logging.getLogger("cronman.node")

RUNNING_RECHECK_MS = 15_000  # a running execution's claim is parked this long at a time
REQUIRE_RECHECK_MS = 5_000  # an unmet requirement is looked at again this often while it may wait
UNAVAILABLE_RETRY_MS = 2_000  # PostgreSQL away: the execution is looked at again this much later
POLL_S = 1.0  # the runs parked here are read this often
REPORTED = (Status.SUCCEEDED.value, Status.FAILED.value)  # the ends a work reports


class WaitHost(Protocol):
    @property
    def trace(self) -> Trace | None: ...
    @property
    def stopping(self) -> bool: ...


def waits_for_something(e: Execution) -> bool:
    """Whether ``e`` has anything to wait for besides its time (most executions: no)."""
    opts = e.job.opts
    return opts.completion is not None or opts.require is not None or e.trigger == Trigger.AFTER


class Waits:
    __slots__ = ("host", "store", "leases", "finisher", "delivery", "clock", "spawn", "_queue", "running", "_polling")

    def __init__(
        self,
        host: WaitHost,
        *,
        store: NodeStore,
        leases: Leases,
        finisher: Finisher,
        delivery: Deliveries,
        clock: Callable[[], int],
        spawn: Spawn,
    ) -> None:
        self.host = host
        self.store = store
        self.leases = leases
        self.finisher = finisher
        self.delivery = delivery
        self.clock = clock
        self.spawn = spawn
        self._queue: list[Execution] = []
        self.running: dict[str, Execution] = {}  # parked here while their work runs, by claim name
        self._polling = False

    # -- before the send
    def admit(self, e: Execution) -> None:
        """``e`` is won and wanted: send it once what it waits for is there (batched: those
        admitted meanwhile are looked at in the same calls)."""
        self._queue.append(e)
        if len(self._queue) == 1:
            self.spawn(self._admit())

    async def _admit(self) -> None:
        await asyncio.sleep(0)
        items, self._queue = self._queue, []
        try:
            items = await self._upstreams(items)
            await self._start(items)
        except TransientError as exc:
            log.warning("cannot look at what executions wait for, trying again: %s", exc)
            for e in items:
                if self._live(e):
                    self._park(e, self.clock() + UNAVAILABLE_RETRY_MS)

    @staticmethod
    def _live(e: Execution) -> bool:
        return e.stage is Stage.WAITING and not e.superseded

    def _park(self, e: Execution, due_ms: int) -> None:
        self.leases.park(e, due_ms)

    async def _upstreams(self, items: list[Execution]) -> list[Execution]:
        """Attach the upstream runs each follows; skip or park those whose upstreams say so.
        Returns those that go on."""
        after = {id(e) for e in items if e.trigger == Trigger.AFTER}
        checked = [e for e in items if self._checks_requirement(e)]
        checking = {id(e) for e in checked}
        recorded = {id(e) for e in items if e.job.opts.require is not None and id(e) not in checking}
        if not after and not checked and not recorded:
            return items
        ids = {execution_id(e.d.job_id, e.scheduled_ms, 0, e.trigger) for e in items if id(e) in after}
        ids |= {e.id for e in items if id(e) in recorded}
        found = await self.store.upstreams_of(sorted(ids)) if ids else {}
        # A later attempt whose first never checked the requirement checks it now: its first was
        # skipped, and the skip undone (a misfire plan that counted as missed what a node had
        # claimed: delivered late, as attempt 2, Verifier), or it never got that far. Sent with
        # nothing to carry, it went out with its requirement unmet (sim seed 9722235).
        unchecked = [
            e
            for e in items
            if id(e) in recorded
            and found.get(e.id) is None
            and e.trigger == Trigger.SCHEDULE  # (a manual trigger is sent whatever is required)
            and not e.d.suffix
        ]
        if unchecked:
            checked += unchecked
            checking |= {id(e) for e in unchecked}
            recorded -= {id(e) for e in unchecked}
        wanted = sorted({(e.job.namespace, j) for e in checked for j in e.job.opts.require.jobs})  # type: ignore[union-attr]
        successes = await self.store.last_successes(wanted) if wanted else {}
        now = self.clock()
        out: list[Execution] = []
        records: list[tuple[str, str, str, Upstreams]] = []
        for e in items:
            if not self._live(e):
                continue
            if id(e) in after or id(e) in recorded:
                key = e.id if id(e) in recorded else execution_id(e.d.job_id, e.scheduled_ms, 0, e.trigger)
                ups = found.get(key)
                if ups is not None and ups.skip_reason:
                    self.finisher.finish_with(e, Status.SKIPPED, ups.skip_reason)
                    continue
                if ups is not None and ups.ids:
                    e.extra += ((UPSTREAMS_HEADER, ",".join(ups.ids)),)
            if id(e) in checking:
                req = e.job.opts.require
                assert req is not None
                since = e.scheduled_ms - req.within_ms
                missing = [j for j in req.jobs if successes.get((e.job.namespace, j), ("", -1))[1] < since]
                if missing:
                    if now < e.scheduled_ms + req.wait_ms:
                        self._park(e, min(e.scheduled_ms + req.wait_ms, now + REQUIRE_RECHECK_MS))
                    else:
                        self.finisher.finish_with(e, Status.SKIPPED, _unmet(missing, req.within_ms, e.scheduled_ms))
                    continue
                ups = Upstreams(req.jobs, tuple(successes[(e.job.namespace, j)][0] for j in req.jobs))
                records.append((e.id, e.job.namespace, e.d.job_id, ups))
                e.extra += ((UPSTREAMS_HEADER, ",".join(ups.ids)),)
            out.append(e)
        if records:
            await self.store.record_upstreams(records)
        return out

    @staticmethod
    def _checks_requirement(e: Execution) -> bool:
        """A scheduled occurrence's first attempt checks its requirement; its retries (and a
        redelivery) carry what the first found."""
        return e.job.opts.require is not None and e.trigger == Trigger.SCHEDULE and e.attempt == 1 and not e.d.suffix

    async def _start(self, items: list[Execution]) -> None:
        """Record the attempts of asynchronous work as running, then send them; an attempt recorded
        already (a takeover, a running one looked at again) is settled by what its row says."""
        runs: list[RunStart] = []
        tokens: dict[str, str] = {}
        for e in items:
            c = e.job.opts.completion
            if c is None or not self._live(e):
                continue
            token = secrets.token_urlsafe(32)
            tokens[e.id] = token
            timeout = c.timeout_ms + int(e.job.target.timeout * 1000)
            runs.append(
                RunStart(
                    e.id,
                    e.job.namespace,
                    e.d.job_id,
                    e.scheduled_ms,
                    e.event_index,
                    e.trigger,
                    e.attempt,
                    hashlib.sha256(token.encode()).digest(),
                    timeout,
                    c.heartbeat_ms,
                )
            )
        found = await self.store.start_runs(runs) if runs else {}
        recorded: list[tuple[Execution, AsyncRun]] = []
        for e in items:
            if not self._live(e):
                continue
            if e.job.opts.completion is None:
                self.delivery.dispatch(e)
                continue
            started, run = found.get(e.id, (False, None))
            if started:
                kept = tuple(h for h in e.extra if h[0] != COMPLETION_TOKEN_HEADER)
                e.extra = (*kept, (COMPLETION_TOKEN_HEADER, tokens[e.id]))
                self.delivery.dispatch(e)
            elif run is None:  # (the row vanished: purged with old history) sent as it is
                self.delivery.dispatch(e)
            else:
                recorded.append((e, run))
        if recorded:
            await self._settle(recorded)

    async def _settle(self, recorded: list[tuple[Execution, AsyncRun]]) -> None:
        """Attempts recorded already, by what their rows say; those running past their deadline
        timed out first, in one call."""
        trace = self.host.trace
        late: list[tuple[str, int]] = []
        for e, run in recorded:
            if trace:
                trace("async", e, f"attempt {run.attempt} {run.status} remaining {run.remaining_ms}")
            e.attempt = max(e.attempt, run.attempt)
            if run.status == RUNNING and run.remaining_ms <= 0:
                late.append((e.id, run.attempt))
        rows = await self.store.time_out_runs(late) if late else {}
        for e, run in recorded:
            if not self._live(e):
                continue
            run = rows.get(e.id, run)
            if run.status != RUNNING:
                self._report(e, run)
            elif run.remaining_ms > 0:
                self._park_running(e, run.remaining_ms)
            else:  # (the database's clock says it has not passed yet after all)
                self._park_running(e, 100)

    def _report(self, e: Execution, run: AsyncRun) -> None:
        """The work's end (or its timeout) is the attempt's outcome."""
        e.reported = True
        now = self.clock()
        output = None if run.output is None else run.output.encode()
        if run.status == Status.SUCCEEDED.value:
            outcome = Outcome(True, None, None, output)
        elif run.status == "timed_out":
            outcome = Outcome(False, None, "its work reported no end by its deadline (completion timeout)")
        elif run.status == "unaccepted":
            outcome = Outcome(False, None, "its receiver did not accept the attempt")
        else:
            outcome = Outcome(False, None, "its work reported failure" + (f": {run.output}" if run.output else ""))
        self.finisher.outcome(e, outcome, run.started_ms, run.reported_ms or now)

    # -- after the send
    def accepted(self, e: Execution) -> None:
        """The receiver accepted ``e``'s asynchronous work: it runs until the work reports."""
        c = e.job.opts.completion
        assert c is not None
        self._park_running(e, min(c.timeout_ms, c.heartbeat_ms or c.timeout_ms))

    def unaccepted(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        """The receiver's answer to ``e``'s attempt was a failure: its run is closed (``unaccepted``),
        so that a report of its work arriving later changes nothing (sim seed 9000039: a receiver
        that accepted after the attempt's timeout, whose work then reported success, while the
        execution had permanently failed); a report that came first is the attempt's end."""
        self.spawn(self._unaccepted(e, outcome, fired, finished))

    async def _unaccepted(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        """Tried until PostgreSQL answers (the attempt stays in flight meanwhile, its lease renewed:
        its work may have reported success before the answer failed, sim seed 9000265); a node that
        stops leaves it to its lease, and whoever takes it over settles it by its row."""
        run: AsyncRun | None = None
        for attempt in range(10**6):  # bound: PostgreSQL answers, or the node stops
            if e.stage is Stage.OVER or e.superseded or self.host.stopping:
                return
            try:
                run = (await self.store.unaccept_runs([(e.id, e.attempt)])).get(e.id)
                break
            except TransientError as exc:
                if attempt % 20 == 0:
                    log.warning(
                        "cannot close an attempt its receiver did not accept, trying again: %s",
                        exc,
                        extra={"job_id": e.d.job_id, "execution_id": e.id},
                    )
                await asyncio.sleep(min(0.25 * (attempt + 1), 2.0))
        if e.stage is Stage.OVER:
            return
        if run is not None and run.attempt == e.attempt and run.status in REPORTED:
            self._report(e, run)
            return
        e.reported = True  # (the failure is this attempt's outcome: dealt with as any)
        self.finisher.outcome(e, outcome, fired, finished)

    def _park_running(self, e: Execution, remaining_ms: int) -> None:
        self._park(e, self.clock() + max(100, min(remaining_ms, RUNNING_RECHECK_MS)))
        self.running[e.ticket.name] = e
        if not self._polling:
            self._polling = True
            self.spawn(self._poll())

    async def _poll(self) -> None:
        """Bring back the executions parked here whose work reported its end."""
        try:
            for _ in range(10**9):  # bound: ends when nothing runs here
                await asyncio.sleep(POLL_S)
                running = self.running
                for name, e in list(running.items()):
                    if e.stage is not Stage.PARKED or self.leases.parked.get(e.ticket.member) is not e:
                        del running[name]
                if not running or self.host.stopping:
                    return
                try:
                    rows = await self.store.async_runs([e.id for e in running.values()])
                except TransientError:
                    continue
                back: list[Execution] = []
                for name, e in list(running.items()):
                    run = rows.get(e.id)
                    if run is None or run.attempt != e.attempt:
                        continue
                    ended = run.status != RUNNING or run.remaining_ms <= 0
                    if ended and e.stage is Stage.PARKED and self.leases.parked.get(e.ticket.member) is e:
                        del running[name]
                        back.append(e)
                if back:  # taken back at once, then settled by their rows
                    try:
                        await self.leases.bring_back(back)
                    except TransientError:  # (taken back when their parks end)
                        continue
        finally:
            self._polling = False


def _unmet(missing: list[str], within_ms: int, scheduled_ms: int) -> str:
    names = ", ".join(missing)
    verb = "has" if len(missing) == 1 else "have"
    return (
        f"{UPSTREAM_REASON}{names} {verb} not succeeded within {within_ms // 1000} s before {iso(scheduled_ms)} "
        "(require), nor while the occurrence waited"
    )
