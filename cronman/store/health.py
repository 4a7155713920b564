"""Job health: what the system knows of how a job is doing, kept up to date incrementally.

The nodes' history writers fold each batch of outcomes they write into one change per job
(:func:`fold`) and apply it to the job's ``job_health`` row in the same transaction; the watchdog
does the same with the occurrences it finds late. Reading a job's health is then one row by key,
whatever the length of its history. Pure functions here; the SQL is in
:mod:`scheduler_node.outcomes`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from cronman.model.timeutil import iso

LATE = "late"  # the history status of an occurrence nobody took up in time (attempt 0)
WATCHDOG = "watchdog"  # the node column of such a row
AUTO_PAUSE_REASON = "consecutive_failures"


class HealthState(enum.StrEnum):
    OK = "ok"
    LATE = "late"  # an occurrence was not taken up within late_after_seconds, and none since
    FAILING = "failing"  # the latest execution (at least) ended permanently_failed
    PAUSED = "paused"
    COMPLETED = "completed"  # nothing left to fire


@dataclass(frozen=True, slots=True)
class Health:
    """A job's ``job_health`` row (epoch ms)."""

    last_success_ms: int | None = None
    last_failure_ms: int | None = None
    consecutive_failures: int = 0
    last_lag_ms: int | None = None
    late_since_ms: int | None = None
    last_delivered_ms: int | None = None

    @property
    def late(self) -> bool:
        """Late until an attempt is made for an occurrence at or after the first late one."""
        if self.late_since_ms is None:
            return False
        return self.last_delivered_ms is None or self.last_delivered_ms < self.late_since_ms


NO_HEALTH = Health()


def state_of(health: Health, *, paused: bool, completed: bool) -> HealthState:
    if paused:
        return HealthState.PAUSED
    if health.late:
        return HealthState.LATE
    if health.consecutive_failures > 0:
        return HealthState.FAILING
    if completed:
        return HealthState.COMPLETED
    return HealthState.OK


def health_json(health: Health, *, paused: bool, completed: bool) -> dict[str, Any]:
    return {
        "state": state_of(health, paused=paused, completed=completed).value,
        "last_success_at": _iso(health.last_success_ms),
        "last_failure_at": _iso(health.last_failure_ms),
        "consecutive_failures": health.consecutive_failures,
        "last_lag_ms": health.last_lag_ms,
        "late_since": _iso(health.late_since_ms) if health.late else None,
    }


def _iso(ms: int | None) -> str | None:
    return None if ms is None else iso(ms)


def paused_by(actor: str | None, since: str) -> dict[str, Any]:
    """``paused_reason`` of a job paused through the API."""
    who = actor or "a user"
    return {"reason": "paused", "message": f"paused by {who}", "by": who, "since": since}


def paused_reason_of(paused: bool, stored: dict[str, Any] | None, updated_at: str | None) -> dict[str, Any] | None:
    """Why and since when a job is paused (None when it is not). A job paused in its definition
    (PUT, PATCH, apply) has no recorded reason: its last change is when."""
    if not paused:
        return None
    return stored or {"reason": "paused", "message": "paused in the job's definition", "by": None, "since": updated_at}


def auto_paused(failures: int) -> dict[str, Any]:
    """``paused_reason`` of a job that paused itself after ``failures`` permanent failures in a
    row, but for ``since``: the statement that pauses it (scheduler_node.outcomes) adds its own time."""
    return {
        "reason": AUTO_PAUSE_REASON,
        "message": f"{failures} executions in a row ended permanently_failed",
        "by": "scheduler",
        "consecutive_failures": failures,
    }


