"""Deadlines: occurrences not succeeded within their job's ``deadline_seconds``, recorded once.

A pass of the process leading the watch (scheduler_node.watch), beside the late-occurrence
watchdog, and like it independent of every node: it reads what was due (the job's schedule with
its calendars, as the nodes fire it; for a job with an ``after`` schedule, its executions recorded
in ``execution_upstreams``) and what history says of each occurrence, never a node's memory.

An occurrence (each of its ``events_per_trigger`` execution ids) whose scheduled time plus the
deadline has passed, with no ``succeeded`` history row finished by then (any attempt; for
asynchronous work the node writes that row when the work reports its end), is a miss: one
``deadline_misses`` row per execution id (``ON CONFLICT DO NOTHING``, so a pass run twice, or by a
new leader looking back, records it once), and for each new row, in the same statement: an
``execution.deadline_missed`` event for the notification rules, and the job's health turned late
from the deadline instant (`cronman.store.health`: late until an occurrence at or after it is
attempted). The row's ``status`` is what history said of the execution by its deadline (null:
nothing, no node took it up).

Cost. When no job has a deadline a pass is one query on a partial index. Otherwise each job's
occurrences are read from where the last pass stopped (kept in memory; a new leader looks back
again, to deadlines at most ``LOOKBACK_MS`` old), at most ``CHECKS_PER_PASS`` execution ids a
pass, a history lookup and a write a batch at a time. A deadline is judged ``grace_ms`` after it passes, so that
a success finished in time but still in a node's history buffer is not taken for a miss.

What was due is judged by the job's definition as it is: occurrences before its last change (a
pause, a resume, a new schedule) are not looked at by a pass that did not see them before it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from cronman.model.execution import execution_id
from cronman.model.schedule import Timing
from cronman.model.timeutil import iso
from cronman.store.notifications import EventKind

log = logging.getLogger("cronman.watch")

CHECKS_PER_PASS = 5000  # execution ids one pass looks up at most
_BATCH = 1000  # execution ids looked up, and misses written, a round trip
_WHOLE = re.compile(r"[0-9]{1,9}")
_MS = "floor(extract(epoch from {}) * 1000)::bigint"
_TS = "(timestamptz 'epoch' + ({}) * interval '1 millisecond')"

# The jobs with a deadline: few, and found by the partial index ix_jobs_deadlines.
_JOBS = (
    "SELECT id, namespace, incarnation, schedule::text, options->>'deadline_seconds', options->'calendars', "
    f"options->>'events_per_trigger', {_MS.format('updated_at')}, schedule->>'type' FROM jobs "
    "WHERE options ? 'deadline_seconds' AND deleted_at IS NULL AND NOT paused ORDER BY id"
)

# An "after" job's executions whose deadline has passed, after a cursor (microseconds: rows of one
# millisecond are not cut in two).
_AFTER_EXECUTIONS = """
SELECT w.job, e.execution_id::text, floor(extract(epoch from e.created_at) * 1000000)::bigint
FROM unnest(%(ns)s::text[], %(jobs)s::text[], %(after_us)s::bigint[], %(until_us)s::bigint[]) AS w(ns, job, a, u)
CROSS JOIN LATERAL (
    SELECT execution_id, created_at FROM execution_upstreams
    WHERE namespace = w.ns AND job_id = w.job
        AND created_at > timestamptz 'epoch' + w.a * interval '1 microsecond'
        AND created_at <= timestamptz 'epoch' + w.u * interval '1 microsecond'
    ORDER BY created_at LIMIT %(limit)s) e
ORDER BY w.job, e.created_at
"""

# What history says of each execution by its deadline: succeeded in time, and the last status
# (the latest attempt finished by then). A scheduled occurrence's rows are found by key; an
# "after" execution's within ``lo``..``hi`` of when it was recorded.
_HISTORY = f"""
SELECT w.eid::text,
    bool_or(s.status = 'succeeded' AND coalesce(s.finished_at, s.fired_at, s.scheduled_for) <= {_TS.format("w.dl")}),
    (array_agg(s.status ORDER BY s.attempt DESC) FILTER (
        WHERE coalesce(s.finished_at, s.fired_at, s.scheduled_for) <= {_TS.format("w.dl")}))[1]
