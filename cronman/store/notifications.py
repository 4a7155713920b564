"""Notifications: named rules per namespace that say which events of which jobs go where.

A rule (``PUT /v1/notifications/{name}``) names event kinds, a label selector and a target (an
HTTP URL, signed in a context of its own, or an SQS queue) and ``min_interval_seconds``. Events are recorded
by whoever sees them happen, in the transaction that records what happened (the nodes' history
writers: failures, recoveries, auto-pauses; the watchdog: late occurrences, missed deadlines); the dispatcher
(:mod:`scheduler_node.watch`) matches them against the rules, summarises bursts and sends from a
durable outbox, at least once, each notification under a stable event id.

Summaries: per rule, job and event kind, at most one notification per interval. The events that
come after a quiet interval go out at once (those the dispatcher takes together, as one: count N);
later ones within the interval are counted and go out as one notification when the interval ends
(count N, ``first_at`` to ``at``). And per rule, at most ``CRONMAN_NOTIFICATION_RULE_PER_MINUTE``
notifications a minute, whatever the jobs: what is over waits in its summary, counted.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from sqlalchemy import Connection, Engine, and_, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cronman.errors import InvalidInput, NotFound, QuotaExceeded
from cronman.model.labels import MAX_SELECTOR, parse_selector
from cronman.model.spec import THROTTLE_NAME_PATTERN, Target, _Model, invalid_input
from cronman.model.targets import check_target_queues, check_target_urls
from cronman.model.timeutil import iso
from cronman.settings import Settings
from cronman.store.db import notification_rules

NAME_PATTERN = THROTTLE_NAME_PATTERN
NAME_RE = re.compile(NAME_PATTERN)
MAX_INTERVAL_SECONDS = 86400


class EventKind(enum.StrEnum):
    EXECUTION_FAILED = "execution.failed"  # an attempt failed (a retry may follow)
    EXECUTION_PERMANENTLY_FAILED = "execution.permanently_failed"
    EXECUTION_LATE = "execution.late"  # an occurrence nobody took up within late_after_seconds
    EXECUTION_DEADLINE_MISSED = "execution.deadline_missed"  # an occurrence not succeeded within deadline_seconds
    JOB_AUTO_PAUSED = "job.auto_paused"
    JOB_RECOVERED = "job.recovered"  # the first success after permanently failed executions


class NotificationSpec(_Model):
    """A notification rule as written by a user (PUT body)."""

    events: list[EventKind] = Field(min_length=1, max_length=len(EventKind), description="The event kinds to send.")
    selector: str = Field(
        "",
        max_length=MAX_SELECTOR,
        description="A label selector (as in GET /v1/jobs?selector=): the jobs whose events are sent. Empty: every "
        "job of the namespace.",
        examples=["team=payments"],
    )
    target: Target = Field(
        description="Where notifications go: an HTTP endpoint (POST, signed with the namespace's secret in "
        "Cronman-Notification-Signature, never valid as a delivery's signature) or an SQS queue, with the same "
        "rules as job targets."
    )
    min_interval_seconds: int = Field(
        60,
        ge=0,
        le=MAX_INTERVAL_SECONDS,
        description="At most one notification per job and event kind per this many seconds; the events in "
        "between are summarised in the next one (count).",
    )

    @field_validator("events")
    @classmethod
    def _unique(cls, v: list[EventKind]) -> list[EventKind]:
        if len(set(v)) != len(v):
            raise PydanticCustomError("invalid_value", "each event kind at most once")
        return v


def parse_rule(body: str | bytes) -> NotificationSpec:
    """Validate a rule; a selector that does not parse is a 400 invalid_selector."""
    try:
        spec = NotificationSpec.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_input(exc) from None
    parse_selector(spec.selector)
    return spec


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise InvalidInput(
            "a notification name is 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit",
            field="name",
            code="invalid_value",
        )
    return name


def check_target(spec: NotificationSpec, settings: Settings, namespace: str) -> None:
    """The rules job targets follow: the SSRF guard for a URL, the queue guard for a queue."""
    check_target_urls(spec.target, settings)
    check_target_queues(spec.target, settings, namespace)


@dataclass(frozen=True, slots=True)
class Rule:
    namespace: str
    name: str
    events: list[str]
    selector: str
    target: dict[str, Any]
    min_interval_seconds: int
    created_at: datetime
    updated_at: datetime


_COLUMNS = tuple(notification_rules.c[k] for k in Rule.__slots__)


class RuleStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def put(self, namespace: str, name: str, spec: NotificationSpec, quota: int | None = None) -> tuple[Rule, bool]:
        """Create or replace a rule; a new one past the namespace's ``quota`` of rules is refused."""
        values = {
            "namespace": namespace,
            "name": name,
            "events": [e.value for e in spec.events],
            "selector": spec.selector,
            "target": spec.target.model_dump(mode="json", exclude_none=True),
            "min_interval_seconds": spec.min_interval_seconds,
        }
        insert = pg_insert(notification_rules).values(values)
        c = notification_rules.c
        stmt = insert.on_conflict_do_update(
            index_elements=[c.namespace, c.name],
            set_={
                "events": insert.excluded.events,
                "selector": insert.excluded.selector,
                "target": insert.excluded.target,
                "min_interval_seconds": insert.excluded.min_interval_seconds,
                "updated_at": literal_column("now()"),
            },
        ).returning(*_COLUMNS, literal_column("xmax = 0").label("inserted"))
        with self.engine.begin() as conn:
            if quota is not None:
                _lock_namespace(conn, namespace)
            old = conn.execute(
                select(c.target, c.events).where(c.namespace == namespace, c.name == name).with_for_update()
            ).first()
            if old is None and quota is not None:
                _check_quota(conn, namespace, quota)
            row = conn.execute(stmt).mappings().one()
            if old is not None:
                _requeue(conn, namespace, name, retarget=old[0] != values["target"])
        return Rule(**{k: row[k] for k in Rule.__slots__}), bool(row["inserted"])

    def get(self, namespace: str, name: str) -> Rule:
        c = notification_rules.c
        with self.engine.connect() as conn:
            row = conn.execute(select(*_COLUMNS).where(and_(c.namespace == namespace, c.name == name))).mappings()
            found = row.first()
        if found is None:
            raise NotFound(f"no notification {name!r}", field="name")
        return Rule(**found)

    def list(self, namespace: str | None) -> list[Rule]:
        c = notification_rules.c
        q = select(*_COLUMNS).order_by(c.namespace, c.name)
        if namespace is not None:
            q = q.where(c.namespace == namespace)
        with self.engine.connect() as conn:
            return [Rule(**r) for r in conn.execute(q).mappings()]

    def delete(self, namespace: str, name: str) -> None:
        """Delete a rule, with what it still had to send and its summaries."""
        c = notification_rules.c
        with self.engine.begin() as conn:
            deleted = conn.execute(notification_rules.delete().where(and_(c.namespace == namespace, c.name == name)))
            if deleted.rowcount:
                params = {"ns": namespace, "rule": name}
                conn.execute(text(_UNSENT + " DELETE FROM notification_outbox o USING u WHERE o.id = u.id"), params)
                conn.execute(text("DELETE FROM notification_state WHERE namespace = :ns AND rule = :rule"), params)
        if deleted.rowcount == 0:
            raise NotFound(f"no notification {name!r}", field="name")


