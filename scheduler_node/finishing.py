"""What an attempt's outcome makes of its execution: the retry decision (retry.decide), then its
history row recorded, and a retry parked, a dead letter sent, or the claim marked done; a job that
completed (delete_after_completion) is deleted. Also the firer's recent fire and lag figures."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Protocol

from cronman.model.calendars import SkipSummary
from cronman.model.execution import Status, Trigger, backfill_of, execution_id
from cronman.model.timeutil import iso
from scheduler_node.aio import Spawn, Trace
from scheduler_node.execution import Execution, Stage
from scheduler_node.history import HistoryRow, HistoryWriter, clean_text, row_to_text
from scheduler_node.jobs import OwnedJob
from scheduler_node.leases import Leases
from scheduler_node.lifecycle import next_occurrence
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import Delivery, Outcome
from scheduler_node.retry import decide
from scheduler_node.senders import Senders
from scheduler_node.store import NodeStore
from scheduler_node.throttle import ThrottleGate
from scheduler_node.tracing import Tracing
from scheduler_node.verify import Verifier

log = logging.getLogger("cronman.node")

DELETE_GATHER_S = 0.05  # completed jobs gathered this long into one delete (delete_after_completion)


class FinishHost(Protocol):
    """What finishing asks of the firer whose executions it finishes."""

    @property
    def trace(self) -> Trace | None: ...
    @property
    def jobs(self) -> dict[str, OwnedJob]: ...
    @property
    def slots(self) -> frozenset[int]: ...

    def wake(self) -> None:
        """Run a timer pass soon (a throttle permit was freed)."""

    def accepted(self, e: Execution) -> None:
        """The receiver accepted ``e``'s asynchronous work: it waits for the work's end."""

    def unaccepted(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        """The receiver did not accept ``e``'s asynchronous work: its run is closed, then the outcome is
        dealt with (Finisher.outcome again, as reported)."""


class Finisher:
    def __init__(
        self,
        host: FinishHost,
        *,
        leases: Leases,
        memory: Verifier,
        history: HistoryWriter,
        metrics: NodeMetrics,
        store: NodeStore,
        senders: Senders,
        throttle: ThrottleGate | None,
        tracing: Tracing,
        clock: Callable[[], int],
        rng: random.Random,
        spawn: Spawn,
        node_id: str,
    ) -> None:
        self.host = host
        self.leases = leases
        self.memory = memory  # what this node did of executions another node took over
        self.history = history
        self.metrics = metrics
        self.store = store
        self.senders = senders
        self.throttle = throttle
        self.tracing = tracing
        self.clock = clock
        self.rng = rng
        self.spawn = spawn
        self.node_id = node_id
        self._completed: list[tuple[str, int]] = []  # jobs to delete (delete_after_completion)
        self._fired_recent: list[int] = []  # fired-at times of the last second (fires per second)
        self._lags: list[int] = []  # recent first-attempt lags (ms)

    def rates(self, now: int) -> tuple[float, int | None]:
        """(fires a second over the last ten seconds, the recent first attempts' lag p99 in ms)."""
        self._fired_recent = [t for t in self._fired_recent if t > now - 10_000]
        lags = sorted(self._lags[-1000:])
        return round(len(self._fired_recent) / 10, 1), (lags[int(len(lags) * 0.99)] if lags else None)

    def outcome(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        if self.throttle is not None and self.throttle.release(e) and self.throttle.waiting:
            self.host.wake()  # a permit is free: hand it out now, not at the next pass
        try:
            self._finish(e, outcome, fired, finished)
        except Exception as exc:  # noqa: BLE001 - one execution's data never stops the others
            log.exception("recording an outcome failed", extra={"job_id": e.d.job_id, "execution_id": e.id})
            self.finish_with(e, Status.FAILED, f"cronman could not record the outcome: {type(exc).__name__}")

    def _finish(self, e: Execution, outcome: Outcome, fired: int, finished: int) -> None:
        job = e.job
        reported, e.reported = e.reported, False  # (this outcome's: a retry's answer is an answer again)
        m = self.metrics
        if e.attempt == 1 and not backfill_of(e.trigger) and not reported:  # a backfill is late on purpose
            lag = max(0, fired - e.scheduled_ms - e.throttle_wait_ms)
            m.tally.observe(m.lag, lag / 1000)
            self._lags.append(lag)
            if len(self._lags) > 2000:
                del self._lags[:1000]
        self._fired_recent.append(fired)
        m.tally.observe(m.latency_of(job.target.kind), (finished - fired) / 1000)
        current = self.host.jobs.get(job.id)
        gone = current is None or current.incarnation != job.incarnation
        status, delay, error = decide(
            outcome.ok,
            outcome.error,
            e.attempt,
            job.retry,
            e.scheduled_ms,
            finished,
            self.rng,
            aged_on_purpose=bool(backfill_of(e.trigger)),  # a backfill is old on purpose
        )
        self.tracing.end(e.ticket.name, e.attempt, outcome.ok, outcome.http_status, error, finished)
        if status is Status.SUCCEEDED and job.opts.completion is not None and not reported:
            # Accepted, not done: the work reports its end (scheduler_node.waits); whoever holds the
            # claim waits for it (another node, if it was taken over meanwhile).
            if e.superseded:
                e.stage = Stage.OVER
                self.leases.let_go(e)
            else:
                self.host.accepted(e)
            return
        if job.opts.completion is not None and not reported and not e.superseded:
            # Not accepted: its run is closed first, so that no late report of its work counts, and
            # a report that came first (the work ended before the answer failed) is the outcome.
            self.host.unaccepted(e, outcome, fired, finished)
            return
        if status is not Status.FAILED:
            self.tracing.finish(e.id, job.id, e.scheduled_ms, status.value, finished)
        if status is Status.PERMANENTLY_FAILED and job.opts.dead_letter and not e.superseded:
            e.stage = Stage.FINISHING
            self.spawn(self._dead_letter(e, outcome.http_status, error, fired, finished))
            return
        row = self._record(e, status, outcome.http_status, error, fired, finished, response=outcome.response)
        if e.superseded:  # another node has it now; it records its own attempts
            e.stage = Stage.OVER
            self.leases.let_go(e)
            self.memory.remember(e, row)
            return
        if status is Status.FAILED:
            e.failed_row = row._replace(response=None)
            e.attempt += 1
            if job.slot not in self.host.slots:  # the slot moved meanwhile: its new owners retry it
                self.leases.park(e, finished + delay, here=False, advance=True)
            elif gone or (current is not None and current.paused):
                self.finish_with(e, Status.CANCELLED, "no retry: the job was " + ("deleted" if gone else "paused"))
            else:
                self.leases.park(e, finished + delay, advance=True)
            return
        self.close(e, status.value, row_to_text(row))

    def _record(
        self,
        e: Execution,
        status: Status,
        http_status: int | None,
        error: str | None,
        fired: int | None,
        finished: int | None,
        dead_lettered: bool | None = None,
        response: bytes | None = None,
        summary: tuple[int, int | None] | None = None,  # a summary row: (occurrences, the last of them)
    ) -> HistoryRow:
        self.metrics.tally.inc(self.metrics.status_of(status.value))
        row = self.history.add(
            HistoryRow(
                e.d.job_id,
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
                clean_text(error),
                e.throttle_wait_ms or None,
                dead_lettered,
                e.job.incarnation,  # the descriptor's, or the one that adopted the execution
                e.job.namespace or None,
                None if response is None else response.decode("utf-8", "replace"),
                *(summary or ()),
            )
        )
        self.metrics.history_buffered.set(len(self.history))
        return row

    def finish_with(self, e: Execution, status: Status, reason: str, summary: SkipSummary | None = None) -> None:
        """A final outcome without an attempt (skipped, cancelled); ``summary``: the row stands for
        that many occurrences, through the last of them (a span a calendar excludes)."""
        trace = self.host.trace
        if trace:
            trace(status.value, e, reason)
        if summary is None or summary.occurrences is None:
            row = self._record(e, status, None, reason, None, None)
        else:
            row = self._record(e, status, None, reason, None, None, summary=(summary.occurrences, summary.last_ms))
        self.close(e, status.value, row_to_text(row))

    def cancel(self, e: Execution, reason: str) -> None:
        self.finish_with(e, Status.CANCELLED, reason)

    def close(self, e: Execution, status: str, row: str) -> None:
        """A final outcome: mark the claim done, and delete a job that has nothing left."""
        trace = self.host.trace
        if trace:
            trace("close", e, status)
        self.leases.close(e, status, row)
        job = e.job
        if (
            status != "done"
            and job.opts is not None
            and job.opts.delete_after
            and e.trigger == Trigger.SCHEDULE
            and e.event_index == job.opts.events - 1
            and next_occurrence(job, e.scheduled_ms) is None
        ):
            self._completed.append((job.id, job.version))
            if len(self._completed) == 1:
                self.spawn(self._delete_completed())

    async def _delete_completed(self) -> None:
        """Delete the jobs that completed meanwhile, in one call (a burst completes thousands)."""
        await asyncio.sleep(DELETE_GATHER_S)
        batch, self._completed = self._completed, []
        try:
            deleted = await self.store.delete_completed(batch)
        except Exception as exc:  # noqa: BLE001 - the jobs stay, completed
            log.warning(
                "could not delete completed jobs: %s",
                exc,
                extra={"count": len(batch), "job_ids": [j for j, _ in batch[:10]]},
            )
            return
        if deleted:
            log.info("deleted completed jobs", extra={"count": len(deleted), "job_ids": deleted[:10]})

    async def _dead_letter(
        self, e: Execution, http_status: int | None, error: str | None, fired: int, finished: int
    ) -> None:
        job = e.job
        assert job.opts.dead_letter is not None
        extra: tuple[tuple[str, str], ...] = (("Cronman-Error", (error or "")[:256]),)
        if http_status is not None:
            extra += (("Cronman-Http-Status", str(http_status)),)
        backfill = backfill_of(e.trigger)
        if backfill:
            extra += (("Cronman-Backfill-Id", backfill),)
        # (what its attempts sent; an execution that never got its payload sends JSON null)
        payload = e.payload if e.payload is not None else job.payload
        body = payload if payload is not None else b"null"
        d = Delivery(job.id, e.id, iso(e.scheduled_ms), e.attempt, body, e.event_index, None, extra, job.namespace)
        dlq = self.senders.by_kind.get("sqs")
        why: str | None = "no SQS sender"
        ok = False
        if dlq is not None:
            outcome = await self.senders.submit(dlq.decode({"type": "sqs", "queue_url": job.opts.dead_letter}), d)
            ok, why = outcome.ok, outcome.error
        if not ok:
            error = f"{error}; dead-letter queue: {why}"
            log.warning("could not dead-letter an execution", extra={"job_id": job.id, "execution_id": e.id})
        row = self._record(e, Status.PERMANENTLY_FAILED, http_status, error, fired, finished, ok)
        if not e.superseded:
            self.close(e, Status.PERMANENTLY_FAILED.value, row_to_text(row))

    def record_skip(
        self,
        job: OwnedJob,
        t: int,
        event_index: int,
        reason: str,
        exec_id: str | None = None,
        trigger: str = Trigger.SCHEDULE,
    ) -> None:
        self.metrics.tally.inc(self.metrics.status_of(Status.SKIPPED.value))
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
                None,
                None,
                job.incarnation,
                job.namespace,
            )
        )
