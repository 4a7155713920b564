"""What new history rows of jobs others depend on change, in the transaction that writes them (see
scheduler_node.dependencies): the upstreams' latest successes, the ``after`` jobs' waits (each
locked, in one order, so two writers of upstreams of one job take turns) and the executions they
fire, as triggers of kind ``after`` read by the nodes' change feed with their upstreams recorded.
One query per batch when no row is of an upstream."""

from __future__ import annotations

import json
from typing import Any

from cronman.model.execution import Trigger, execution_id
from cronman.model.namespaces import DEFAULT_NAMESPACE
from scheduler_node.dependencies import Wait, advance, counts_upstream
from scheduler_node.history import HistoryRow

_EDGES = (
    "SELECT d.namespace, d.upstream, d.downstream, d.kind, d.within_ms FROM job_dependencies d "
    "JOIN unnest(%s::text[], %s::text[]) AS v(ns, job) ON d.namespace = v.ns AND d.upstream = v.job "
    "ORDER BY d.namespace, d.downstream, d.upstream"
)
_LAST_SUCCESS = (
    "INSERT INTO job_last_success AS s (namespace, job_id, execution_id, succeeded_at) "
    "SELECT ns, job, CAST(id AS uuid), timestamptz 'epoch' + ms * interval '1 millisecond' "
    "FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[]) AS v(ns, job, id, ms) ORDER BY ns, job "
    "ON CONFLICT (namespace, job_id) DO UPDATE SET execution_id = excluded.execution_id, "
    "succeeded_at = excluded.succeeded_at WHERE excluded.succeeded_at >= s.succeeded_at"
)
_LOCK_WAIT = (
    "INSERT INTO after_waits (namespace, downstream) VALUES (%s, %s) ON CONFLICT DO NOTHING; "
    "SELECT pending::text, applied::text, last_fired_ms, floor(extract(epoch from clock_timestamp()) * 1000)::bigint "
    "FROM after_waits WHERE namespace = %s AND downstream = %s FOR UPDATE"
)
_DOWNSTREAM = (
    "SELECT (SELECT array_agg(upstream ORDER BY upstream) FROM job_dependencies WHERE namespace = %s "
    "AND downstream = %s AND kind = 'after'), (SELECT (schedule->>'within_seconds')::bigint * 1000 FROM jobs "
    "WHERE id = %s AND namespace = %s AND deleted_at IS NULL AND schedule->>'type' = 'after'), "
    "(SELECT incarnation FROM jobs WHERE id = %s AND namespace = %s AND deleted_at IS NULL)"
)
_SAVE_WAIT = (
    "UPDATE after_waits SET pending = %s::jsonb, applied = %s::jsonb, last_fired_ms = %s "
    "WHERE namespace = %s AND downstream = %s"
)
_TRIGGER = (
    "INSERT INTO job_triggers (job_id, requested_at, requested_by, change_xid, kind, incarnation, namespace) "
    "VALUES (%s, timestamptz 'epoch' + %s * interval '1 millisecond', 'after', pg_current_xact_id()::text::bigint, "
    "'after', %s, %s)"
)
_UPSTREAMS = (
    "INSERT INTO execution_upstreams (execution_id, namespace, job_id, upstream_jobs, upstream_ids, skip_reason) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (execution_id) DO NOTHING"
)


def record_dependencies(cur: Any, written: list[HistoryRow]) -> int:
    """Apply rows written (new ones, and those that replaced a row: a success over a failure of the
    same attempt) to the jobs downstream of theirs; returns the executions fired. An upstream
    execution counts once per downstream however often its rows are written (Wait.first_time)."""
    rows = [r for r in written if counts_upstream(r)]
    if not rows:
        return 0
    ns_of = {id(r): r.namespace or DEFAULT_NAMESPACE for r in rows}
    keys = sorted({(ns_of[id(r)], r.job_id) for r in rows})
    cur.execute(_EDGES, ([k[0] for k in keys], [k[1] for k in keys]))
    edges = cur.fetchall()
    if not edges:
        return 0
    successes = sorted(
        {
            (ns_of[id(r)], r.job_id): r
            for r in sorted(rows, key=lambda r: r.finished_ms or 0)
            if r.status == "succeeded"
        }.items()
    )
    if successes:
        cur.execute(
            _LAST_SUCCESS,
            (
                [k[0] for k, _ in successes],
                [k[1] for k, _ in successes],
                [r.execution_id for _, r in successes],
                [r.finished_ms or r.scheduled_ms for _, r in successes],
            ),
        )
    downstreams: dict[tuple[str, str], set[str]] = {}
    for ns, upstream, downstream, kind, _ in edges:
        if kind == "after":
            downstreams.setdefault((ns, downstream), set()).add(upstream)
    fired = 0
    for (ns, downstream), ups in sorted(downstreams.items()):  # one order of locks for every writer
        ends = sorted(
            ((r.job_id, r) for r in rows if ns_of[id(r)] == ns and r.job_id in ups),
            key=lambda end: (end[1].finished_ms or 0, end[1].execution_id),
        )
        fired += _advance(cur, ns, downstream, ends)
    return fired


def _advance(cur: Any, ns: str, downstream: str, ends: list[tuple[str, HistoryRow]]) -> int:
    cur.execute(_LOCK_WAIT, (ns, downstream, ns, downstream))
    pending_text, applied_text, last_fired, now_ms = cur.fetchone()
    cur.execute(_DOWNSTREAM, (ns, downstream, downstream, ns, downstream, ns))
    upstreams, within_ms, incarnation = cur.fetchone()
    if not upstreams or within_ms is None:  # no longer an after job (or gone): nothing to fire
        return 0
    pending = {k: (v[0], int(v[1])) for k, v in json.loads(pending_text).items()}
    wait = Wait(pending, last_fired, json.loads(applied_text))
    fires = advance(wait, tuple(upstreams), int(within_ms), ends, int(now_ms))
    pending_doc = json.dumps({k: list(v) for k, v in wait.pending.items()})
    cur.execute(_SAVE_WAIT, (pending_doc, json.dumps(wait.applied), wait.last_fired_ms, ns, downstream))
    for f in fires:
        cur.execute(_TRIGGER, (downstream, f.requested_ms, incarnation, ns))
        cur.execute(
            _UPSTREAMS,
            (
                execution_id(downstream, f.requested_ms, 0, Trigger.AFTER),
                ns,
                downstream,
                list(f.upstreams.jobs),
                list(f.upstreams.ids),
                f.upstreams.skip_reason,
            ),
        )
    return len(fires)