# A rule's notifications still to send (the outbox keeps sent ones for a while: see purge).
_UNSENT = (
    "WITH u AS (SELECT id FROM notification_outbox WHERE namespace = :ns AND rule = :rule "
    "AND sent_at IS NULL AND given_up_at IS NULL)"
)


def _lock_namespace(conn: Connection, namespace: str) -> None:
    """Creates of one namespace's rules take turns: the count below holds until commit."""
    conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('notification_rules:' || :ns, 0))"), {"ns": namespace}
    )


def _check_quota(conn: Connection, namespace: str, quota: int) -> None:
    """A new rule past the namespace's quota is refused."""
    count = conn.execute(select(func.count()).where(notification_rules.c.namespace == namespace)).scalar_one()
    if count >= quota:
        raise QuotaExceeded(
            f"namespace {namespace!r} has {count} notification rules, its quota; delete one first "
            f"(the quota is CRONMAN_QUOTA_NOTIFICATION_RULES_PER_NAMESPACE)",
            quota="CRONMAN_QUOTA_NOTIFICATION_RULES_PER_NAMESPACE",
            field="name",
        )


def _requeue(conn: Connection, namespace: str, name: str, *, retarget: bool) -> None:
    """A rule replaced: what it still has to send goes where the rule says now (the sender reads the
    target from the rule), tried afresh if the target changed; kinds of event it no longer sends
    are dropped."""
    params = {"ns": namespace, "rule": name}
    conn.execute(
        text(
            _UNSENT + " , r AS (SELECT events FROM notification_rules WHERE namespace = :ns AND name = :rule) "
            "DELETE FROM notification_outbox o USING u, r WHERE o.id = u.id AND NOT o.event = ANY(r.events)"
        ),
        params,
    )
    if retarget:
        conn.execute(
            text(
                _UNSENT + " UPDATE notification_outbox o SET attempts = 0, next_attempt_at = now(), "
                "last_error = NULL FROM u WHERE o.id = u.id"
            ),
            params,
        )


