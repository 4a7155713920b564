"""The watchdog for late occurrences and the notification dispatcher.

Both run in one process of the deployment at a time: every scheduler node and every API worker
takes part, and whichever holds a PostgreSQL advisory lock (session-level, on a connection of its
own) does the work; when it dies its connection closes and another process takes over within a
pass. Neither depends on the node that should have fired, nor on Redis: when every node is down
the API's workers keep watching, and when the API is down a node does.

Watchdog. Nodes record how far they have fired each slot (``node_progress``). A slot whose mark
lags more than a job's ``late_after_seconds`` behind now has occurrences nobody took up. Which
occurrences were due is what the nodes fire by: the job's schedule with its calendars
(`cronman.model.calendars.timing_with`; an occurrence on an excluded day was never due, so never late).
A job's late occurrences over a stall are recorded as one row (status ``late``, attempt 0, node
``watchdog``, at the first of them, with how many and the last: `cronman.model.late`), written again as
the count grows; the job's health turns ``late`` until an occurrence at or after it is attempted,
an ``execution.late`` event goes to the notification rules when the row is new, and
``cronman_occurrences_late_total`` counts the new rows. A healthy cluster costs one small query per
pass; during an outage, each pass reads the jobs of the stalled slots (all of them when no node
fires), streamed and their late rows written a batch at a time, and remembers how far it counted
for the jobs that had late occurrences.

Dispatcher (scheduler_node.notify). Events recorded by the history writers and the watchdog are
matched against the rules, summarised and put in the outbox, namespaces taking turns, each turn
bounded in events and in summaries touched; the outbox is sent from here, at least once, each
send a task of its own, at most a few in flight per target, a failing target backing off alone.
HTTP targets go through the callback guard, queues through the queue guard, exactly as deliveries
do, and are signed with the namespace's secret.

The watchdog, the summaries and the sends are three loops of the leader: none waits for another
(a black-holed notification target delays only its own notifications).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from cronman.errors import TransientError
from cronman.model.calendars import Calendar, timing_with
from cronman.model.execution import execution_id
from cronman.model.late import LateSpan, late_span
from cronman.model.schedule import Timing
from cronman.model.spec import MIN_LATE_AFTER_SECONDS, OPTION_DEFAULTS
from cronman.model.timeutil import iso
from cronman.settings import Settings
from cronman.store.health import LATE, WATCHDOG
from cronman.store.notifications import RuleBudget
from scheduler_node.aio import wait_event
from scheduler_node.deadlines import DeadlineJob, Deadlines
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import Decoder
from scheduler_node.notify import OutboxSender, Summariser
from scheduler_node.senders import Senders, make_senders
from scheduler_node.store import UNAVAILABLE, PgNodeStore

log = logging.getLogger("cronman.watch")

LOCK_KEY = 0x63726F6E6D616E  # "cronman": the advisory lock of the watch
LOOKBACK_MS = 86_400_000  # the watchdog looks at most this far back (as far as a node catches up)
_CALENDARS_FRESH_S = 1.0  # calendars read again at most this often (only their versions, unless changed)
_BATCH = 5000  # jobs read, and late rows written, a round trip
_NOTIFY_SECONDS = 1.0  # the summaries and the sends look at least this often (or as often as the watch)


@dataclass(slots=True)
class _Job:
    id: str
    slot: int
    incarnation: int
    namespace: str
    schedule: str
    late_after_ms: int
    updated_ms: int
    calendars: tuple[str, ...] = ()


class Watch:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        executor: Executor,
        senders: Senders,
        *,
        holder: str,
        on_late: Callable[[int], None] = lambda n: None,
        on_deadline_missed: Callable[[int], None] = lambda n: None,
        on_sent: Callable[[str], None] = lambda result: None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.s = settings
        self.engine = engine
        self.executor = executor
        self.senders = senders
        self.store = PgNodeStore(engine, executor)
        self.holder = holder
        self.on_late = on_late
        self.on_deadline_missed = on_deadline_missed
        self.on_sent = on_sent
        self.clock = clock or time.time
        self._conn: Any = None  # the connection that holds (or tries for) the advisory lock
        self._leading = False
        self._watched: dict[str, LateSpan] = {}  # job id -> its late occurrences, counted up to a point
        self._calendars: dict[tuple[str, str], Calendar] = {}
        self._calendars_read = -_CALENDARS_FRESH_S
        self.jobs_read = 0  # by the last pass that looked for late occurrences
        # Set when the watch ends: a pass in the executor's thread stops at the next job (at exit the
        # interpreter waits for that thread; a stopping node must not wait for a whole pass).
        self._ended = threading.Event()
        self.decoder = Decoder(lambda doc: doc)  # type: ignore[arg-type,return-value]
        self.summariser = Summariser(engine, RuleBudget(settings.notification_rule_per_minute))
        self.outbox = OutboxSender(settings, engine, senders, self._io, on_sent=on_sent, clock=self.clock)
        self.deadlines = Deadlines(engine, self._due_timing, lookback_ms=LOOKBACK_MS)

    @property
    def watching(self) -> int:
        """Jobs whose late occurrences the next pass goes on counting from where the last stopped."""
        return len(self._watched)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        except TransientError:
            raise
        except Exception as exc:
            if isinstance(exc, UNAVAILABLE):
                raise TransientError(f"database: {type(exc).__name__}: {str(exc).strip()[:200]}") from exc
            raise

    # ------------------------------------------------------------------ leading
    async def run(self) -> None:
        """Take part: hold (or wait for) the lead, and while leading run the watchdog, the
        summaries and the sends, each in a loop of its own."""
        await self.senders.start()
        loops = [
            self._spawn(c) for c in (self._lead_loop(), self._watchdog_loop(), self._notify_loop(), self._send_loop())
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            self._ended.set()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            try:
                await self.outbox.settle(5.0)
            except Exception as exc:  # noqa: BLE001 - their leases let the next leader send them
                log.warning("could not record the last notifications sent: %s", exc)
            self._release()
            await self.senders.close()

    @staticmethod
    def _spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)

    async def _lead_loop(self) -> None:
        while True:
            try:
                await self._io(self._lead)
            except TransientError as exc:
                log.warning("watch pass failed (the lead): %s", exc)
            except Exception:  # noqa: BLE001 - the next look tries again
                log.exception("watch pass failed (the lead)")
            await asyncio.sleep(self.s.watch_seconds)

    async def _watchdog_loop(self) -> None:
        await asyncio.sleep(0)  # (the lead is looked for first)
        while True:
            if self._leading:
                try:
                    fresh = await self.record_late(self.now_ms())
                    if fresh:
                        self.on_late(fresh)
                        log.warning("occurrences late: nobody took them up in time", extra={"count": fresh})
                except TransientError as exc:
                    log.warning("watch pass failed (the watchdog): %s", exc)
                except Exception:  # noqa: BLE001 - the next pass tries again
                    log.exception("watch pass failed (the watchdog)")
                try:
                    missed = await self.record_deadlines(self.now_ms())
                    if missed:
                        log.warning("occurrences missed their deadline", extra={"count": missed})
                except TransientError as exc:
                    log.warning("watch pass failed (deadlines): %s", exc)
                except Exception:  # noqa: BLE001 - the next pass tries again
                    log.exception("watch pass failed (deadlines)")
            await asyncio.sleep(self.s.watch_seconds)

    async def _notify_loop(self) -> None:
        """Events to summaries and the outbox; at once again while work is left."""
        every = min(_NOTIFY_SECONDS, self.s.watch_seconds)
        while True:
            more = False
            if self._leading:
                try:
                    queued, more = await self._io(self.summariser.pass_once, self.now_ms())
                    if queued:
                        self.outbox.wake.set()
                except TransientError as exc:
                    log.warning("watch pass failed (summaries): %s", exc)
                except Exception:  # noqa: BLE001 - the next pass tries again
                    log.exception("watch pass failed (summaries)")
            await asyncio.sleep(0 if more else every)

    async def _send_loop(self) -> None:
        """The outbox to targets: what finished is recorded, what is due and has room starts."""
        every = min(_NOTIFY_SECONDS, self.s.watch_seconds)
        while True:
            self.outbox.wake.clear()
            try:
                await self.outbox.flush()
                if self._leading and not self._ended.is_set():
                    await self.outbox.pump()
            except TransientError as exc:
                log.warning("watch pass failed (sends): %s", exc)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("watch pass failed (sends)")
            await wait_event(self.outbox.wake, every)

    async def pass_once(self) -> None:
        """One look of each part, one after the other (for tests and tools)."""
        fresh = await self.record_late(self.now_ms())
        if fresh:
            self.on_late(fresh)
        await self.record_deadlines(self.now_ms())
        await self._io(self.summariser.pass_once, self.now_ms())
        await self.outbox.pump()
        await self.outbox.settle(self.s.notification_timeout_seconds + 5)

    def _lead(self) -> bool:
        """Hold the advisory lock (taking it if free); False while another process holds it. The
        lock lives with a connection of this watch's own, kept open between passes."""
        try:
            if self._conn is None:
                self._conn = self.engine.raw_connection()
                self._conn.autocommit = True
            cur = self._conn.cursor()
            try:
                if self._leading:
                    cur.execute("SELECT 1")
                    return True
                cur.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,))
                (got,) = cur.fetchone()
            finally:
                cur.close()
        except Exception:
            self._release()  # the connection, and any lock it held, is gone
            raise
        if got:
            self._leading = True
            self._watched.clear()
            self.deadlines.forget()
            log.info("leading the watchdog and the notification dispatcher", extra={"holder": self.holder})
        return bool(got)

    def _release(self) -> None:
        """Close the lock's connection (never back to the pool: the lock would go with it)."""
        conn, self._conn = self._conn, None
        self._leading = False
        if conn is not None:
            try:
                conn.invalidate()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    # ------------------------------------------------------------------ the watchdog
    async def record_late(self, now: int) -> int:
        """Record the occurrences nobody took up in time; returns how many rows are new."""
        # how far each slot was fired, claims lost with Redis's data or not: those are owed, not late
        _, cluster_mark, marks = await self.store.slot_marks()
        if cluster_mark is None:
            return 0  # no node has ever run: nothing was owed yet
        slack = int((self.s.progress_seconds + self.s.watch_seconds) * 1000)
        behind = now - slack - MIN_LATE_AFTER_SECONDS * 1000  # no job is late sooner
        stalled = sorted(s for s, m in marks.items() if m < behind)
        # A slot no node has a mark for stands with the cluster's mark; when even that is behind,
        # no node is firing at all, and every job is looked at.
        stalled_all = cluster_mark < behind
        if not stalled and not stalled_all:
            self._watched.clear()
            return 0
        slots = None if stalled_all else stalled
        return int(await self._io(self._record_late, slots, marks, cluster_mark, now, behind))

    def _record_late(
        self, slots: list[int] | None, marks: dict[int, int], cluster_mark: int, now: int, behind: int
    ) -> int:
        """Blocking. The stalled slots' jobs stream in (``_BATCH`` rows a round trip) and their late
        rows are written as they add up, so a pass holds a batch of each, however many jobs the
        stalled slots have: when no node is firing, that is every job of the deployment. A slot
        whose mark is ``behind`` or later is not stalled."""
        fresh = 0
        rows: list[HistoryRow] = []
        # Where each job's next pass goes on from: kept for jobs still stalled that had late
        # occurrences (one with nothing late needs no entry: its next pass starts from the slot's
        # mark again, and finds the same nothing, or more).
        previous, watched = self._watched, {}
        # Only a job whose late_after_seconds is shorter than the oldest mark's lag can have a late
        # occurrence yet: while nodes start (their marks still) the others are not even read.
        lag = now - min([cluster_mark, *marks.values()])
        self.jobs_read = 0
        for job in self._jobs_of(slots, lag):
            if self._ended.is_set():
                return fresh  # what is left is the next leader's
            self.jobs_read += 1
            mark = marks.get(job.slot, cluster_mark)
            if mark >= behind:
                continue
            late, through = self._late_rows(job, mark, now, previous.get(job.id))
            if through is not None:
                watched[job.id] = through
            rows.extend(late)
            if len(rows) >= _BATCH:
                fresh += self.store.write_late(rows)
                rows = []
        if rows:
            fresh += self.store.write_late(rows)
        self._watched = watched
        return fresh

    def _jobs_of(self, slots: list[int] | None, lag_ms: int) -> Iterator[_Job]:
        """The unpaused jobs of ``slots`` (None: of every slot) that are late ``lag_ms`` after their
        due time, from a server-side cursor."""
        where = "" if slots is None else "AND slot = ANY(%(slots)s)"
        with self.engine.connect() as conn, conn.begin():
            cur: Any = conn.connection.dbapi_connection.cursor(name="cronman_watch_jobs")  # type: ignore[union-attr]
            cur.itersize = _BATCH
            try:
                cur.execute(
                    "SELECT id, slot, incarnation, namespace, schedule::text, options->>'late_after_seconds', "
                    "floor(extract(epoch from updated_at) * 1000)::bigint, options->'calendars' FROM jobs "
                    f"WHERE deleted_at IS NULL AND NOT paused {where} AND {_LATE_AFTER_MS_SQL} < %(lag)s",
                    {"slots": slots, "lag": lag_ms},
                )
                for r in cur:
                    names = tuple(n for n in r[7] if isinstance(n, str)) if isinstance(r[7], list) else ()
                    yield _Job(r[0], r[1], int(r[2]), r[3], r[4], _late_after_ms(r[5]), int(r[6]), names)
            finally:
                cur.close()

    def _late_rows(
        self, job: _Job, mark: int, now: int, previous: LateSpan | None
    ) -> tuple[list[HistoryRow], LateSpan | None]:
        """The row of the job's late occurrences after ``mark`` (one for the stall, counted on from
        ``previous``, what an earlier pass recorded: `cronman.model.late.late_span`), if it has anything
        new, and what the job's next pass goes on from."""
        late_after = job.late_after_ms
        end = now - late_after
        stall = max(mark, job.updated_ms - 1)  # a row goes on while its first occurrence is after this
        start = max(stall, now - LOOKBACK_MS)
        if end <= start:
            return [], previous
        try:
            span = late_span(self._due_timing(job), start, end, previous, stall_ms=stall)
        except Exception as exc:  # noqa: BLE001 - one job's schedule never stops the watchdog
            log.warning("cannot compute the occurrences of a job: %s", exc, extra={"job_id": job.id})
            return [], previous
        if span is None:
            return [], previous
        if previous is not None and (span.first_ms, span.count) == (previous.first_ms, previous.count):
            return [], span  # nothing new: counted further, the row stays as it is
        reason = (
            f"late: no scheduler took it up within {late_after // 1000} s of its due time "
            f"(its slot was last fired through {iso(mark)})"
        )
        row = HistoryRow(
            job.id,
            span.first_ms,
            0,
            0,
            execution_id(job.id, span.first_ms),
            "schedule",
            LATE,
            WATCHDOG,
            None,
            None,
            None,
            None,
            reason,
            None,
            None,
            job.incarnation,
            job.namespace,
            None,
            span.count,
            span.last_ms,
        )
        return [row], span

    # ------------------------------------------------------------------ deadlines
    async def record_deadlines(self, now: int) -> int:
        """Record the occurrences that missed their job's deadline; returns how many are new."""
        grace = int((self.s.progress_seconds + self.s.watch_seconds) * 1000)
        missed = int(await self._io(self.deadlines.pass_once, now, grace))
        if missed:
            self.on_deadline_missed(missed)
        return missed

    def _due_timing(self, job: _Job | DeadlineJob) -> Timing:
        """The job's due occurrences, as the nodes see them: its schedule with the calendars it
        names (`cronman.model.calendars.timing_with`, the one definition both use)."""
        base = self.decoder.timing(job.schedule, job.id, job.namespace)
        if not job.calendars:
            return base
        clock = time.monotonic()
        if clock - self._calendars_read >= _CALENDARS_FRESH_S:  # (versions only, unless one changed)
            self._calendars, self._calendars_read = self.store.calendars(), clock
        found = {n: c for n in job.calendars if (c := self._calendars.get((job.namespace, n))) is not None}
        return timing_with(base, job.calendars, found)


