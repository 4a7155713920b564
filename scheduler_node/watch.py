"""The watchdog for late occurrences and the notification dispatcher.

Both run in one process of the deployment at a time: every scheduler node and every API worker
takes part, and whichever holds a PostgreSQL advisory lock (session-level, on a connection of its
own) does the work; when it dies its connection closes and another process takes over within a
pass. Neither depends on the node that should have fired, nor on Redis: when every node is down
the API's workers keep watching, and when the API is down a node does.

Watchdog. Nodes record how far they have fired each slot (``node_progress``). A slot whose mark
lags more than a job's ``late_after_seconds`` behind now has occurrences nobody took up. Which
occurrences were due is what the nodes fire by: the job's schedule with its calendars
(`cronman.calendars.timing_with`; an occurrence on an excluded day was never due, so never late).
A job's late occurrences over a stall are recorded as one row (status ``late``, attempt 0, node
``watchdog``, at the first of them, with how many and the last: `cronman.late`), written again as
the count grows; the job's health turns ``late`` until an occurrence at or after it is attempted,
an ``execution.late`` event goes to the notification rules when the row is new, and
``cronman_occurrences_late_total`` counts the new rows. A healthy cluster costs one small query per
pass; during an outage, each pass reads the jobs of the stalled slots (all of them when no node
fires), streamed and their late rows written a batch at a time, and remembers how far it counted
for the jobs that had late occurrences.

Dispatcher. Events recorded by the history writers and the watchdog are matched against the
rules (namespace, kinds, label selector), summarised per rule, job and kind (one notification per
``min_interval_seconds`` at most, with a count) and put in the outbox, in one transaction that
also deletes the events. The outbox is sent from here, at least once: a notification is marked
sent only after its target accepted it, and is retried with backoff otherwise (the same event id
each time). HTTP targets go through the callback guard, queues through the queue guard, exactly
as deliveries do, and are signed with the namespace's secret.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from psycopg2.extras import Json, execute_values
from sqlalchemy import Engine, text

from cronman import signing
from cronman.calendars import Calendar, timing_with
from cronman.errors import TransientError
from cronman.execution import execution_id
from cronman.health import LATE, WATCHDOG
from cronman.labels import parse_selector
from cronman.late import LateSpan, late_span
from cronman.notifications import Emit, Summary, body, new_event_id, on_event, on_tick
from cronman.schedule import Timing
from cronman.settings import Settings
from cronman.timeutil import iso
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import Decoder
from scheduler_node.parts import Delivery, Outcome
from scheduler_node.senders import Senders
from scheduler_node.store import PgNodeStore

log = logging.getLogger("cronman.watch")

LOCK_KEY = 0x63726F6E6D616E  # "cronman": the advisory lock of the watch
LOOKBACK_MS = 86_400_000  # the watchdog looks at most this far back (as far as a node catches up)
_CALENDARS_FRESH_S = 1.0  # calendars read again at most this often (only their versions, unless changed)
MAX_ATTEMPTS = 25  # a notification is retried this often (backoff up to 5 min: about 1.5 h)
_EVENTS_PER_PASS = 2000
_SENDS_PER_PASS = 500
_BATCH = 5000  # jobs read, and late rows written, a round trip


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
        self._decoder = Decoder(lambda doc: doc)  # type: ignore[arg-type,return-value]

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        except TransientError:
            raise
        except Exception as exc:
            from scheduler_node.store import _UNAVAILABLE

            if isinstance(exc, _UNAVAILABLE):
                raise TransientError(f"database: {type(exc).__name__}: {str(exc).strip()[:200]}") from exc
            raise

    # ------------------------------------------------------------------ leading
    async def run(self) -> None:
        await self.senders.start()
        try:
            while True:
                try:
                    if await self._io(self._lead):
                        await self.pass_once()
                except TransientError as exc:
                    log.warning("watch pass failed: %s", exc)
                except Exception:  # noqa: BLE001 - the next pass tries again
                    log.exception("watch pass failed")
                await asyncio.sleep(self.s.watch_seconds)
        finally:
            self._ended.set()
            self._release()
            await self.senders.close()

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

    async def pass_once(self) -> None:
        fresh = await self.record_late(self.now_ms())
        if fresh:
            self.on_late(fresh)
            log.warning("occurrences late: nobody took them up in time", extra={"count": fresh})
        await self._io(self.summarise, self.now_ms())
        await self.send_outbox()

    # ------------------------------------------------------------------ the watchdog
    async def record_late(self, now: int) -> int:
        """Record the occurrences nobody took up in time; returns how many rows are new."""
        # how far each slot was fired, claims lost with Redis's data or not: those are owed, not late
        _, cluster_mark, marks = await self.store.slot_marks()
        if cluster_mark is None:
            return 0  # no node has ever run: nothing was owed yet
        slack = int((self.s.progress_seconds + self.s.watch_seconds) * 1000)
        behind = now - slack - 5000  # (5 s: the least late_after_seconds)
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
        ``previous``, what an earlier pass recorded: `cronman.late.late_span`), if it has anything
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

    def _due_timing(self, job: _Job) -> Timing:
        """The job's due occurrences, as the nodes see them: its schedule with the calendars it
        names (`cronman.calendars.timing_with`, the one definition both use)."""
        base = self._decoder.timing(job.schedule, job.id, job.namespace)
        if not job.calendars:
            return base
        clock = time.monotonic()
        if clock - self._calendars_read >= _CALENDARS_FRESH_S:  # (versions only, unless one changed)
            self._calendars, self._calendars_read = self.store.calendars(), clock
        found = {n: c for n in job.calendars if (c := self._calendars.get((job.namespace, n))) is not None}
        return timing_with(base, job.calendars, found)

    # ------------------------------------------------------------------ summarising events
    def summarise(self, now: int) -> int:
        """Match new events against the rules, summarise, fill the outbox (one transaction);
        returns how many notifications were queued."""
        queued = 0
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(
                "SELECT id, namespace, job_id, event, floor(extract(epoch from at) * 1000)::bigint, detail "
                "FROM notification_events ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                (_EVENTS_PER_PASS,),
            )
            events = cur.fetchall()
            outbox: list[tuple[Any, ...]] = []
            states: dict[tuple[str, str, str, str], Summary] = {}
            if events:
                rules = self._rules(cur, sorted({e[1] for e in events}))
                labels = self._labels(cur, sorted({e[2] for e in events}))
                keys = {
                    (ns, r["name"], job, kind)
                    for _, ns, job, kind, _, _ in events
                    for r in rules.get(ns, [])
                    if kind in r["events"] and r["match"](labels.get(job, {}))
                }
                states = self._states(cur, keys)
                by_rule = {(ns, r["name"]): r for ns, rs in rules.items() for r in rs}
                for _, ns, job, kind, at, detail in events:
                    for r in rules.get(ns, []):
                        key = (ns, r["name"], job, kind)
                        if key not in keys:
                            continue
                        state, emit = on_event(states[key], int(at), detail or {}, now, r["interval_ms"])
                        states[key] = state
                        if emit is not None:
                            outbox.append(self._outbox_row(key, emit, by_rule[(ns, r["name"])]["target"]))
                cur.execute("DELETE FROM notification_events WHERE id = ANY(%s)", ([e[0] for e in events],))
            for key, state, emit, target in self._due(cur, now):
                if key in states:
                    continue  # an event of this very pass has sent (or counted) it already
                states[key] = state
                outbox.append(self._outbox_row(key, emit, target))
            if states:
                execute_values(
                    cur,
                    "INSERT INTO notification_state AS s (namespace, rule, job_id, event, last_sent_at, pending, "
                    "pending_first_at, pending_detail) SELECT v.ns, v.rule, v.job, v.ev, "
                    "timestamptz 'epoch' + v.sent * interval '1 millisecond', v.pending, "
                    "timestamptz 'epoch' + v.first * interval '1 millisecond', v.detail "
                    "FROM (VALUES %s) AS v(ns, rule, job, ev, sent, pending, first, detail) "
                    "ON CONFLICT (namespace, rule, job_id, event) DO UPDATE SET last_sent_at = excluded.last_sent_at, "
                    "pending = excluded.pending, pending_first_at = excluded.pending_first_at, "
                    "pending_detail = excluded.pending_detail",
                    [
                        (*k, st.last_sent_ms, st.pending, st.pending_first_ms, Json(st.pending_detail))
                        for k, st in states.items()
                    ],
                    template="(%s, %s, %s, %s, %s::bigint, %s::int, %s::bigint, %s::jsonb)",
                )
            if outbox:
                execute_values(
                    cur,
                    "INSERT INTO notification_outbox (event_id, namespace, rule, job_id, event, body, target) "
                    "VALUES %s ON CONFLICT (event_id) DO NOTHING",
                    outbox,
                    template="(%s::uuid, %s, %s, %s, %s, %s, %s::jsonb)",
                )
                queued = len(outbox)
            cur.close()
            raw.commit()
        except Exception:
            raw.rollback()
            raise
        finally:
            raw.close()
        return queued

    @staticmethod
    def _rules(cur: Any, namespaces: list[str]) -> dict[str, list[dict[str, Any]]]:
        cur.execute(
            "SELECT namespace, name, events, selector, target, min_interval_seconds FROM notification_rules "
            "WHERE namespace = ANY(%s)",
            (namespaces,),
        )
        out: dict[str, list[dict[str, Any]]] = {}
        for ns, name, events, selector, target, interval in cur.fetchall():
            try:
                match = parse_selector(selector).matches
            except Exception:  # noqa: BLE001 - stored rules were validated; a bad one matches nothing
                continue
            out.setdefault(ns, []).append(
                {"name": name, "events": set(events), "match": match, "target": target, "interval_ms": interval * 1000}
            )
        return out

    @staticmethod
    def _labels(cur: Any, job_ids: list[str]) -> dict[str, dict[str, str]]:
        cur.execute("SELECT id, labels FROM jobs WHERE id = ANY(%s) AND deleted_at IS NULL", (job_ids,))
        return {r[0]: r[1] or {} for r in cur.fetchall()}

    @staticmethod
    def _states(cur: Any, keys: set[tuple[str, str, str, str]]) -> dict[tuple[str, str, str, str], Summary]:
        out = {k: Summary() for k in keys}
        if not keys:
            return out
        ordered = sorted(keys)
        cur.execute(
            "SELECT s.namespace, s.rule, s.job_id, s.event, floor(extract(epoch from s.last_sent_at) * 1000)::bigint, "
            "s.pending, floor(extract(epoch from s.pending_first_at) * 1000)::bigint, s.pending_detail "
            "FROM notification_state s JOIN unnest(%s::text[], %s::text[], %s::text[], %s::text[]) "
            "AS w(ns, rule, job, ev) ON (s.namespace, s.rule, s.job_id, s.event) = (w.ns, w.rule, w.job, w.ev) "
            "FOR UPDATE OF s",
            tuple([k[i] for k in ordered] for i in range(4)),
        )
        for ns, rule, job, ev, sent, pending, first, detail in cur.fetchall():
            out[(ns, rule, job, ev)] = Summary(
                None if sent is None else int(sent), int(pending), None if first is None else int(first), detail
            )
        return out

    @staticmethod
    def _due(cur: Any, now: int) -> list[tuple[tuple[str, str, str, str], Summary, Emit, dict[str, Any]]]:
        """Summaries whose interval is over with events counted meanwhile."""
        cur.execute(
            "SELECT s.namespace, s.rule, s.job_id, s.event, floor(extract(epoch from s.last_sent_at) * 1000)::bigint, "
            "s.pending, floor(extract(epoch from s.pending_first_at) * 1000)::bigint, s.pending_detail, "
            "r.min_interval_seconds, r.target FROM notification_state s JOIN notification_rules r "
            "ON r.namespace = s.namespace AND r.name = s.rule WHERE s.pending > 0 "
            "AND s.last_sent_at <= timestamptz 'epoch' "
            "+ (%s - r.min_interval_seconds * 1000) * interval '1 millisecond' "
            "LIMIT 1000 FOR UPDATE OF s SKIP LOCKED",
            (now,),
        )
        out = []
        for ns, rule, job, ev, sent, pending, first, detail, interval, target in cur.fetchall():
            state = Summary(int(sent), int(pending), None if first is None else int(first), detail)
            new, emit = on_tick(state, now, interval * 1000)
            if emit is not None:
                out.append(((ns, rule, job, ev), new, emit, target))
        return out

    @staticmethod
    def _outbox_row(key: tuple[str, str, str, str], emit: Emit, target: dict[str, Any]) -> tuple[Any, ...]:
        ns, rule, job, kind = key
        event_id = new_event_id()
        return (event_id, ns, rule, job, kind, body(event_id, kind, ns, rule, job, emit).decode(), Json(target))

    # ------------------------------------------------------------------ sending
    async def send_outbox(self) -> int:
        due = await self._io(self._due_sends)
        if not due:
            return 0
        secrets = (await self.store.cluster_config()).secrets
        now = self.now_ms()
        futures: list[asyncio.Future[Outcome]] = []
        for _, event_id, ns, rule, job, kind, text_body, target, attempts in due:
            data = text_body.encode()
            meta = (
                ("Cronman-Event-Id", event_id),
                ("Cronman-Event", kind),
                ("Cronman-Notification", rule),
                ("Cronman-Namespace", ns),
                ("Cronman-Job-Id", job),
                ("Cronman-Attempt", str(attempts + 1)),
            )
            keys = secrets.get(ns)
            signature = signing.sign(keys, data, now // 1000, signing.Context.NOTIFICATION) if keys else None
            delivery = Delivery(
                job, event_id, iso(now), attempts + 1, data, signature=signature, namespace=ns, meta=meta
            )
            try:
                doc = {
                    **target,
                    "timeout_seconds": min(
                        float(target.get("timeout_seconds", 10)), self.s.notification_timeout_seconds
                    ),
                }
                futures.append(self.senders.submit(self.senders.decode(doc), delivery))
            except Exception as exc:  # noqa: BLE001 - a target that cannot be sent to is this attempt's failure
                failed: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
                failed.set_result(Outcome(False, None, f"cannot send: {exc}"))
                futures.append(failed)
        outcomes = await asyncio.gather(*futures)
        results = [(row[0], row[8], o) for row, o in zip(due, outcomes, strict=True)]
        await self._io(self._mark_sent, results)
        for _, _, o in results:
            self.on_sent("sent" if o.ok else "failed")
        return sum(1 for _, _, o in results if o.ok)

    def _due_sends(self) -> list[tuple[Any, ...]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, event_id::text, namespace, rule, job_id, event, body, target, attempts "
                    "FROM notification_outbox WHERE sent_at IS NULL AND given_up_at IS NULL "
                    "AND next_attempt_at <= now() ORDER BY id LIMIT :n"
                ),
                {"n": _SENDS_PER_PASS},
            )
            return [tuple(r) for r in rows]

    def _mark_sent(self, results: list[tuple[int, int, Outcome]]) -> None:
        with self.engine.begin() as conn:
            sent = [i for i, _, o in results if o.ok]
            if sent:
                conn.execute(
                    text(
                        "UPDATE notification_outbox SET sent_at = now(), attempts = attempts + 1 WHERE id = ANY(:ids)"
                    ),
                    {"ids": sent},
                )
            for i, attempts, o in results:
                if o.ok:
                    continue
                delay = min(2 ** min(attempts, 10), 300)
                error = (o.error or "failed")[:500]
                log.warning("a notification could not be sent: %s", error, extra={"outbox_id": i})
                conn.execute(
                    text(
                        "UPDATE notification_outbox SET attempts = attempts + 1, last_error = :e, "
                        "next_attempt_at = now() + :d * interval '1 second', "
                        "given_up_at = CASE WHEN attempts + 1 >= :max THEN now() END WHERE id = :id"
                    ),
                    {"e": error, "d": delay, "max": MAX_ATTEMPTS, "id": i},
                )


def _late_after_ms(text: str | None) -> int:
    """A job's ``late_after_seconds`` as stored (validated by the API: a whole number of seconds);
    anything else stored there counts as the default, so one row never stops the watchdog. The
    same rule as ``_LATE_AFTER_MS_SQL``."""
    if text is None or not _WHOLE.fullmatch(text) or int(text) == 0:
        return 60_000
    return int(text) * 1000


_WHOLE = re.compile(r"[0-9]{1,9}")
# (nested CASEs: PostgreSQL does not promise to test the pattern before the cast in one AND)
_LATE_AFTER_MS_SQL = (
    "(CASE WHEN options->>'late_after_seconds' ~ '^[0-9]{1,9}$' THEN "
    "CASE WHEN (options->>'late_after_seconds')::bigint > 0 THEN (options->>'late_after_seconds')::bigint * 1000 "
    "ELSE 60000 END ELSE 60000 END)"
)


def watch_senders(settings: Settings, executor: Executor) -> Senders:
    """The senders notifications go through: the same guards as deliveries."""
    from scheduler_node.senders.http import HttpSender
    from scheduler_node.senders.sqs import SqsSender
    from scheduler_node.wiring import _queue_refusal

    return Senders(
        [
            HttpSender(64, dev_mode=settings.dev_mode, allowlist=settings.callback_allowlist),
            SqsSender(settings.sqs_endpoint_url, settings.sqs_region, executor, _queue_refusal(settings)),
        ]
    )
