"""The interface a node uses to read from and write to the job database (:class:`NodeStore`), and
the rows and marks it speaks in. Its PostgreSQL implementation is :class:`scheduler_node.store.PgNodeStore`;
the simulation has its own, in memory (scheduler_node.sim.parts)."""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from cronman.model.calendars import Calendar
from cronman.model.misfire import REASON_PREFIX as MISFIRE_REASON
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import Decoder, JobRow, Loaded

Ident = tuple[str, int, int, str]  # (job id, scheduled ms, event index, trigger)


@dataclass(frozen=True, slots=True)
class TriggerRow:
    id: int
    job_id: str
    requested_ms: int
    kind: str = "trigger"  # or "redeliver"
    scheduled_ms: int | None = None
    event_index: int | None = None
    attempt: int | None = None
    execution_id: str | None = None
    trigger: str | None = None
    incarnation: int | None = None


@dataclass(frozen=True, slots=True)
class PayloadRow:
    """A job's payload as stored, with the version and incarnation of the job it belongs to."""

    version: int
    incarnation: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class AsyncRun:
    """What ``async_runs`` says of an execution of asynchronous work: the attempt sent last, its
    status (running; succeeded or failed as the work reported; timed_out), when it was sent, how
    long until its deadline by the database's clock (negative: passed), and the reported end."""

    attempt: int
    status: str
    started_ms: int
    remaining_ms: int
    reported_ms: int | None = None
    output: str | None = None


@dataclass(frozen=True, slots=True)
class RunStart:
    """An attempt of asynchronous work about to be sent: its row in ``async_runs``."""

    execution_id: str
    namespace: str
    job_id: str
    scheduled_ms: int
    event_index: int
    trigger: str
    attempt: int
    token_hash: bytes
    timeout_ms: int  # the work's timeout plus the target's own (the send itself)
    heartbeat_ms: int | None


@dataclass(frozen=True, slots=True)
class Upstreams:
    """The upstream executions an execution follows (job ids and execution ids, in order), or why
    an ``after`` execution is skipped (an upstream failed)."""

    jobs: tuple[str, ...]
    ids: tuple[str, ...]
    skip_reason: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Small tables every node keeps whole: throttle policies, signing secrets and calendars."""

    throttles: dict[tuple[str, str], tuple[int, float | None]]
    secrets: dict[str, tuple[str, ...]]  # newest first; the previous one for a day after a rotation
    calendars: dict[tuple[str, str], Calendar] = field(default_factory=dict)  # (namespace, name)


@dataclass(frozen=True, slots=True)
class BackfillRow:
    """A backfill as a node drives it (see scheduler_node.backfill)."""

    id: str
    job_id: str
    incarnation: int
    from_ms: int
    to_ms: int
    rate: float  # executions per second
    events: int
    # JSON: {"schedule": ..., "calendars": [[name, document], ...]} (cronman.model.backfills); "" unless running
    timing: str
    state: str  # running or cancelled
    cursor_ms: int | None  # every occurrence up to here is claimed
    dispatched: int
    live_incarnation: int | None  # the job's incarnation, while it is live
    namespace: str = "default"


@dataclass(frozen=True, slots=True)
class Attempts:
    """What history says of an execution: its highest attempt and whether it ended."""

    last_attempt: int
    final: bool
    # ended only by a misfire plan's skip: a row recorded for an occurrence nobody claimed, which
    # does not end it if a node did claim it after all (seed 79428). A skip its claim's holder
    # decided (an overlap, a calendar) ends it like a success (seed 8204482).
    only_skipped: bool = False


def ends(status: str, error: str | None) -> bool:
    """Whether a history row ends its execution whoever holds its claim: a final one, but for a
    misfire plan's skip (see :class:`Attempts`)."""
    if status == "skipped":
        return not (error or "").startswith(MISFIRE_REASON)
    return status in ("succeeded", "permanently_failed", "cancelled")