# --------------------------------------------------------------------------- folding outcomes
class OutcomeRow(Protocol):
    """What :func:`fold` reads of a history row (scheduler_node.history.HistoryRow has it all)."""

    @property
    def job_id(self) -> str: ...
    @property
    def incarnation(self) -> int | None: ...
    @property
    def namespace(self) -> str | None: ...
    @property
    def status(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def scheduled_ms(self) -> int: ...
    @property
    def fired_ms(self) -> int | None: ...
    @property
    def finished_ms(self) -> int | None: ...
    @property
    def lag_ms(self) -> int | None: ...


class HealthDelta(NamedTuple):
    """One job's share of a batch of outcomes (a named tuple: one is built per job of a batch of
    thousands, on the history writer's path). ``failures``: executions that ended
    permanently_failed after the batch's last success (all of them when none succeeded); they add
    to the stored count, or replace it when ``last_success_ms`` is set."""

    job_id: str
    incarnation: int
    namespace: str
    last_success_ms: int | None = None
    last_failure_ms: int | None = None
    failures: int = 0
    last_lag_ms: int | None = None
    lag_for_ms: int | None = None  # the occurrence last_lag_ms belongs to
    delivered_ms: int | None = None  # the latest occurrence an attempt was made for
    late_first_ms: int | None = None
    late_last_ms: int | None = None

    @property
    def succeeded(self) -> bool:
        return self.last_success_ms is not None


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def fold(rows: Iterable[OutcomeRow]) -> list[HealthDelta]:
    """Fold history rows (final outcomes, failed attempts, late marks) into one change per job.
    Executions count in the order they ended."""
    by_job: dict[str, _Folding] = {}
    ordered = sorted(rows, key=lambda r: (r.finished_ms or r.scheduled_ms, r.scheduled_ms, r.attempt))
    for r in ordered:
        d = by_job.get(r.job_id)
        if d is None:
            d = by_job[r.job_id] = _Folding(r.job_id, r.incarnation or 0, r.namespace or "default")
        ended = r.finished_ms if r.finished_ms is not None else r.scheduled_ms
        if r.status == "succeeded":
            d.last_success_ms = _max(d.last_success_ms, ended)
            d.failures = 0
        elif r.status == "permanently_failed":
            d.last_failure_ms = _max(d.last_failure_ms, ended)
            d.failures += 1
        elif r.status == "failed":
            d.last_failure_ms = _max(d.last_failure_ms, ended)
        elif r.status == LATE:
            d.late_first_ms = _min(d.late_first_ms, r.scheduled_ms)
            d.late_last_ms = _max(d.late_last_ms, r.scheduled_ms)
        if r.fired_ms is not None:
            d.delivered_ms = _max(d.delivered_ms, r.scheduled_ms)
            if r.attempt == 1 and r.lag_ms is not None and (d.lag_for_ms is None or r.scheduled_ms >= d.lag_for_ms):
                d.last_lag_ms = r.lag_ms
                d.lag_for_ms = r.scheduled_ms
    return [d.delta() for d in by_job.values()]


@dataclass(slots=True)
class _Folding:
    """A job's HealthDelta while its rows are folded (changed in place: a frozen copy for each row
    of a batch of thousands was most of the fold's time)."""

    job_id: str
    incarnation: int
    namespace: str
    last_success_ms: int | None = None
    last_failure_ms: int | None = None
    failures: int = 0
    last_lag_ms: int | None = None
    lag_for_ms: int | None = None
    delivered_ms: int | None = None
    late_first_ms: int | None = None
    late_last_ms: int | None = None

    def delta(self) -> HealthDelta:
        return HealthDelta(
            self.job_id,
            self.incarnation,
            self.namespace,
            self.last_success_ms,
            self.last_failure_ms,
            self.failures,
            self.last_lag_ms,
            self.lag_for_ms,
            self.delivered_ms,
            self.late_first_ms,
            self.late_last_ms,
        )


def health_of(conn: Any, jobs: Iterable[tuple[str, int]]) -> dict[str, Health]:
    """The health rows of (job id, incarnation) pairs, in one query by key."""
    from sqlalchemy import text

    pairs = list(jobs)
    if not pairs:
        return {}
    rows = conn.execute(
        text(
            "SELECT h.job_id, " + ", ".join(_MS.format(c) for c in _TIMES[:2]) + ", h.consecutive_failures, "
            "h.last_lag_ms, " + ", ".join(_MS.format(c) for c in _TIMES[2:]) + " FROM job_health h "
            "JOIN unnest(CAST(:ids AS text[]), CAST(:incs AS bigint[])) AS w(id, inc) "
            "ON h.job_id = w.id AND h.incarnation = w.inc"
        ),
        {"ids": [p[0] for p in pairs], "incs": [p[1] for p in pairs]},
    )
    return {r[0]: Health(r[1], r[2], int(r[3]), r[4], r[5], r[6]) for r in rows}


_MS = "floor(extract(epoch from h.{}) * 1000)::bigint"
_TIMES = ("last_success_at", "last_failure_at", "late_since", "last_delivered_for")