FROM unnest(%s::text[], %s::uuid[], %s::bigint[], %s::bigint[], %s::bigint[]) AS w(job, eid, lo, hi, dl)
JOIN scheduled_jobs s ON s.job_id = w.job AND s.execution_id = w.eid
    AND s.scheduled_for >= {_TS.format("w.lo")} AND s.scheduled_for <= {_TS.format("w.hi")}
GROUP BY w.eid
"""

# The misses, once each; for the new ones, in the same statement, their event (where a rule of the
# namespace asks for it) and their job's health: late from the deadline instant, unless an
# occurrence at or after it was attempted already (a row of another incarnation starts afresh).
_RECORD = f"""
WITH v(ns, job, inc, eid, s, dl, status, detail) AS (
    SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::uuid[], %s::bigint[], %s::bigint[], %s::text[],
        %s::jsonb[])),
ins AS (
    INSERT INTO deadline_misses (namespace, job_id, execution_id, scheduled_for, deadline_at, status)
    SELECT ns, job, eid, {_TS.format("s")}, {_TS.format("dl")}, status FROM v
    ON CONFLICT (execution_id) DO NOTHING RETURNING execution_id),
new AS (SELECT v.* FROM v JOIN ins ON ins.execution_id = v.eid),
ev AS (
    INSERT INTO notification_events (namespace, job_id, event, at, detail)
    SELECT ns, job, '{EventKind.EXECUTION_DEADLINE_MISSED.value}', {_TS.format("dl")}, detail FROM new
    WHERE EXISTS (SELECT 1 FROM notification_rules r WHERE r.namespace = new.ns
        AND '{EventKind.EXECUTION_DEADLINE_MISSED.value}' = ANY(r.events))),
h AS (
    INSERT INTO job_health AS h (job_id, incarnation, namespace, late_since, last_late_at)
    SELECT job, inc, ns, {_TS.format("max(dl)")}, {_TS.format("max(dl)")} FROM new GROUP BY job, inc, ns ORDER BY job
    ON CONFLICT (job_id) DO UPDATE SET
        late_since = CASE
            WHEN h.incarnation <> excluded.incarnation THEN excluded.late_since
            WHEN excluded.late_since > COALESCE(h.last_delivered_for, '-infinity') THEN GREATEST(excluded.late_since,
                CASE WHEN h.late_since > COALESCE(h.last_delivered_for, '-infinity') THEN h.late_since END)
            ELSE h.late_since END,
        last_late_at = CASE WHEN h.incarnation = excluded.incarnation
            THEN GREATEST(h.last_late_at, excluded.last_late_at) ELSE excluded.last_late_at END,
        last_success_at = CASE WHEN h.incarnation = excluded.incarnation THEN h.last_success_at END,
        last_failure_at = CASE WHEN h.incarnation = excluded.incarnation THEN h.last_failure_at END,
        consecutive_failures = CASE WHEN h.incarnation = excluded.incarnation THEN h.consecutive_failures ELSE 0 END,
        failures_toward_pause = CASE WHEN h.incarnation = excluded.incarnation THEN h.failures_toward_pause ELSE 0
            END,
        last_lag_ms = CASE WHEN h.incarnation = excluded.incarnation THEN h.last_lag_ms END,
        last_delivered_for = CASE WHEN h.incarnation = excluded.incarnation THEN h.last_delivered_for END,
        incarnation = excluded.incarnation,
        updated_at = now())
SELECT count(*) FROM ins
"""


@dataclass(frozen=True, slots=True)
class DeadlineJob:
    id: str
    namespace: str
    incarnation: int
    schedule: str
    deadline_ms: int
    calendars: tuple[str, ...]
    events: int
    updated_ms: int
    after: bool  # an ``after`` schedule: its occurrences are its executions, not times of its own

    @property
    def definition(self) -> tuple[Any, ...]:
        """What decides which occurrences were due: a change of it restarts the job's look."""
        return (self.incarnation, self.schedule, self.calendars, self.events, self.deadline_ms)


