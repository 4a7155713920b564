"""What executions wait for, in PostgreSQL: asynchronous work's runs (``async_runs``: the node
records each attempt before sending it; the API records the end the work reports), the latest
successes of the jobs others depend on, and the upstream executions an execution follows.
Blocking: see PgNodeStore."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, text

from scheduler_node.store.port import AsyncRun, RunStart, Upstreams
from scheduler_node.store.sql import _MS

_ROW = (
    "execution_id::text, attempt, status, " + _MS.format("started_at") + ", "
    "floor(extract(epoch from (deadline_at - now())) * 1000)::bigint, " + _MS.format("reported_at") + ", output"
)

# A new attempt's row: a new token and deadline, unless the row holds this attempt or a later one
# (a takeover of an attempt sent, or a check of a running one) or a success (the work reported it,
# whatever the answer to its attempt was).
_START = text(
    "INSERT INTO async_runs AS r (execution_id, namespace, job_id, scheduled_for, event_index, trigger, attempt, "
    "status, token_hash, started_at, deadline_at, timeout_at, heartbeat_ms) "
    "SELECT v.id, v.ns, v.job, timestamptz 'epoch' + v.s * interval '1 millisecond', v.ev, v.tr, v.a, 'running', "
    "decode(v.h, 'hex'), now(), now() + least(v.t, coalesce(v.hb, v.t)) * interval '1 millisecond', "
    "now() + v.t * interval '1 millisecond', v.hb "
    "FROM unnest(CAST(:ids AS uuid[]), CAST(:ns AS text[]), CAST(:jobs AS text[]), CAST(:s AS bigint[]), "
    "CAST(:ev AS int[]), CAST(:tr AS text[]), CAST(:a AS int[]), CAST(:h AS text[]), CAST(:t AS bigint[]), "
    "CAST(:hb AS bigint[])) AS v(id, ns, job, s, ev, tr, a, h, t, hb) "
    "ORDER BY v.id "
    "ON CONFLICT (execution_id) DO UPDATE SET attempt = excluded.attempt, status = 'running', "
    "token_hash = excluded.token_hash, started_at = excluded.started_at, deadline_at = excluded.deadline_at, "
    "timeout_at = excluded.timeout_at, heartbeat_ms = excluded.heartbeat_ms, last_heartbeat_at = NULL, "
    "reported_at = NULL, output = NULL, reported_by = NULL "
    "WHERE r.attempt < excluded.attempt AND r.status <> 'succeeded' "
    "RETURNING " + _ROW.replace("execution_id", "r.execution_id")
)
_READ = text(f"SELECT {_ROW} FROM async_runs WHERE execution_id = ANY(CAST(:ids AS uuid[]))")
_TIME_OUT = text(
    "UPDATE async_runs r SET status = 'timed_out', reported_at = now() "
    "FROM unnest(CAST(:ids AS uuid[]), CAST(:a AS int[])) AS v(id, a) "
    "WHERE r.execution_id = v.id AND r.attempt = v.a AND r.status = 'running' AND r.deadline_at <= now()"
)
_UNACCEPT = text(
    "UPDATE async_runs r SET status = 'unaccepted', reported_at = now() "
    "FROM unnest(CAST(:ids AS uuid[]), CAST(:a AS int[])) AS v(id, a) "
    "WHERE r.execution_id = v.id AND r.attempt = v.a AND r.status = 'running'"
)
_LAST_SUCCESS = text(
    f"SELECT s.namespace, s.job_id, s.execution_id::text, {_MS.format('s.succeeded_at')} FROM job_last_success s "
    "JOIN unnest(CAST(:ns AS text[]), CAST(:jobs AS text[])) AS v(ns, job) "
    "ON s.namespace = v.ns AND s.job_id = v.job"
)
_UPSTREAMS = text(
    "SELECT execution_id::text, upstream_jobs, upstream_ids, skip_reason FROM execution_upstreams "
    "WHERE execution_id = ANY(CAST(:ids AS uuid[]))"
)
_RECORD_UPSTREAMS = text(
    "INSERT INTO execution_upstreams (execution_id, namespace, job_id, upstream_jobs, upstream_ids) "
    "SELECT CAST(v.id AS uuid), v.ns, v.job, string_to_array(v.jobs, ','), string_to_array(v.ids, ',') "
    "FROM unnest(CAST(:ids AS text[]), CAST(:ns AS text[]), CAST(:job AS text[]), CAST(:jobs AS text[]), "
    "CAST(:uids AS text[])) AS v(id, ns, job, jobs, ids) ORDER BY v.id ON CONFLICT (execution_id) DO NOTHING"
)


def _run(r: Any) -> AsyncRun:
    return AsyncRun(int(r[1]), r[2], int(r[3]), int(r[4]), None if r[5] is None else int(r[5]), r[6])


class Waits:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def start_runs(self, runs: Sequence[RunStart]) -> dict[str, tuple[bool, AsyncRun]]:
        if not runs:
            return {}
        with self.engine.begin() as conn:
            started = {
                r[0]: (True, _run(r))
                for r in conn.execute(
                    _START,
                    {
                        "ids": [r.execution_id for r in runs],
                        "ns": [r.namespace for r in runs],
                        "jobs": [r.job_id for r in runs],
                        "s": [r.scheduled_ms for r in runs],
                        "ev": [r.event_index for r in runs],
                        "tr": [r.trigger for r in runs],
                        "a": [r.attempt for r in runs],
                        "h": [r.token_hash.hex() for r in runs],
                        "t": [r.timeout_ms for r in runs],
                        "hb": [r.heartbeat_ms for r in runs],
                    },
                )
            }
            rest = [r.execution_id for r in runs if r.execution_id not in started]
            if rest:
                started.update((r[0], (False, _run(r))) for r in conn.execute(_READ, {"ids": rest}))
        return started

    def async_runs(self, execution_ids: Sequence[str]) -> dict[str, AsyncRun]:
        if not execution_ids:
            return {}
        with self.engine.connect() as conn:
            return {r[0]: _run(r) for r in conn.execute(_READ, {"ids": list(execution_ids)})}

    def time_out_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        if not items:
            return {}
        with self.engine.begin() as conn:
            conn.execute(_TIME_OUT, {"ids": [i for i, _ in items], "a": [a for _, a in items]})
            return {r[0]: _run(r) for r in conn.execute(_READ, {"ids": [i for i, _ in items]})}

    def unaccept_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        if not items:
            return {}
        with self.engine.begin() as conn:
            conn.execute(_UNACCEPT, {"ids": [i for i, _ in items], "a": [a for _, a in items]})
            return {r[0]: _run(r) for r in conn.execute(_READ, {"ids": [i for i, _ in items]})}

    def last_successes(self, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, int]]:
        if not wanted:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(_LAST_SUCCESS, {"ns": [n for n, _ in wanted], "jobs": [j for _, j in wanted]})
            return {(r[0], r[1]): (r[2], int(r[3])) for r in rows}

    def upstreams_of(self, execution_ids: Sequence[str]) -> dict[str, Upstreams]:
        if not execution_ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(_UPSTREAMS, {"ids": list(execution_ids)})
            return {r[0]: Upstreams(tuple(r[1] or ()), tuple(r[2] or ()), r[3]) for r in rows}

    def record_upstreams(self, rows: Sequence[tuple[str, str, str, Upstreams]]) -> None:
        if not rows:
            return
        with self.engine.begin() as conn:
            conn.execute(
                _RECORD_UPSTREAMS,
                {
                    "ids": [r[0] for r in rows],
                    "ns": [r[1] for r in rows],
                    "job": [r[2] for r in rows],
                    "jobs": [",".join(r[3].jobs) for r in rows],
                    "uids": [",".join(r[3].ids) for r in rows],
                },
            )