# --------------------------------------------------------------------------- summaries (pure)
@dataclass(frozen=True, slots=True)
class Summary:
    """The state of one (rule, job, event kind): when its last notification went out, and the
    events counted since, waiting for the interval to end."""

    last_sent_ms: int | None = None
    pending: int = 0
    pending_first_ms: int | None = None
    pending_detail: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Emit:
    """A notification to send: ``count`` events, the first at ``first_ms``, the last at ``at_ms``."""

    count: int
    first_ms: int
    at_ms: int
    detail: dict[str, Any]


def on_event(
    state: Summary, at_ms: int, detail: dict[str, Any], now_ms: int, interval_ms: int
) -> tuple[Summary, Emit | None]:
    """One more event of a (rule, job, kind): sent at once after a quiet interval, counted otherwise."""
    first = state.pending_first_ms if state.pending and state.pending_first_ms is not None else at_ms
    if state.last_sent_ms is None or now_ms - state.last_sent_ms >= interval_ms:
        return Summary(now_ms), Emit(state.pending + 1, min(first, at_ms), at_ms, detail)
    return Summary(state.last_sent_ms, state.pending + 1, first, {**detail, "at_ms": at_ms}), None


def on_events(
    state: Summary,
    count: int,
    first_ms: int,
    at_ms: int,
    detail: dict[str, Any],
    now_ms: int,
    interval_ms: int,
    *,
    may_send: bool = True,
) -> tuple[Summary, Emit | None]:
    """``count`` more events of a (rule, job, kind) taken together (the first at ``first_ms``, the
    last at ``at_ms`` with ``detail``): sent at once, as one, after a quiet interval (unless
    ``may_send`` is False: the rule has sent its share of the minute); counted otherwise."""
    first = state.pending_first_ms if state.pending and state.pending_first_ms is not None else first_ms
    first = min(first, first_ms)
    quiet = state.last_sent_ms is None or now_ms - state.last_sent_ms >= interval_ms
    if quiet and may_send:
        return Summary(now_ms), Emit(state.pending + count, first, at_ms, detail)
    # (never sent, held back by the rule's share: "sent at 0", due as soon as the rule may send)
    last = 0 if state.last_sent_ms is None else state.last_sent_ms
    return Summary(last, state.pending + count, first, {**detail, "at_ms": at_ms}), None


class RuleBudget:
    """At most ``per_minute`` notifications per rule in any minute (the rule's last sends are
    remembered): what is over waits, counted in its summaries, and goes out as the minute moves
    on. Kept by the process leading the dispatcher (a new leader starts afresh)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._sent: dict[str, dict[str, deque[int]]] = {}  # namespace -> rule -> its last sends (ms)

    def _recent(self, namespace: str, rule: str, now_ms: int) -> deque[int] | None:
        sent = self._sent.get(namespace, {}).get(rule)
        while sent and now_ms - sent[0] >= 60_000:
            sent.popleft()
        return sent

    def left(self, namespace: str, rule: str, now_ms: int) -> int:
        sent = self._recent(namespace, rule, now_ms)
        return self.per_minute - (len(sent) if sent else 0)

    def take(self, namespace: str, rule: str, now_ms: int) -> bool:
        if self.left(namespace, rule, now_ms) <= 0:
            return False
        self._sent.setdefault(namespace, {}).setdefault(rule, deque()).append(now_ms)
        return True

    def spent(self, namespace: str, now_ms: int) -> list[str]:
        """The namespace's rules that have sent their share of the last minute."""
        rules = self._sent.get(namespace, {})
        for rule in list(rules):
            if not self._recent(namespace, rule, now_ms):
                del rules[rule]
        return sorted(r for r, sent in rules.items() if len(sent) >= self.per_minute)


def on_tick(state: Summary, now_ms: int, interval_ms: int) -> tuple[Summary, Emit | None]:
    """The interval after the last notification is over: what was counted meanwhile goes out."""
    if not state.pending or state.last_sent_ms is None or now_ms - state.last_sent_ms < interval_ms:
        return state, None
    detail = state.pending_detail or {}
    at_ms = int(detail.get("at_ms", now_ms))
    first = state.pending_first_ms if state.pending_first_ms is not None else at_ms
    return Summary(now_ms), Emit(state.pending, first, at_ms, detail)


def body(event_id: str, kind: str, namespace: str, rule: str, job_id: str, emit: Emit) -> bytes:
    """The JSON a notification carries."""
    doc: dict[str, Any] = {
        "event_id": event_id,
        "event": kind,
        "namespace": namespace,
        "notification": rule,
        "job_id": job_id,
        "at": iso(emit.at_ms),
        "first_at": iso(emit.first_ms),
        "count": emit.count,
    }
    doc.update({k: v for k, v in emit.detail.items() if k != "at_ms" and k not in doc})
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def new_event_id() -> str:
    return str(uuid.uuid4())
