"""What a batch of new history rows changes besides history, in the transaction that writes them:
each job's health (:mod:`cronman.store.health`), jobs that pause themselves after too many failures in a
row (``failure_policy``), and the events notification rules may want (:mod:`cronman.store.notifications`).

Only rows written for the first time count (a row written again, by a retried write or by a node
recovering a dead node's rows, changes nothing), so the counts stay exact whoever writes.
"""

from __future__ import annotations

from typing import Any

from psycopg2.extras import Json, execute_values

from cronman.model.changes import Stop
from cronman.model.timeutil import iso
from cronman.store.health import LATE, HealthDelta, auto_paused, fold
from cronman.store.notifications import EventKind
from cronman.store.pgarray import array_columns
from scheduler_node.history import HistoryRow

_TS = "timestamptz 'epoch' + {} * interval '1 millisecond'"

_HEALTH = f"""
WITH v(job_id, incarnation, namespace, success_ms, failure_ms, failures, lag_ms, delivered_ms, late_ms, late_last_ms)
AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::bigint[], %s::bigint[], %s::int[], %s::bigint[],
    %s::bigint[], %s::bigint[], %s::bigint[])),
up AS (
    INSERT INTO job_health AS h (job_id, incarnation, namespace, last_success_at, last_failure_at,
        consecutive_failures, failures_toward_pause, last_lag_ms, last_delivered_for, late_since, last_late_at)
    SELECT job_id, incarnation, namespace, {_TS.format("success_ms")}, {_TS.format("failure_ms")}, failures, failures,
        lag_ms, {_TS.format("delivered_ms")}, {_TS.format("late_ms")}, {_TS.format("late_last_ms")} FROM v
    ON CONFLICT (job_id) DO UPDATE SET
        incarnation = excluded.incarnation,
        namespace = excluded.namespace,
        last_success_at = CASE WHEN h.incarnation = excluded.incarnation
            THEN GREATEST(h.last_success_at, excluded.last_success_at) ELSE excluded.last_success_at END,
        last_failure_at = CASE WHEN h.incarnation = excluded.incarnation
            THEN GREATEST(h.last_failure_at, excluded.last_failure_at) ELSE excluded.last_failure_at END,
        consecutive_failures = CASE WHEN h.incarnation <> excluded.incarnation OR excluded.last_success_at IS NOT NULL
            THEN excluded.consecutive_failures ELSE h.consecutive_failures + excluded.consecutive_failures END,
        failures_toward_pause = CASE WHEN h.incarnation <> excluded.incarnation OR excluded.last_success_at IS NOT NULL
            THEN excluded.failures_toward_pause ELSE h.failures_toward_pause + excluded.failures_toward_pause END,
        last_lag_ms = CASE WHEN excluded.last_lag_ms IS NOT NULL OR h.incarnation <> excluded.incarnation
            THEN excluded.last_lag_ms ELSE h.last_lag_ms END,
        last_delivered_for = CASE WHEN h.incarnation = excluded.incarnation
            THEN GREATEST(h.last_delivered_for, excluded.last_delivered_for) ELSE excluded.last_delivered_for END,
        late_since = CASE
            WHEN h.incarnation <> excluded.incarnation THEN excluded.late_since
            WHEN h.late_since > COALESCE(GREATEST(h.last_delivered_for, excluded.last_delivered_for),
                '-infinity') THEN h.late_since
            WHEN excluded.late_since > COALESCE(GREATEST(h.last_delivered_for, excluded.last_delivered_for),
                '-infinity') THEN excluded.late_since
            ELSE h.late_since END,
        last_late_at = CASE WHEN h.incarnation = excluded.incarnation
            THEN GREATEST(h.last_late_at, excluded.last_late_at) ELSE excluded.last_late_at END,
        updated_at = now()
    RETURNING h.job_id, h.incarnation, h.failures_toward_pause
)
SELECT job_id, incarnation, failures_toward_pause, before FROM (
    -- the count before this statement: the main query reads job_health in the statement's snapshot,
    -- which the upsert's changes are not in. One probe by key per job (a join of the batch with
    -- job_health here was planned as a scan of the whole table, most of the statement's time).
    SELECT up.job_id, up.incarnation, up.failures_toward_pause, COALESCE((
        SELECT CASE WHEN o.incarnation = up.incarnation THEN o.consecutive_failures END
        FROM job_health o WHERE o.job_id = up.job_id), 0) AS before
    FROM up
) c
-- only the jobs that may recover or pause: a batch of successes after successes returns nothing
WHERE failures_toward_pause > 0 OR before > 0
"""