class SlotMarks(NamedTuple):
    """How far the slots were fired, from every node's recorded progress."""

    claimed: dict[int, int]  # slot -> every occurrence up to here was claimed (a node resumes here)
    cluster: int | None  # how far any node fired at all (outages are judged by it); None: never
    # slot -> how far it was fired, claims lost with Redis's data or not (the watchdog's view):
    # past `claimed` only after such a loss, and what lies between may have been delivered
    fired: dict[int, int]


def slot_marks_of(rows: Iterable[tuple[int, int, bytes]]) -> SlotMarks:
    """From progress rows (claimed through, fired through, bitmap of slots): each slot's furthest."""
    rows = list(rows)
    claimed: dict[int, int] = {}
    fired: dict[int, int] = {}
    for ms, _, slots in sorted(rows, key=lambda r: r[0]):  # later rows overwrite
        for s in bitmap_slots(slots):
            claimed[s] = ms
    for _, ms, slots in sorted(rows, key=lambda r: r[1]):
        for s in bitmap_slots(slots):
            fired[s] = ms
    return SlotMarks(claimed, max((r[1] for r in rows), default=None), fired)


class NodeStore(abc.ABC):
    # Jobs read by this store's loads so far: a loading node's heartbeat shows it, and the other
    # nodes count it as loading while it moves (scheduler_node.node: ownership).
    rows_loaded: int = 0

    @abc.abstractmethod
    async def load_slots(self, slots: Sequence[int], decoder: Decoder) -> tuple[int, Loaded]:
        """Every live job of ``slots`` as (job, updated ms), and the cursor to poll changes from."""

    def abandon_loads(self) -> None:  # noqa: B027 - a store whose loads are quick needs nothing
        """The node stops: a load in progress ends early (its result is not used)."""

    @abc.abstractmethod
    async def poll_changes(
        self, cursor: int, slots: Collection[int] | None = None
    ) -> tuple[int, list[JobRow], list[TriggerRow]]:
        """Jobs changed and triggers requested since ``cursor`` (of ``slots`` only, when given),
        and the cursor to poll from next."""

    @abc.abstractmethod
    async def recent_triggers(self, slots: Sequence[int], since_ms: int) -> list[TriggerRow]:
        """Triggers and redeliveries of jobs in ``slots`` requested since then."""

    @abc.abstractmethod
    async def attempts(self, idents: Sequence[Ident]) -> dict[Ident, Attempts]: ...

    # -- work that finishes later, jobs that wait for other jobs (scheduler_node.waits)
    @abc.abstractmethod
    async def start_runs(self, runs: Sequence[RunStart]) -> dict[str, tuple[bool, AsyncRun]]:
        """Record each attempt as running (a new token and deadline), unless the row holds that
        attempt or a later one already, or a success: per execution id, (started by this call,
        the row as it stands)."""

    @abc.abstractmethod
    async def async_runs(self, execution_ids: Sequence[str]) -> dict[str, AsyncRun]: ...

    @abc.abstractmethod
    async def time_out_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        """(execution id, attempt): timed out if still running at that attempt past its deadline;
        the rows as they stand after."""

    @abc.abstractmethod
    async def unaccept_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        """(execution id, attempt): the receiver did not accept that attempt (its answer was a
        failure): ``unaccepted`` if still running at that attempt, so that no report for it counts;
        the rows as they stand after (a report that came first is the attempt's end)."""

    @abc.abstractmethod
    async def last_successes(self, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, int]]:
        """(namespace, job id) -> (execution id, ms) of the job's latest success, for jobs others depend on."""

    @abc.abstractmethod
    async def upstreams_of(self, execution_ids: Sequence[str]) -> dict[str, Upstreams]: ...

    @abc.abstractmethod
    async def record_upstreams(self, rows: Sequence[tuple[str, str, str, Upstreams]]) -> None:
        """(execution id, namespace, job id, upstreams): kept once (a second record changes nothing)."""

    @abc.abstractmethod
    async def live_incarnations(self, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """The live incarnation of each job and when it was created (ms); none for a deleted job."""

    @abc.abstractmethod
    async def payloads(self, job_ids: Sequence[str]) -> dict[str, PayloadRow]:
        """The stored payload of each job (none for a deleted job): what a node left out of
        memory, read ahead of the job's time (scheduler_node.payloads)."""

    @abc.abstractmethod
    async def cluster_config(self) -> ClusterConfig: ...

    @abc.abstractmethod
    async def save_progress(
        self,
        node_id: str,
        incarnation: str,
        fired_through_ms: int,
        slots: bytes,
        epoch: str | None,
        firing_ms: int | None = None,
        open_ms: int | None = None,
    ) -> None:
        """This node has claimed every occurrence of ``slots`` through ``fired_through_ms``, in the
        Redis data of ``epoch``. Progress only grows within an epoch; claimed in an epoch recorded
        lost, it counts up to where the loss left it (see :meth:`lose_epoch`). ``firing_ms`` (by
        default the same) is how far its timer ran, whatever late work it still owes and whether
        its claims reached Redis: the cluster was running through there (``SlotMarks.cluster``).
        ``open_ms``: the earliest scheduled time of the occurrences it holds or has parked, not
        ended (None: none), as it is now; a loss of Redis's data after this node is gone reaches
        back to it (see :meth:`lose_epoch`)."""

    @abc.abstractmethod
    async def lose_epoch(
        self,
        epoch: str,
        current: str,
        since_ms: int,
        node_id: str,
        reach_ms: int | None = None,
        live: Collection[str] = (),
    ) -> int:
        """Redis lost the data of ``epoch`` (its claims, done marks, unwritten rows), noticed when
        it answered with ``current``: progress claimed in any other epoch than ``current`` speaks
        for occurrences up to a point only, now and when saved later, and how far the cluster
        fired stays as it was. The point is ``since_ms``, or earlier: the least progress (or open
        work, see :meth:`save_progress`) recorded in ``epoch`` after ``reach_ms`` by an incarnation
        not in ``live`` (a node gone since, whose claims made after its last record, or held open
        since before it, may have been lost before anyone took them over), and
        not before ``reach_ms``; and no later than the point of another loss recorded after
        ``reach_ms`` (not before it either): the data lost held the claims made again after that
        loss, which nodes gone since may have held unresolved (seed 7602338: a fire_once outage's
        carrier, claimed again in the data after one loss, held through a hang of PostgreSQL by a
        node that never recorded progress in that data, handed over as it stopped, and lost with
        the next loss). Returns the point (the earliest any node that noticed gave)."""

    @abc.abstractmethod
    async def unnoticed_losses(
        self, current: str, reach_ms: int, margin_ms: int, node_id: str
    ) -> list[tuple[str, int]]:
        """Losses of Redis's data nobody recorded (every node that saw the old data died before
        noticing, as in a power cut): progress recorded after ``reach_ms`` in an epoch other than
        ``current`` and not recorded lost. Each is recorded as :meth:`lose_epoch` does, from
        ``margin_ms`` before that epoch's last record, or its least progress if earlier (not
        before ``reach_ms``); returns (epoch, from when) for each. And the losses of epochs other
        than ``current`` another node recorded after ``reach_ms``: a node that owns slots when
        another records a loss must claim their recent past again too, for the recorder claims
        again only what it owns then, which it may hand on before claiming it (seed 951099)."""

    @abc.abstractmethod
    async def slot_marks(self) -> SlotMarks:
        """How far each slot was claimed and fired (by any node), and how far the cluster fired."""

    @abc.abstractmethod
    async def back(
        self, mark_ms: int | None, now_ms: int, outage_after_ms: int, node_id: str
    ) -> tuple[int, int] | None:
        """A node is ready to fire: decide, once for the whole cluster, whether no scheduler ran
        from ``mark_ms`` (how far the cluster had fired) until ``now_ms``, and record that outage.
        The decision is taken under a lock and leaves a mark of its own (a node fired from
        ``now_ms``), so that nodes coming back together, each by its own clock, never decide
        differently: the first one back decides for the others. Returns the outage recorded."""

    @abc.abstractmethod
    async def outages(self, since_ms: int) -> list[tuple[int, int]]:
        """Times when no scheduler ran, ending after ``since_ms``."""

    @abc.abstractmethod
    async def delete_completed(self, jobs: Sequence[tuple[str, int]]) -> list[str]:
        """Delete jobs, given as (id, version), that have nothing left to fire
        (delete_after_completion), each unless it changed since; returns the ids deleted."""

    # -- backfills: a lease (database time) says which owner of the job's slot drives one
    @abc.abstractmethod
    async def backfills(self) -> list[BackfillRow]:
        """Running backfills, and the cancelled ones whose executions may still retry (those of
        the last day, and longer while their job's retries can still come)."""

    async def backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
        """The backfills changed since ``cursor`` (None: from scratch), the cursor to pass next,
        and whether the rows are every backfill to know of (then what is not among them is gone).
        Rows may come without their timing document (``timing`` empty: see backfill_timing).
        This default, for a store with no change feed, reads them all every time."""
        return 0, await self.backfills(), True

    async def backfill_timing(self, backfill_id: str) -> str | None:
        """A backfill's timing document (when the rows came without it)."""
        return next((r.timing for r in await self.backfills() if r.id == backfill_id), None)

    @abc.abstractmethod
    async def lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        """Drive a running backfill nobody else drives: (cursor ms, executions dispatched), or None."""

    @abc.abstractmethod
    async def renew_backfill(
        self,
        backfill_id: str,
        holder: str,
        lease_ms: int,
        cursor_ms: int | None,
        dispatched: int,
        *,
        done: bool,
        release: bool,
    ) -> bool:
        """Record how far the driver got (even of a backfill cancelled meanwhile) and keep driving
        (False: no longer ours, or no longer running). ``done``: every execution is handed out;
        ``release``: stop driving (another owner may go on)."""

    @abc.abstractmethod
    async def end_backfill(self, backfill_id: str, reason: str) -> None:
        """Cancel a running backfill (its occurrences cannot be computed)."""

    @abc.abstractmethod
    async def end_orphaned_backfill(self, backfill_id: str) -> bool:
        """Cancel a running backfill if its job is gone (deleted, or deleted and created again),
        as the database says and not as a node's loaded jobs do (a slot taken over is owned
        before its jobs are loaded); False: its job lives, or the backfill is not running."""

    @abc.abstractmethod
    def write_history(self, rows: list[HistoryRow]) -> int:
        """Blocking: insert rows; returns how many were second deliveries. Raises TransientError
        when the database is unavailable."""


def decide_outage(
    mark_ms: int | None, last_ms: int | None, now_ms: int, outage_after_ms: int
) -> tuple[int, int] | None:
    """The outage a node back at ``now_ms`` records, if any: no scheduler ran since the later of
    how far the cluster fired (``mark_ms``) and the last outage or node back (``last_ms``)."""
    marks = [m for m in (mark_ms, last_ms) if m is not None]
    if not marks or now_ms - max(marks) <= outage_after_ms:
        return None
    return max(marks), now_ms


def bitmap(slots: Iterable[int], size: int) -> bytes:
    out = bytearray((size + 7) // 8)
    for s in slots:
        out[s >> 3] |= 1 << (s & 7)
    return bytes(out)


def bitmap_slots(data: bytes) -> list[int]:
    return [i * 8 + b for i, byte in enumerate(data) if byte for b in range(8) if byte >> b & 1]


# A row of one attempt ends up as the first one written, unless a later one replaces it (the
# history write's SQL, scheduler_node.store.history, keeps the same rule).
_ENDS = ("cancelled", "permanently_failed")


def replaces(old_status: str, new_status: str) -> bool:
    """Whether a row of ``new_status`` replaces one of ``old_status`` for the same attempt."""
    if new_status == "succeeded":
        return old_status != "succeeded"
    return new_status in _ENDS and old_status == "failed"


def one_row_per_attempt(batch: Iterable[HistoryRow]) -> list[HistoryRow]:
    """One row per attempt, as the database keeps them across batches: the first, unless a later
    one ``replaces`` it (a batch can hold a survivor's success, or its end, and the failure it
    recovered from the node that died, of the same attempt)."""
    seen: dict[tuple[str, int, int, int, str], HistoryRow] = {}
    for r in batch:
        old = seen.get(r.key)
        if old is None or replaces(old.status, r.status):
            seen[r.key] = r
    return list(seen.values())