@dataclass(frozen=True, slots=True)
class _Look:
    """How far a job's occurrences were looked at: every one through ``through`` (ms; for an
    ``after`` job, microseconds of its executions' recording), by ``definition``."""

    definition: tuple[Any, ...]
    through: int
    due: int | None = 0  # the deadline of the next occurrence not judged yet (None: it has no more)


@dataclass(frozen=True, slots=True)
class _Check:
    """One execution id whose deadline passed, to look up in history."""

    job: DeadlineJob
    execution_id: str
    scheduled_ms: int
    lo_ms: int  # history's rows of it are scheduled within lo..hi
    hi_ms: int

    @property
    def deadline_ms(self) -> int:
        return self.scheduled_ms + self.job.deadline_ms


_NOTHING: tuple[bool, str | None] = (False, None)  # no history row of the execution by its deadline
AFTER_WINDOW_MS = 3_600_000  # an "after" execution's history rows are within this of its recording


class Deadlines:
    """The deadline pass. ``timing`` gives a job's due occurrences as the nodes see them (the
    watch's: the schedule with its calendars)."""

    def __init__(self, engine: Engine, timing: Callable[[DeadlineJob], Timing], *, lookback_ms: int) -> None:
        self.engine = engine
        self.timing = timing
        self.lookback_ms = lookback_ms
        self._looks: dict[str, _Look] = {}  # job id -> how far its occurrences were looked at
        self.checked = 0  # execution ids the last pass looked up

    def forget(self) -> None:
        """A new lead: look back again (what was recorded stays recorded once)."""
        self._looks.clear()

    def pass_once(self, now: int, grace_ms: int) -> int:
        """Blocking. Record the misses whose deadline passed ``grace_ms`` before ``now``; returns
        how many are new."""
        jobs = self._jobs()
        live = {j.id for j in jobs}
        self._looks = {j: look for j, look in self._looks.items() if j in live}
        if not jobs:
            return 0
        until = now - grace_ms
        before = dict(self._looks)
        try:
            checks = list(self._occurrences([j for j in jobs if not j.after], until))
            checks += self._after_executions([j for j in jobs if j.after], until, CHECKS_PER_PASS - len(checks))
            self.checked = len(checks)
            fresh = 0
            for i in range(0, len(checks), _BATCH):
                fresh += self._record(checks[i : i + _BATCH])
        except Exception:
            self._looks = before  # the next pass looks again at what this one could not record
            raise
        return fresh

    # -- what was due
    def _jobs(self) -> list[DeadlineJob]:
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(_JOBS)
            rows = cur.fetchall()
            raw.commit()
        finally:
            raw.close()
        return [j for j in map(_job_of, rows) if j is not None]

    def _start(self, job: DeadlineJob, now: int, scale: int) -> int:
        """Where the job's look goes on from (``scale``: 1 for ms, 1000 for microseconds)."""
        back = now - self.lookback_ms - job.deadline_ms  # deadlines that passed within the lookback
        floor = max(back, job.updated_ms - 1) * scale
        look = self._looks.get(job.id)
        if look is None:
            return floor
        if look.definition == job.definition:
            return max(look.through, back * scale)
        return max(look.through, floor)

    def _occurrences(self, jobs: Sequence[DeadlineJob], until: int) -> Iterator[_Check]:
        """Scheduled occurrences whose deadline is before ``until``, job by job, within the pass's
        budget; each job's look moves on to the last one given."""
        left = CHECKS_PER_PASS
        for job in jobs:
            if left <= 0:
                return
            look = self._looks.get(job.id)
            if look is not None and look.definition == job.definition and (look.due is None or look.due > until):
                continue  # nothing has come due since the last pass: its schedule is not even computed
            start = self._start(job, until, 1)
            try:
                timing = self.timing(job)
            except Exception as exc:  # noqa: BLE001 - one job's schedule never stops the pass
                log.warning("cannot compute the occurrences of a job: %s", exc, extra={"job_id": job.id})
                continue
            through = start
            t = timing.next_after(start)
            while t is not None and t + job.deadline_ms <= until and left > 0:
                for e in range(job.events):
                    yield _Check(job, execution_id(job.id, t, e), t, t, t)
                left -= job.events
                through = t
                t = timing.next_after(t)
            self._looks[job.id] = _Look(job.definition, through, None if t is None else t + job.deadline_ms)

    def _after_executions(self, jobs: Sequence[DeadlineJob], until: int, limit: int) -> list[_Check]:
        """The executions of ``after`` jobs whose deadline is before ``until``."""
        if not jobs or limit <= 0:
            return []
        by_id = {j.id: j for j in jobs}
        params = {
            "ns": [j.namespace for j in jobs],
            "jobs": [j.id for j in jobs],
            "after_us": [self._start(j, until, 1000) for j in jobs],
            "until_us": [(until - j.deadline_ms) * 1000 for j in jobs],
            "limit": limit,
        }
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(_AFTER_EXECUTIONS, params)
            rows = cur.fetchall()
            raw.commit()
        finally:
            raw.close()
        out: list[_Check] = []
        for job_id, eid, us in rows[:limit]:
            job, ms = by_id[job_id], int(us) // 1000
            out.append(_Check(job, eid, ms, ms - AFTER_WINDOW_MS, ms + AFTER_WINDOW_MS))
            self._looks[job_id] = _Look(job.definition, int(us))
        for job in jobs:  # a job with nothing new has been looked at through its start
            if job.id not in self._looks:
                self._looks[job.id] = _Look(job.definition, self._start(job, until, 1000))
        return out

    # -- what history says, and the misses
    def _record(self, checks: list[_Check]) -> int:
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute(
                _HISTORY,
                (
                    [c.job.id for c in checks],
                    [c.execution_id for c in checks],
                    [c.lo_ms for c in checks],
                    [c.hi_ms for c in checks],
                    [c.deadline_ms for c in checks],
                ),
            )
            said: dict[str, tuple[bool, str | None]] = {r[0]: (bool(r[1]), r[2]) for r in cur.fetchall()}
            missed = [
                (c, said.get(c.execution_id, _NOTHING)[1]) for c in checks if not said.get(c.execution_id, _NOTHING)[0]
            ]
            fresh = 0
            if missed:
                cur.execute(_RECORD, _columns(missed))
                (fresh,) = cur.fetchone() or (0,)
            raw.commit()
            return int(fresh)
        except Exception:
            raw.rollback()
            raise
        finally:
            raw.close()