def _late_after_ms(text: str | None) -> int:
    """A job's ``late_after_seconds`` as stored (validated by the API: a whole number of seconds);
    anything else stored there counts as the default, so one row never stops the watchdog. The
    same rule as ``_LATE_AFTER_MS_SQL``."""
    if text is None or not _WHOLE.fullmatch(text) or int(text) == 0:
        return _DEFAULT_LATE_AFTER_MS
    return int(text) * 1000


_DEFAULT_LATE_AFTER_MS = OPTION_DEFAULTS.late_after_seconds * 1000
_WHOLE = re.compile(r"[0-9]{1,9}")
# (nested CASEs: PostgreSQL does not promise to test the pattern before the cast in one AND)
_LATE_AFTER_MS_SQL = (
    "(CASE WHEN options->>'late_after_seconds' ~ '^[0-9]{1,9}$' THEN "
    "CASE WHEN (options->>'late_after_seconds')::bigint > 0 THEN (options->>'late_after_seconds')::bigint * 1000 "
    f"ELSE {_DEFAULT_LATE_AFTER_MS:d} END ELSE {_DEFAULT_LATE_AFTER_MS:d} END)"
)


NOTIFICATION_CONNECTIONS_PER_HOST = 64


def watch_senders(settings: Settings, executor: Executor) -> Senders:
    """The senders notifications go through: every kind's, with the same guards as deliveries."""
    return make_senders(settings, executor, connections_per_host=NOTIFICATION_CONNECTIONS_PER_HOST)