# Jobs whose failures in a row reached their failure_policy pause themselves: the same change a
# pause through the API makes (a new version on the change feed, a job event), with the reason.
# The reason is cronman.store.health's; the time it gives is the transaction's (the job's updated_at).
_PAUSE = """
WITH v(job_id, incarnation, n, reason) AS (VALUES %s),
p AS (
    UPDATE jobs j SET paused = true, version = nextval('jobs_version_seq'),
        change_xid = pg_current_xact_id()::text::bigint, updated_at = now(),
        paused_reason = v.reason || jsonb_build_object(
            'since', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))
    FROM v
    WHERE j.id = v.job_id AND j.incarnation = v.incarnation AND j.deleted_at IS NULL AND NOT j.paused
        AND v.n >= (j.options -> 'failure_policy' ->> 'pause_after_consecutive_failures')::int
    RETURNING j.id, j.namespace, v.n, j.paused_reason, j.version
),
e AS (
    INSERT INTO job_events (job_id, namespace, action, actor, detail)
    SELECT id, namespace, 'pause', 'scheduler', paused_reason FROM p
),
r AS (UPDATE job_health h SET failures_toward_pause = 0 FROM p WHERE h.job_id = p.id)
SELECT id, namespace, n, paused_reason, version FROM p
"""
_PAUSE_TEMPLATE = "(%s, %s, %s, %s::jsonb)"

# Only events some rule of the namespace asks for are kept (rules are few; the selector is the
# dispatcher's to apply).
_EVENTS = f"""
INSERT INTO notification_events (namespace, job_id, event, at, detail)
SELECT v.namespace, v.job_id, v.event, {_TS.format("v.at_ms")}, v.detail
FROM (VALUES %s) AS v(namespace, job_id, event, at_ms, detail)
WHERE EXISTS (SELECT 1 FROM notification_rules r WHERE r.namespace = v.namespace AND v.event = ANY(r.events))
"""
_EVENTS_TEMPLATE = "(%s, %s, %s, %s::bigint, %s::jsonb)"

Event = tuple[str, str, str, int, Any]  # namespace, job id, event kind, at (ms), detail


def record_outcomes(cur: Any, rows: list[HistoryRow]) -> list[Stop]:
    """Apply rows written for the first time: health, auto-pause, notification events. Returns the
    jobs paused (for the nodes to stop once the transaction commits)."""
    # In job id order: two nodes writing outcomes of the same jobs lock their rows in one order.
    deltas = sorted(fold(rows), key=lambda d: d.job_id)
    paused: list[Stop] = []
    if not deltas:
        return paused
    by_job = {d.job_id: d for d in deltas}
    # One array per column (unnest): cheaper to adapt, and for PostgreSQL to parse, than a VALUES list.
    cur.execute(_HEALTH, array_columns(_values(d) for d in deltas))
    changed = cur.fetchall()
    events = execution_events(rows)
    pause: list[tuple[str, int, int, Json]] = []
    for job_id, incarnation, toward_pause, before in changed:
        d = by_job[job_id]
        if d.succeeded and before > 0:
            detail = {"consecutive_failures": before, "last_success_at": iso(d.last_success_ms or 0)}
            events.append((d.namespace, job_id, EventKind.JOB_RECOVERED.value, d.last_success_ms or 0, Json(detail)))
        if d.failures and toward_pause > 0:
            pause.append((job_id, incarnation, toward_pause, Json(auto_paused(toward_pause))))
    if pause:
        pause.sort(key=lambda p: p[:3])
        paused_now = execute_values(cur, _PAUSE, pause, template=_PAUSE_TEMPLATE, fetch=True)
        for job_id, namespace, n, reason, version in paused_now:
            paused.append(Stop(job_id, int(version)))
            at = by_job[job_id].last_failure_ms or 0
            detail = {"consecutive_failures": n, "paused_reason": reason}
            events.append((namespace, job_id, EventKind.JOB_AUTO_PAUSED.value, at, Json(detail)))
    if events:
        execute_values(cur, _EVENTS, events, template=_EVENTS_TEMPLATE)
    return paused


def _values(d: HealthDelta) -> tuple[Any, ...]:
    late = d.late_first_ms
    if late is not None and d.delivered_ms is not None and late <= d.delivered_ms:
        late = d.late_last_ms if d.late_last_ms is not None and d.late_last_ms > d.delivered_ms else None
    return (
        d.job_id,
        d.incarnation,
        d.namespace,
        d.last_success_ms,
        d.last_failure_ms,
        d.failures,
        d.last_lag_ms,
        d.delivered_ms,
        late,
        d.late_last_ms,
    )


_KINDS = {
    "failed": EventKind.EXECUTION_FAILED.value,
    "permanently_failed": EventKind.EXECUTION_PERMANENTLY_FAILED.value,
    LATE: EventKind.EXECUTION_LATE.value,
}


def execution_events(rows: list[HistoryRow]) -> list[Event]:
    out: list[Event] = []
    for r in rows:
        kind = _KINDS.get(r.status)
        if kind is None:
            continue
        detail: dict[str, Any] = {
            "execution_id": r.execution_id,
            "scheduled_for": iso(r.scheduled_ms),
            "attempt": r.attempt,
        }
        if r.status != LATE:
            detail.update(http_status=r.http_status, error=(r.error or "")[:500] or None)
        else:
            detail["reason"] = r.error
            if r.occurrences is not None:  # one row for a stall: how many occurrences, through which
                detail["occurrences"] = r.occurrences
                detail["last_scheduled_for"] = iso(r.last_ms or r.scheduled_ms)
        at = r.finished_ms if r.finished_ms is not None else r.scheduled_ms
        out.append((r.namespace or "default", r.job_id, kind, at, Json(detail)))
    return out
