"""The notification dispatcher, as two parts of the watch (scheduler_node.watch) that never wait
for each other or for the watchdog:

Summariser: events to summaries and the outbox. Namespaces take turns (round robin, from where the
last pass stopped); a turn takes at most ``EVENTS_PER_TURN`` of the namespace's events, fewer the
more rules it has, so that events x rules never passes ``FANOUT_PER_TURN``; the events of one job
and kind in a turn are counted together in PostgreSQL (one row each, whatever their number); each
turn is a transaction of its own, and a pass stops after ``FANOUT_PER_PASS`` summaries touched. A
rule sends at most ``CRONMAN_NOTIFICATION_RULE_PER_MINUTE`` notifications a minute: the rest stay
counted in their summaries and go out, summarised, in its next minutes.

OutboxSender: the outbox to targets. Namespaces take turns here too; each send is a task of its
own, so a slow target holds only its own sends: a target has at most
``CRONMAN_NOTIFICATION_TARGET_CONCURRENCY`` sends in flight, each within
``CRONMAN_NOTIFICATION_TIMEOUT_SECONDS``, and one that fails or times out backs off (2 s, doubling
to 5 min) while the others go on. A notification taken for sending is leased (its next attempt set
a timeout and 30 s ahead), so a leader that dies leaves it to the next one. The target is the
rule's as it is now: a rule retargeted sends what it still had to send to its new target, and a
deleted rule's notifications are dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from psycopg2.extras import Json, execute_values
from sqlalchemy import Engine

from cronman.model import signing
from cronman.model.labels import parse_selector
from cronman.model.timeutil import iso
from cronman.settings import Settings
from cronman.store.notifications import Emit, RuleBudget, Summary, body, new_event_id, on_events, on_tick
from scheduler_node.parts import Delivery, Outcome
from scheduler_node.senders import Senders

log = logging.getLogger("cronman.notify")

EVENTS_PER_TURN = 5000  # a namespace's events one turn takes at most
FANOUT_PER_TURN = 5000  # (rule, job, kind) summaries one turn touches at most
FANOUT_PER_PASS = 20_000
DUE_PER_TURN = 500  # summaries whose interval ended, sent in one turn at most
MAX_ATTEMPTS = 25  # a notification is tried this often (backoff up to 5 min: about 1.5 h)
SENDS_IN_FLIGHT = 256  # the leader's sends out at once, all targets together
FETCH_PER_NAMESPACE = 64  # notifications one namespace's turn starts at most
LEASE_EXTRA_S = 30  # a notification being sent is leased for its timeout and this

Key = tuple[str, str, str, str]  # namespace, rule, job id, event kind


def _namespaces_with(table: str, where: str) -> str:
    """The distinct namespaces of ``table`` rows matching ``where``, one index probe each (a
    loose index scan: however many rows a namespace has)."""
    cond = f"AND {where}" if where else ""
    first_where = f"WHERE {where}" if where else ""
    return (
        f"WITH RECURSIVE n AS ((SELECT namespace FROM {table} {first_where} ORDER BY namespace LIMIT 1) UNION ALL "
        f"SELECT (SELECT namespace FROM {table} WHERE namespace > n.namespace {cond} ORDER BY namespace LIMIT 1) "
        "FROM n WHERE n.namespace IS NOT NULL) SELECT namespace FROM n WHERE namespace IS NOT NULL"
    )


_EVENT_NAMESPACES = _namespaces_with("notification_events", "")
_PENDING_NAMESPACES = _namespaces_with("notification_state", "pending > 0")
_OUTBOX_NAMESPACES = _namespaces_with("notification_outbox", "sent_at IS NULL AND given_up_at IS NULL")


def in_turn(namespaces: Iterable[str], after: str | None) -> list[str]:
    """``namespaces`` in order, starting after ``after`` (round robin across passes)."""
    ordered = sorted(set(namespaces))
    if after is None:
        return ordered
    return [n for n in ordered if n > after] + [n for n in ordered if n <= after]


# The events of a turn, deleted as they are taken, counted per job and kind.
_TAKE_EVENTS = """
WITH taken AS (
    DELETE FROM notification_events WHERE id IN (
        SELECT id FROM notification_events WHERE namespace = %(ns)s ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
    RETURNING id, job_id, event, at, detail)
SELECT job_id, event, count(*), floor(extract(epoch from min(at)) * 1000)::bigint,
    floor(extract(epoch from max(at)) * 1000)::bigint, (array_agg(detail ORDER BY id DESC))[1]
FROM taken GROUP BY job_id, event
"""

_DUE = """
SELECT s.rule, s.job_id, s.event, floor(extract(epoch from s.last_sent_at) * 1000)::bigint, s.pending,
    floor(extract(epoch from s.pending_first_at) * 1000)::bigint, s.pending_detail, r.min_interval_seconds
FROM notification_state s JOIN notification_rules r ON r.namespace = s.namespace AND r.name = s.rule
WHERE s.namespace = %(ns)s AND s.pending > 0 AND NOT (s.rule = ANY(%(spent)s))
    AND s.last_sent_at <= timestamptz 'epoch' + (%(now)s - r.min_interval_seconds * 1000) * interval '1 millisecond'
ORDER BY s.last_sent_at LIMIT %(n)s FOR UPDATE OF s SKIP LOCKED
"""


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    events: frozenset[str]
    match: Callable[[dict[str, str]], bool]
    target: dict[str, Any]
    interval_ms: int


class Summariser:
    def __init__(self, engine: Engine, budget: RuleBudget) -> None:
        self.engine = engine
        self.budget = budget
        self._after: str | None = None  # the namespace whose turn came last
        self.touched = 0  # summaries the last pass touched (its memory's measure)

    def pass_once(self, now: int) -> tuple[int, bool]:
        """Blocking. Namespaces take turns until the pass's fan-out is spent; returns the
        notifications queued and whether work was left for the next pass."""
        queued = touched = 0
        left = False
        for ns in in_turn(self._namespaces(), self._after):
            if touched >= FANOUT_PER_PASS:
                left = True
                break
            q, t, more = self._turn(ns, now, min(FANOUT_PER_TURN, FANOUT_PER_PASS - touched))
            queued, touched, left = queued + q, touched + t, left or more
            self._after = ns
        self.touched = touched
        return queued, left

    def _namespaces(self) -> list[str]:
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(_EVENT_NAMESPACES)
            found = {r[0] for r in cur.fetchall()}
            cur.execute(_PENDING_NAMESPACES)
            found.update(r[0] for r in cur.fetchall())
            raw.commit()
            return sorted(found)
        finally:
            raw.close()

    def _turn(self, ns: str, now: int, fanout: int) -> tuple[int, int, bool]:
        """One namespace's turn, one transaction: (queued, summaries touched, events left)."""
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            rules = _rules(cur, ns)
            n = max(1, min(EVENTS_PER_TURN, fanout // max(1, len(rules))))
            cur.execute(_TAKE_EVENTS, {"ns": ns, "n": n})
            groups = cur.fetchall()
            more = sum(g[2] for g in groups) >= n
            states: dict[Key, Summary] = {}
            outbox: list[tuple[Any, ...]] = []
            if groups and rules:
                labels = _labels(cur, ns, sorted({g[0] for g in groups}))
                matched = [(r, g) for g in groups for r in rules if g[1] in r.events and r.match(labels.get(g[0], {}))]
                states = _states(cur, {(ns, r.name, g[0], g[1]) for r, g in matched})
                for r, (job, kind, count, first, last, detail) in matched:
                    key = (ns, r.name, job, kind)
                    may = self.budget.left(ns, r.name, now) > 0
                    state, emit = on_events(
                        states[key], int(count), int(first), int(last), detail or {}, now, r.interval_ms, may_send=may
                    )
                    states[key] = state
                    if emit is not None and self.budget.take(ns, r.name, now):
                        outbox.append(_outbox_row(key, emit, r.target))
            for key, state, emit, target in self._due(cur, ns, now, {r.name: r for r in rules}):
                if key in states:
                    continue  # an event of this very turn has sent (or counted) it already
                states[key] = state
                outbox.append(_outbox_row(key, emit, target))
            _write(cur, states, outbox)
            cur.close()
            raw.commit()
            return len(outbox), len(states), more
        except Exception:
            raw.rollback()
            raise
        finally:
            raw.close()

    def _due(
        self, cur: Any, ns: str, now: int, rules: dict[str, _Rule]
    ) -> list[tuple[Key, Summary, Emit, dict[str, Any]]]:
        """The namespace's summaries whose interval is over with events counted meanwhile, as far
        as their rules may send this minute."""
        cur.execute(_DUE, {"ns": ns, "spent": self.budget.spent(ns, now), "now": now, "n": DUE_PER_TURN})
        out = []
        for rule, job, ev, sent, pending, first, detail, interval in cur.fetchall():
            r = rules.get(rule)
            if r is None or not self.budget.left(ns, rule, now):
                continue
            state = Summary(int(sent), int(pending), None if first is None else int(first), detail)
            new, emit = on_tick(state, now, interval * 1000)
            if emit is not None and self.budget.take(ns, rule, now):
                out.append(((ns, rule, job, ev), new, emit, r.target))
        return out


def _rules(cur: Any, ns: str) -> list[_Rule]:
    cur.execute(
        "SELECT name, events, selector, target, min_interval_seconds FROM notification_rules WHERE namespace = %s",
        (ns,),
    )
    out = []
    for name, events, selector, target, interval in cur.fetchall():
        try:
            match = parse_selector(selector).matches
        except Exception:  # noqa: BLE001 - stored rules were validated; a bad one matches nothing
            continue
        out.append(_Rule(name, frozenset(events), match, target, interval * 1000))
    return out


def _labels(cur: Any, ns: str, job_ids: list[str]) -> dict[str, dict[str, str]]:
    cur.execute(
        "SELECT id, labels FROM jobs WHERE id = ANY(%s) AND namespace = %s AND deleted_at IS NULL", (job_ids, ns)
    )
    return {r[0]: r[1] or {} for r in cur.fetchall()}


def _states(cur: Any, keys: set[Key]) -> dict[Key, Summary]:
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


def _write(cur: Any, states: dict[Key, Summary], outbox: list[tuple[Any, ...]]) -> None:
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


def _outbox_row(key: Key, emit: Emit, target: dict[str, Any]) -> tuple[Any, ...]:
    ns, rule, job, kind = key
    event_id = new_event_id()
    return (event_id, ns, rule, job, kind, body(event_id, kind, ns, rule, job, emit).decode(), Json(target))


# ---------------------------------------------------------------------------------- sending
def target_key(target: dict[str, Any]) -> str:
    """What a target is, for its concurrency and backoff: its URL, or its queue."""
    return str(target.get("url") or target.get("queue_url") or "")


@dataclass
class _TargetState:
    in_flight: int = 0
    failures: int = 0
    resume_at: float = 0.0  # loop time; backing off until then


@dataclass(frozen=True, slots=True)
class _Due:
    id: int
    event_id: str
    namespace: str
    rule: str
    job_id: str
    event: str
    body: str
    attempts: int
    target: dict[str, Any]


# Due notifications of one namespace, each with its rule's target as it is now, at most
# ``per_target`` of each target and none of the targets given (backing off, or at their limit).
_FETCH = """
SELECT id, event_id, namespace, rule, job_id, event, body, attempts, target FROM (
    SELECT c.*, row_number() OVER (PARTITION BY coalesce(c.target->>'url', c.target->>'queue_url', '')
        ORDER BY c.next_attempt_at, c.id) AS k
    FROM (
        SELECT o.id, o.event_id::text, o.namespace, o.rule, o.job_id, o.event, o.body, o.attempts, r.target,
            o.next_attempt_at
        FROM notification_outbox o
        LEFT JOIN notification_rules r ON r.namespace = o.namespace AND r.name = o.rule
        WHERE o.namespace = %(ns)s AND o.sent_at IS NULL AND o.given_up_at IS NULL AND o.next_attempt_at <= now()
            AND NOT (coalesce(r.target->>'url', r.target->>'queue_url', '') = ANY(%(blocked)s))
        ORDER BY o.next_attempt_at LIMIT 1000
    ) c
) w WHERE k <= %(per_target)s ORDER BY next_attempt_at, id LIMIT %(n)s
"""
# Taken for sending: leased (a row another leader took meanwhile is not taken again).
_LEASE = """
UPDATE notification_outbox SET next_attempt_at = now() + %(s)s * interval '1 second'
WHERE id = ANY(%(ids)s) AND sent_at IS NULL AND given_up_at IS NULL AND next_attempt_at <= now() RETURNING id
"""
_ORPHANED = """
UPDATE notification_outbox SET given_up_at = now(), last_error = 'the notification rule was deleted'
WHERE id = ANY(%s) AND sent_at IS NULL
"""
_SECRETS = """
SELECT namespace, secret, created_at > now() - interval '1 day' FROM signing_secrets
WHERE namespace = ANY(%s) ORDER BY namespace, created_at DESC, id DESC
"""


class OutboxSender:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        senders: Senders,
        io: Callable[..., Any],
        *,
        on_sent: Callable[[str], None] = lambda result: None,
        clock: Callable[[], float],
    ) -> None:
        self.s = settings
        self.engine = engine
        self.senders = senders
        self.io = io  # runs a blocking call in the watch's executor
        self.on_sent = on_sent
        self.clock = clock
        self.per_target = settings.notification_target_concurrency
        self.targets: dict[tuple[str, str], _TargetState] = {}
        self.sending: set[asyncio.Task[None]] = set()
        self.finished: list[tuple[int, int, Outcome]] = []
        self.wake = asyncio.Event()
        self._after: str | None = None

    # -- taking what is due
    async def pump(self) -> int:
        """Start the due notifications there is room for; returns how many started."""
        room = SENDS_IN_FLIGHT - len(self.sending)
        if room <= 0:
            return 0
        loop = asyncio.get_running_loop()
        now = loop.time()
        blocked: dict[str, list[str]] = {}
        for (ns, key), t in self.targets.items():
            if t.resume_at > now or t.in_flight >= self.per_target:
                blocked.setdefault(ns, []).append(key)
        taken, secrets = await self.io(self._take, blocked, room)
        back: list[int] = []
        for row in taken:
            state = self.targets.setdefault((row.namespace, target_key(row.target)), _TargetState())
            if state.in_flight >= self.per_target or state.resume_at > now:
                back.append(row.id)  # (its target filled up with others taken in this call)
                continue
            state.in_flight += 1
            task = loop.create_task(self._send(row, state, secrets.get(row.namespace)))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)
        if back:
            await self.io(self._give_back, back)
        self._forget_idle(now)
        return len(taken) - len(back)

    def _take(self, blocked: dict[str, list[str]], room: int) -> tuple[list[_Due], dict[str, tuple[str, ...]]]:
        """Blocking: lease up to ``room`` due notifications, namespaces taking turns."""
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(_OUTBOX_NAMESPACES)
            out: list[_Due] = []
            for ns in in_turn((r[0] for r in cur.fetchall()), self._after):
                if len(out) >= room:
                    break
                n = min(FETCH_PER_NAMESPACE, room - len(out))
                params = {"ns": ns, "blocked": blocked.get(ns, []), "per_target": self.per_target, "n": n}
                cur.execute(_FETCH, params)
                rows = [_Due(*r) for r in cur.fetchall()]
                orphans = [r.id for r in rows if r.target is None]
                if orphans:
                    cur.execute(_ORPHANED, (orphans,))
                ids = [r.id for r in rows if r.target is not None]
                if ids:
                    cur.execute(_LEASE, {"s": self.s.notification_timeout_seconds + LEASE_EXTRA_S, "ids": ids})
                    leased = {r[0] for r in cur.fetchall()}
                    out.extend(r for r in rows if r.id in leased)
                self._after = ns
            secrets = _secrets(cur, sorted({r.namespace for r in out})) if out else {}
            cur.close()
            raw.commit()
            return out, secrets
        except Exception:
            raw.rollback()
            raise
        finally:
            raw.close()

    def _give_back(self, ids: list[int]) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE notification_outbox SET next_attempt_at = now() WHERE id = ANY(%s)", (ids,))

    def _forget_idle(self, loop_now: float) -> None:
        if len(self.targets) > 4 * SENDS_IN_FLIGHT:
            for k in [k for k, t in self.targets.items() if not t.in_flight and t.resume_at <= loop_now]:
                del self.targets[k]

    # -- one send
    async def _send(self, row: _Due, state: _TargetState, keys: tuple[str, ...] | None) -> None:
        timeout = min(float(row.target.get("timeout_seconds", 10)), self.s.notification_timeout_seconds)
        try:
            outcome = await asyncio.wait_for(self._submit(row, timeout, keys), timeout + 5)
        except TimeoutError:
            outcome = Outcome(False, None, f"no answer within {timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - a notification's failure is its attempt's, never the loop's
            outcome = Outcome(False, None, f"cannot send: {type(exc).__name__}: {exc}"[:500])
        finally:
            state.in_flight -= 1
        if outcome.ok:
            state.failures = 0
        else:  # (sends that fail together, before the target backs off, count once)
            now = asyncio.get_running_loop().time()
            if state.resume_at <= now:
                state.failures += 1
                state.resume_at = now + min(2 ** min(state.failures, 9), 300)
        self.finished.append((row.id, row.attempts, outcome))
        self.wake.set()

    def _submit(self, row: _Due, timeout: float, keys: tuple[str, ...] | None) -> asyncio.Future[Outcome]:
        now = int(self.clock() * 1000)
        data = row.body.encode()
        meta = (
            ("Cronman-Event-Id", row.event_id),
            ("Cronman-Event", row.event),
            ("Cronman-Notification", row.rule),
            ("Cronman-Namespace", row.namespace),
            ("Cronman-Job-Id", row.job_id),
            ("Cronman-Attempt", str(row.attempts + 1)),
        )
        signature = signing.sign(keys, data, now // 1000, signing.Context.NOTIFICATION) if keys else None
        delivery = Delivery(
            row.job_id, row.event_id, iso(now), row.attempts + 1, data, signature=signature,
            namespace=row.namespace, meta=meta,
        )  # fmt: skip
        return self.senders.submit(self.senders.decode({**row.target, "timeout_seconds": timeout}), delivery)

    # -- recording what happened
    async def flush(self) -> None:
        if not self.finished:
            return
        done, self.finished = self.finished, []
        try:
            await self.io(self._mark, done)
        except Exception:
            self.finished[:0] = done  # tried again at the next flush (the leases cover them meanwhile)
            raise
        for _, _, o in done:
            self.on_sent("sent" if o.ok else "failed")

    def _mark(self, results: list[tuple[int, int, Outcome]]) -> None:
        with self.engine.begin() as conn:
            sent = [i for i, _, o in results if o.ok]
            if sent:
                conn.exec_driver_sql(
                    "UPDATE notification_outbox SET sent_at = now(), attempts = attempts + 1 WHERE id = ANY(%s)",
                    (sent,),
                )
            for i, attempts, o in results:
                if o.ok:
                    continue
                delay = min(2 ** min(attempts, 10), 300)
                error = (o.error or "failed")[:500]
                log.warning("a notification could not be sent: %s", error, extra={"outbox_id": i})
                conn.exec_driver_sql(
                    "UPDATE notification_outbox SET attempts = attempts + 1, last_error = %s, "
                    "next_attempt_at = now() + %s * interval '1 second', "
                    "given_up_at = CASE WHEN attempts + 1 >= %s THEN now() END WHERE id = %s AND sent_at IS NULL",
                    (error, delay, MAX_ATTEMPTS, i),
                )

    async def settle(self, timeout: float) -> None:
        """Let the sends in flight end (the watch stops), and record them."""
        if self.sending:
            await asyncio.wait(set(self.sending), timeout=timeout)
        await self.flush()


def _secrets(cur: Any, namespaces: list[str]) -> dict[str, tuple[str, ...]]:
    """The namespaces' signing secrets, newest first (the previous one for a day after a rotation)."""
    cur.execute(_SECRETS, (namespaces,))
    out: dict[str, list[str]] = {}
    newest_recent: dict[str, bool] = {}
    for namespace, secret, recent in cur.fetchall():
        have = out.setdefault(namespace, [])
        if not have:
            have.append(secret)
            newest_recent[namespace] = bool(recent)
        elif len(have) == 1 and newest_recent[namespace]:
            have.append(secret)
    return {k: tuple(v) for k, v in out.items()}
