"""Work that finishes later: what the API's ``:complete`` and ``:heartbeat`` do to an execution's
``async_runs`` row (written by the scheduler node before each attempt is sent).

A caller is either a namespace's key (or the admin key), or the ``Cronman-Completion-Token`` sent
with the attempt (its SHA-256 is the row's ``token_hash``; a token of an earlier attempt no longer
matches). Every change is a conditional UPDATE of the attempt that was read, still running and
within its deadline, so that a race with the node timing the attempt out, or with a second
completion, has one winner; the loser is answered from the row as the winner left it.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, case, func, literal_column, select, update

from cronman.errors import Conflict, Forbidden, NotFound
from cronman.model.timeutil import iso_dt
from cronman.store.db import async_runs

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed_out"
UNACCEPTED = "unaccepted"  # the receiver's answer to the attempt was a failure: its work is not awaited
REPORTED = (SUCCEEDED, FAILED)
_NOW: ColumnElement[datetime] = literal_column("now()")
_TRIES = 3  # reads of a row a concurrent change moved on


@dataclass(frozen=True, slots=True)
class AsyncRun:
    execution_id: str
    namespace: str
    job_id: str
    scheduled_for: datetime
    trigger: str
    attempt: int
    status: str
    token_hash: bytes
    started_at: datetime
    deadline_at: datetime
    timeout_at: datetime
    heartbeat_ms: int | None
    last_heartbeat_at: datetime | None
    reported_at: datetime | None
    output: str | None
    reported_by: str | None
    now: datetime  # the database's clock when the row was read

    def completion_json(self, duplicate: bool = False) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "job_id": self.job_id,
            "namespace": self.namespace,
            "attempt": self.attempt,
            "status": self.status,
            "output": self.output,
            "reported_at": iso_dt(self.reported_at),
            "duplicate": duplicate,
        }

    def heartbeat_json(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "attempt": self.attempt,
            "deadline_at": iso_dt(self.deadline_at),
            "timeout_at": iso_dt(self.timeout_at),
        }


_COLUMNS = [getattr(async_runs.c, f) for f in AsyncRun.__slots__ if f != "now"]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who reports: ``namespace`` None is the admin key; ``token`` the Cronman-Completion-Token sent
    (checked whenever it is sent, so a key holder that passes the token on is held to its attempt
    too); ``name`` is recorded as reported_by."""

    namespace: str | None
    token: str | None
    name: str
    keyed: bool


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _not_found(execution_id: str) -> NotFound:
    return NotFound(
        f"no execution {execution_id!r} of work that completes later is known to this caller "
        "(an unknown id, one of another namespace, or one whose job does not set completion)",
        field="execution_id",
    )


def _read(conn: Connection, execution_id: str) -> AsyncRun | None:
    row = conn.execute(select(*_COLUMNS, _NOW.label("now")).where(async_runs.c.execution_id == execution_id)).first()
    return None if row is None else AsyncRun(**row._mapping)


def _authorised(execution_id: str, run: AsyncRun | None, who: Caller) -> AsyncRun:
    if run is None or (who.keyed and who.namespace is not None and run.namespace != who.namespace):
        raise _not_found(execution_id)
    if who.token is not None and not hmac.compare_digest(token_hash(who.token), run.token_hash):
        raise Forbidden(
            f"the completion token does not match execution {execution_id}'s current attempt: forged, or from "
            "an earlier attempt",
            field="Cronman-Completion-Token",
            code="invalid_token",
        )
    return run