def _columns(missed: list[tuple[_Check, str | None]]) -> tuple[list[Any], ...]:
    return (
        [c.job.namespace for c, _ in missed],
        [c.job.id for c, _ in missed],
        [c.job.incarnation for c, _ in missed],
        [c.execution_id for c, _ in missed],
        [c.scheduled_ms for c, _ in missed],
        [c.deadline_ms for c, _ in missed],
        [status for _, status in missed],
        [json.dumps(_detail(c, status)) for c, status in missed],
    )


def _detail(check: _Check, status: str | None) -> dict[str, Any]:
    """What the notification says of the miss (besides the job, the namespace and the time)."""
    return {
        "execution_id": check.execution_id,
        "scheduled_for": iso(check.scheduled_ms),
        "deadline_at": iso(check.deadline_ms),
        "deadline_seconds": check.job.deadline_ms // 1000,
        "status": status,
    }


def _job_of(r: Sequence[Any]) -> DeadlineJob | None:
    """A job row; one whose stored deadline is not a whole number of seconds has none (the API
    validates it: a row written otherwise never stops the pass)."""
    deadline, events = r[4], r[6]
    if deadline is None or not _WHOLE.fullmatch(deadline) or int(deadline) == 0:
        return None
    names = tuple(n for n in r[5] if isinstance(n, str)) if isinstance(r[5], list) else ()
    count = int(events) if events is not None and _WHOLE.fullmatch(events) and 0 < int(events) <= 100 else 1
    return DeadlineJob(r[0], r[1], int(r[2]), r[3], int(deadline) * 1000, names, count, int(r[7]), r[8] == "after")