def _refuse_ended(run: AsyncRun) -> None:
    """A row whose attempt is no longer awaited: why (409), for a caller that is not repeating its report."""
    at = iso_dt(run.reported_at)
    if run.status in REPORTED:
        raise Conflict(
            f"execution {run.execution_id} (attempt {run.attempt}) already completed as {run.status} at {at}; "
            "it is not changed",
            field="status",
            code="already_completed",
        )
    if run.status == TIMED_OUT:
        raise Conflict(
            f"attempt {run.attempt} of execution {run.execution_id} timed out at {iso_dt(run.deadline_at)} with no "
            "end reported; its work is no longer awaited, and a retry follows if the job's retry policy allows one",
            field="execution_id",
            code="timed_out",
        )
    if run.status == UNACCEPTED:
        raise Conflict(
            f"attempt {run.attempt} of execution {run.execution_id} was not accepted by its receiver (its answer was "
            "a failure); its work is not awaited, and a retry follows if the job's retry policy allows one",
            field="execution_id",
            code="not_accepted",
        )
    if run.now > run.deadline_at:
        raise Conflict(
            f"attempt {run.attempt} of execution {run.execution_id} passed its deadline at "
            f"{iso_dt(run.deadline_at)}; its work is no longer awaited, and a retry follows if the job's retry "
            "policy allows one",
            field="execution_id",
            code="deadline_passed",
        )
    if run.status != RUNNING:
        raise Conflict(
            f"execution {run.execution_id} is {run.status}", field="execution_id", code="not_running"
        )  # (no other status is written)


def _parse_id(execution_id: str) -> str:
    try:
        return str(uuid.UUID(execution_id))
    except ValueError:
        raise _not_found(execution_id) from None


def _awaited(run: AsyncRun) -> Any:
    """The conditional UPDATE's WHERE: the attempt read, still running and within its deadline."""
    c = async_runs.c
    return (
        (c.execution_id == run.execution_id)
        & (c.status == RUNNING)
        & (c.attempt == run.attempt)
        & (c.deadline_at >= _NOW)
    )


class AsyncRunStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, execution_id: str, who: Caller) -> AsyncRun:
        exec_id = _parse_id(execution_id)
        with self.engine.connect() as conn:
            return _authorised(exec_id, _read(conn, exec_id), who)

    def complete(self, execution_id: str, who: Caller, status: str, output: str | None) -> tuple[AsyncRun, bool]:
        """Record the end the work reports; returns the row and whether it was a repeat of the end
        already recorded (then nothing changed)."""
        exec_id = _parse_id(execution_id)
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for _ in range(_TRIES):
                run = _authorised(exec_id, _read(conn, exec_id), who)
                if run.status == status:  # the same end again: answered as before, nothing changes
                    return run, True
                if run.status != RUNNING or run.now > run.deadline_at:
                    _refuse_ended(run)
                stmt = (
                    update(async_runs)
                    .where(_awaited(run))
                    .values(status=status, output=output, reported_at=_NOW, reported_by=who.name)
                    .returning(*_COLUMNS, _NOW.label("now"))
                )
                row = conn.execute(stmt).first()
                if row is not None:
                    return AsyncRun(**row._mapping), False
                # the node timed it out, a new attempt began, or another report came first: read again
        raise Conflict(
            f"execution {exec_id} changed while the report was recorded; try again", code="concurrent_update"
        )

    def heartbeat(self, execution_id: str, who: Caller) -> AsyncRun:
        """The work is alive: last_heartbeat_at now, and with heartbeat_seconds a deadline moved to
        now + heartbeat_seconds (never past the attempt's timeout)."""
        exec_id = _parse_id(execution_id)
        c = async_runs.c
        moved = case(
            (c.heartbeat_ms.is_(None), c.deadline_at),
            else_=func.least(c.timeout_at, _NOW + c.heartbeat_ms * literal_column("interval '1 millisecond'")),
        )
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for _ in range(_TRIES):
                run = _authorised(exec_id, _read(conn, exec_id), who)
                if run.status != RUNNING or run.now > run.deadline_at:
                    _refuse_ended(run)
                stmt = (
                    update(async_runs)
                    .where(_awaited(run))
                    .values(last_heartbeat_at=_NOW, deadline_at=moved)
                    .returning(*_COLUMNS, _NOW.label("now"))
                )
                row = conn.execute(stmt).first()
                if row is not None:
                    return AsyncRun(**row._mapping)
        raise Conflict(
            f"execution {exec_id} changed while the heartbeat was recorded; try again", code="concurrent_update"
        )
