"""The simulated outside world of a node: Redis (claims and membership), PostgreSQL (jobs, the
feed, triggers, history, progress, outages) and the receivers, each with latency and the faults
the nemesis injects. The node code above them is the production code."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import random
from collections.abc import Callable, Collection, Coroutine, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from cronman.errors import TransientError
from cronman.model.execution import COMPLETION_TOKEN_HEADER, RUNNING, UPSTREAMS_HEADER, Trigger, execution_id
from cronman.model.hashing import slot_of
from cronman.model.namespaces import DEFAULT_NAMESPACE
from scheduler_node.claims.memory import ClaimSpace, MemoryClaims, _claim_key
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import Decoder, JobRow, Loaded
from scheduler_node.parts import (
    Beat,
    ClaimResult,
    Claims,
    Delivery,
    Finish,
    Hold,
    Member,
    Membership,
    Outcome,
    RenewResult,
    Sender,
    Swept,
    TakeState,
    Ticket,
    Took,
)
from scheduler_node.sim.loop import World
from scheduler_node.store import (
    AsyncRun,
    Attempts,
    BackfillRow,
    ClusterConfig,
    Ident,
    NodeStore,
    PayloadRow,
    RunStart,
    SlotMarks,
    TriggerRow,
    Upstreams,
    decide_outage,
    ends,
    one_row_per_attempt,
    replaces,
    slot_marks_of,
)

# isort: split
# (after scheduler_node.store: imported first, scheduler_node.dependencies meets the store's
# package half made, whose history module imports it back)
from scheduler_node.dependencies import Fire, Wait, advance, counts_upstream  # noqa: E402

LATENCY = 0.001  # a round trip to Redis or PostgreSQL


@dataclass
class Spells:
    """Slow spells of a server (a Redis busy with a slow command or a fork, a PostgreSQL behind a
    checkpoint or a lock): while one lasts, each way of a round trip takes up to its worst extra
    seconds more, drawn from a generator of their own (so that a run without spells draws nothing)."""

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    spans: list[tuple[float, float, float]] = field(default_factory=list)  # (start, end, worst extra s)

    def extra(self, now: float) -> float:
        for start, end, worst in self.spans:
            if start <= now < end:
                return self.rng.uniform(0.0, worst)
        return 0.0


# --------------------------------------------------------------------------- Redis
@dataclass
class SimRedis:
    """One Redis server: claims and membership, down (unreachable) until a time, or emptied."""

    world: World
    space: ClaimSpace = field(init=False)
    members: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # id -> (expires, beat, info)
    standings: dict[str, str] = field(default_factory=dict)  # id -> standing (scheduler_node.standby)
    down_until: float = 0.0
    cut: dict[str, float] = field(default_factory=dict)  # node id -> unreachable from it until
    losses: list[float] = field(default_factory=list)  # when it lost everything
    epoch: str = ""
    progress: int | None = None
    slow: Spells = field(default_factory=Spells)
    # spells in which each claim call's answer is lost with some probability (the call applied):
    # (start, end, probability), drawn from a generator of their own
    flaky: list[tuple[float, float, float]] = field(default_factory=list)
    flaky_rng: random.Random = field(default_factory=lambda: random.Random(0))
    # the membership's calls too (heartbeats, standings, leaving): only where the run says so
    members_flaky: bool = False
    # claims taken over from another holder: (when, claim name, from holder, by holder), so that
    # the checks can tell a lease that ran out from an attempt number gone stale
    takeovers: list[tuple[float, str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.space = ClaimSpace(now=self.now_ms)

    async def half(self) -> None:
        """One way of a round trip."""
        await asyncio.sleep(LATENCY / 2 + self.slow.extra(self.world.now))

    def now_ms(self) -> int:
        return int(self.world.now * 1000)

    def lose_everything(self) -> None:
        self.space.lose_everything()
        self.members.clear()
        self.standings.clear()
        self.epoch = ""
        self.progress = None
        self.losses.append(self.world.now)

    def lost(self, node: str) -> bool:
        """Whether a call's answer is lost on its way back: Redis went away meanwhile, or a spell
        of lost answers drew it."""
        if self.world.now < max(self.down_until, self.cut.get(node, 0.0)):
            return True
        return any(start <= self.world.now < end and self.flaky_rng.random() < p for start, end, p in self.flaky)

    async def answer(self, node: str) -> None:
        """A membership call's way back (see ``members_flaky``)."""
        await self.half()
        if self.members_flaky and self.lost(node):
            raise TransientError("redis: connection reset (the answer was lost)")

    async def call(self, node: str = "") -> None:
        """The request's way there; raises while Redis is unreachable (after a timeout), for
        every node or for ``node`` (cut off from it)."""
        if self.world.now < max(self.down_until, self.cut.get(node, 0.0)):
            await asyncio.sleep(0.5)
            raise TransientError("redis: connection refused")
        await self.half()
        if self.world.now < max(self.down_until, self.cut.get(node, 0.0)):
            raise TransientError("redis: connection reset")


class SimClaims(Claims):
    """:class:`MemoryClaims` on a :class:`SimRedis`: each call reaches Redis after half a round
    trip, is applied there at once, and its answer comes back after the other half (so a process
    paused or killed meanwhile leaves the change made and the answer unread, and Redis going away
    meanwhile leaves it made and the caller with an error)."""

    def __init__(self, redis: SimRedis, holder: str, keep_ms: int) -> None:
        self.redis = redis
        self.holder = holder
        self.node = holder.split("/")[0]
        self.inner = MemoryClaims(redis.space, holder, keep_ms)

    async def _after(self) -> None:
        """The answer's way back: lost when Redis became unreachable meanwhile (the change is made,
        the caller gets an error, as a client whose connection broke after sending)."""
        await self.redis.half()
        if self.redis.lost(self.node):
            raise TransientError("redis: connection reset (the answer was lost)")

    async def claim(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[ClaimResult]:
        await self.redis.call(self.node)
        out = await self.inner.claim(tickets, lease_ms, unanswered)
        await self._after()
        return out

    async def renew(self, holds: Sequence[Hold]) -> list[RenewResult]:
        await self.redis.call(self.node)
        out = await self.inner.renew(holds)
        await self._after()
        return out

    async def done(self, finishes: Sequence[Finish]) -> list[bool]:
        await self.redis.call(self.node)
        out = await self.inner.done(finishes)
        await self._after()
        return out

    async def take(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[Took]:
        await self.redis.call(self.node)
        space = self.redis.space
        before = [space.get(_claim_key(t)) for t in tickets]
        out = await self.inner.take(tickets, lease_ms, unanswered)
        for t, value, took in zip(tickets, before, out, strict=True):
            if took.state is TakeState.TAKEN and value is not None and value.startswith("c|"):
                previous = value.split("|")[1]
                if previous != self.holder:
                    self.redis.takeovers.append((self.redis.world.now, t.name, previous, self.holder))
        await self._after()
        return out

    async def sweep(self, slots: Sequence[int], limit: int, unrecorded_age_ms: int) -> Swept:
        await self.redis.call(self.node)
        out = await self.inner.sweep(slots, limit, unrecorded_age_ms)
        await self._after()
        return out

    async def recorded(self, rows: Sequence[tuple[int, str]]) -> None:
        await self.redis.call(self.node)
        await self.inner.recorded(rows)
        await self._after()


class SimMembership(Membership):
    def __init__(self, redis: SimRedis, node_id: str, ttl_ms: int) -> None:
        self.redis = redis
        self.node_id = node_id
        self.ttl_ms = ttl_ms

    async def beat(self, info: dict[str, Any], progress_ms: int | None = None) -> Beat:
        await self.redis.call(self.node_id)
        now = self.redis.now_ms()
        self.redis.members[self.node_id] = (now + self.ttl_ms, now, json.dumps(info))
        if not self.redis.epoch:
            self.redis.epoch = f"e{len(self.redis.losses)}"
        if progress_ms is not None and progress_ms > (self.redis.progress or 0):
            self.redis.progress = progress_ms
        beat = Beat(self.redis.epoch, self.redis.progress)
        await self.redis.answer(self.node_id)
        return beat

    async def live(self) -> list[Member]:
        await self.redis.call(self.node_id)
        now = self.redis.now_ms()
        out = []
        for node_id in sorted(self.redis.members):
            expires, beat, info_text = self.redis.members[node_id]
            if expires < now:
                del self.redis.members[node_id]
                continue
            info = json.loads(info_text)
            out.append(Member(node_id, (now - beat) / 1000, bool(info.get("ready")), info))
        await self.redis.answer(self.node_id)
        return out

    async def leave(self) -> None:
        await self.redis.call(self.node_id)
        self.redis.members.pop(self.node_id, None)
        self.redis.standings.pop(self.node_id, None)
        await self.redis.answer(self.node_id)

    async def stand(self, standing: str | None) -> dict[str, str]:
        await self.redis.call(self.node_id)
        if standing is None:
            self.redis.standings.pop(self.node_id, None)
        else:
            self.redis.standings[self.node_id] = standing
        out = dict(self.redis.standings)
        await self.redis.answer(self.node_id)
        return out


# --------------------------------------------------------------------------- PostgreSQL
T = TypeVar("T")
A = ParamSpec("A")


@dataclass
class SimJob:
    id: str
    slot: int
    version: int
    incarnation: int
    namespace: str
    schedule: dict[str, Any]
    target: dict[str, Any]
    payload: str
    retry: dict[str, Any]
    options: dict[str, Any]
    paused: bool = False
    deleted: bool = False
    updated_ms: int = 0
    change: int = 0
    created_ms: int = 0  # when this incarnation was created

    def row(self) -> JobRow:
        return JobRow(
            self.id,
            self.slot,
            self.version,
            json.dumps(self.schedule),
            json.dumps(self.target),
            self.payload,
            json.dumps(self.retry),
            self.paused,
            self.updated_ms,
            self.namespace,
            json.dumps(self.options),
            self.incarnation,
            self.deleted,
            self.change,
        )


@dataclass
class Progress:
    """A row of node_progress."""

    fired_through: int
    slots: bytes
    epoch: str | None
    firing_through: int
    updated_ms: int = 0
    open_from: int | None = None  # the earliest scheduled time of its open work (see NodeStore.save_progress)

    @property
    def reach(self) -> int:
        """How far back a loss of Redis's data after this node is gone reaches for it."""
        return self.fired_through if self.open_from is None else min(self.fired_through, self.open_from)


@dataclass
class SimDb:
    """The database: what the API would have written, what nodes write; down until a time."""

    world: World
    slots: int
    jobs: dict[str, SimJob] = field(default_factory=dict)
    triggers: list[tuple[int, TriggerRow, int]] = field(default_factory=list)  # (change, row, slot)
    history: dict[tuple[str, int, int, int, str], HistoryRow] = field(default_factory=dict)
    duplicates: dict[tuple[str, int, int, int, str], int] = field(default_factory=dict)
    # executions a skip row was ever written for, with its reason (a later success replaces the row)
    skips: dict[str, str] = field(default_factory=dict)
    progress: dict[tuple[str, str], Progress] = field(default_factory=dict)
    lost_epochs: dict[str, int] = field(default_factory=dict)  # epoch -> since (ms)
    lost_at: dict[str, int] = field(default_factory=dict)  # epoch -> when its loss was first recorded (ms)
    outages: list[tuple[int, int]] = field(default_factory=list)
    backs: list[int] = field(default_factory=list)  # when a node was back and found no outage
    backfills: dict[str, SimBackfill] = field(default_factory=dict)
    down_until: float = 0.0
    cut: dict[str, float] = field(default_factory=dict)  # node id -> unreachable from it until
    hang_until: float = 0.0  # no answer (nor error) to any round trip before then
    slow: Spells = field(default_factory=Spells)
    # spells in which each round trip's answer is lost with some probability, the change made (a
    # connection broken after the commit): (from, to, probability), drawn from flaky_rng
    flaky: list[tuple[float, float, float]] = field(default_factory=list)
    flaky_rng: random.Random = field(default_factory=lambda: random.Random(0))
    answers_lost: int = 0
    polls: dict[str, list[float]] = field(default_factory=dict)  # holder -> when its feed reads succeeded
    change: int = 1
    backfill_change: int = 1  # the backfills' change feed (their change_xid)
    version: int = 1
    incarnations: int = 1
    trigger_ids: int = 1
    # What executions wait for (scheduler_node.waits): asynchronous work's runs by execution id
    # [attempt, status, started ms, deadline ms, timeout ms, heartbeat ms, reported ms, output,
    # token hash], the latest success of each job, the upstreams executions followed.
    runs: dict[str, list[Any]] = field(default_factory=dict)
    last_success: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    upstreams: dict[str, Upstreams] = field(default_factory=dict)
    # The after jobs' waits by (namespace, downstream), and each application of upstream ends to
    # one (the checks' record): (when, namespace, downstream, the ends in order, the fires made).
    waits: dict[tuple[str, str], Wait] = field(default_factory=dict)
    applied: list[tuple[int, str, str, list[tuple[str, HistoryRow]], list[Fire]]] = field(default_factory=list)
    # every success of a job others depend on, when it was written: (world s, namespace, job, row)
    successes: list[tuple[float, str, str, HistoryRow]] = field(default_factory=list)
    _edges: tuple[int, list[tuple[str, str, str, str, int]]] = (-1, [])

    def now_ms(self) -> int:
        return int(self.world.now * 1000)

    def run_of(self, execution_id: str) -> AsyncRun | None:
        r = self.runs.get(execution_id)
        if r is None:
            return None
        return AsyncRun(r[0], r[1], r[2], r[3] - self.now_ms(), r[6], r[7])

    # -- what the API does
    def put_job(self, job_id: str, **doc: Any) -> SimJob:
        old = self.jobs.get(job_id)
        self.version += 1
        self.change += 1
        if old is None or old.deleted:
            self.incarnations += 1
            incarnation = self.incarnations
        else:
            incarnation = old.incarnation
        job = SimJob(
            job_id,
            slot_of(job_id, self.slots),
            self.version,
            incarnation,
            doc.get("namespace", "default"),
            doc["schedule"],
            doc["target"],
            json.dumps(doc.get("payload", {})),
            doc.get("retry", {"max_attempts": 3, "backoff_seconds": 0.5, "max_backoff_seconds": 4}),
            doc.get("options", {}),
            doc.get("paused", False),
            False,
            self.now_ms(),
            self.change,
        )
        job.created_ms = self.now_ms() if old is None or old.deleted else old.created_ms
        self.jobs[job_id] = job
        return job

    def change_job(self, job_id: str, **changes: Any) -> SimJob:
        job = self.jobs[job_id]
        self.version += 1
        self.change += 1
        for k, v in changes.items():
            setattr(job, k, v)
        job.version, job.change, job.updated_ms = self.version, self.change, self.now_ms()
        return job

    def backfill(self, backfill_id: str, job_id: str, from_ms: int, to_ms: int, rate: float) -> None:
        """A backfill as the API writes it (cronman.store.backfill_store)."""
        job = self.jobs[job_id]
        events = int(job.options.get("events_per_trigger") or 1)
        timing = json.dumps({"schedule": job.schedule, "calendars": []})
        row = BackfillRow(
            backfill_id,
            job_id,
            job.incarnation,
            from_ms,
            to_ms,
            rate,
            events,
            timing,
            "running",
            None,
            0,
            None,
            job.namespace,
        )
        self.backfills[backfill_id] = SimBackfill(row)
        self.backfill_changed(backfill_id, "running")

    def backfill_changed(self, backfill_id: str, state: str) -> None:
        """A backfill created, cancelled or all handed out: its row moves in the change feed."""
        b = self.backfills[backfill_id]
        self.backfill_change += 1
        b.row, b.change = replace(b.row, state=state), self.backfill_change

    def trigger(self, job_id: str) -> TriggerRow:
        job = self.jobs[job_id]
        self.change += 1
        self.trigger_ids += 1
        row = TriggerRow(self.trigger_ids, job_id, self.now_ms(), incarnation=job.incarnation)
        self.triggers.append((self.change, row, job.slot))
        return row

    # -- what nodes do
    def _down(self, node: str) -> bool:
        return self.world.now < max(self.down_until, self.cut.get(node, 0.0))

    async def call(self, node: str = "") -> None:
        if self.world.now < self.hang_until:
            await asyncio.sleep(self.hang_until - self.world.now)
        if self._down(node):
            await asyncio.sleep(1.0)
            raise TransientError("database: connection refused")
        await asyncio.sleep(LATENCY + self.slow.extra(self.world.now))
        if self._down(node):
            raise TransientError("database: server closed the connection unexpectedly")

    def answer(self) -> None:
        """The answer's way back: lost in a spell of lost answers (what was asked is done)."""
        for start, end, p in self.flaky:
            if start <= self.world.now < end and self.flaky_rng.random() < p:
                self.answers_lost += 1
                raise TransientError("database: server closed the connection unexpectedly (the answer was lost)")

    def write(self, rows: list[HistoryRow], node: str = "") -> int:
        if self._down(node):
            raise TransientError("database: connection refused")
        # (only when some job waits for another: the other runs pay nothing for it)
        written = one_row_per_attempt(rows) if self.edges() else []
        dups = self._write(rows)
        # In the same transaction, as scheduler_node.store.dependencies does: every row written, each
        # upstream execution counted once (seeds 9000032, 9000066).
        if written:
            self._depend(written)
        self.answer()
        return dups

    # -- jobs that wait for other jobs, as scheduler_node.store.dependencies applies new rows
    def edges(self) -> list[tuple[str, str, str, str, int]]:
        """job_dependencies as the API keeps it from the live jobs' documents: (namespace, upstream,
        downstream, kind, within ms), in the order PostgreSQL reads them."""
        if self._edges[0] != self.version:
            out = []
            for job in self.jobs.values():
                if job.deleted:
                    continue
                if job.schedule.get("type") == "after":
                    within = int(job.schedule.get("within_seconds", 86400)) * 1000
                    out += [(job.namespace, u, job.id, "after", within) for u in set(job.schedule["jobs"])]
                req = job.options.get("require")
                if req and req.get("jobs"):
                    within = int(req.get("within_seconds", 86400)) * 1000
                    out += [(job.namespace, u, job.id, "require", within) for u in set(req["jobs"])]
            self._edges = (self.version, sorted(out, key=lambda e: (e[0], e[2], e[1])))
        return self._edges[1]

    def _depend(self, written: list[HistoryRow]) -> None:
        rows = [r for r in written if counts_upstream(r)]
        if not rows:
            return
        ns_of = {id(r): r.namespace or DEFAULT_NAMESPACE for r in rows}
        keys = {(ns_of[id(r)], r.job_id) for r in rows}
        edges = [e for e in self.edges() if (e[0], e[1]) in keys]
        if not edges:
            return
        latest = {
            (ns_of[id(r)], r.job_id): r
            for r in sorted(rows, key=lambda r: r.finished_ms or 0)
            if r.status == "succeeded"
        }
        for k, r in sorted(latest.items()):
            self.successes.append((self.world.now, k[0], k[1], r))
            ms = r.finished_ms or r.scheduled_ms
            if k not in self.last_success or ms >= self.last_success[k][1]:
                self.last_success[k] = (r.execution_id, ms)
        downstreams: dict[tuple[str, str], set[str]] = {}
        for ns, upstream, downstream, kind, _ in edges:
            if kind == "after":
                downstreams.setdefault((ns, downstream), set()).add(upstream)
        for (ns, downstream), ups in sorted(downstreams.items()):
            ends = sorted(
                ((r.job_id, r) for r in rows if ns_of[id(r)] == ns and r.job_id in ups),
                key=lambda end: (end[1].finished_ms or 0, end[1].execution_id),
            )
            self._advance(ns, downstream, ends)

    def _advance(self, ns: str, downstream: str, ends: list[tuple[str, HistoryRow]]) -> None:
        wait = self.waits.setdefault((ns, downstream), Wait())
        job = self.jobs.get(downstream)
        if job is None or job.deleted or job.namespace != ns or job.schedule.get("type") != "after":
            return  # no longer an after job (or gone): nothing to fire
        upstreams = tuple(sorted({u for n, u, d, kind, _ in self.edges() if (n, d, kind) == (ns, downstream, "after")}))
        within_ms = int(job.schedule.get("within_seconds", 86400)) * 1000
        now = self.now_ms()
        # (what is recorded as applied is what counts: an upstream execution counted before is not)
        seen: set[tuple[str, str, bool]] = set()
        ends = [
            (u, r)
            for u, r in ends
            if not wait.counted(u, r)
            and (u, r.execution_id, r.status == "succeeded") not in seen
            and not seen.add((u, r.execution_id, r.status == "succeeded"))  # type: ignore[func-returns-value]
        ]
        fires = advance(wait, upstreams, within_ms, ends, now)
        self.applied.append((now, ns, downstream, ends, fires))
        for f in fires:
            self.change += 1
            self.trigger_ids += 1
            row = TriggerRow(self.trigger_ids, downstream, f.requested_ms, kind="after", incarnation=job.incarnation)
            self.triggers.append((self.change, row, job.slot))
            self.upstreams.setdefault(execution_id(downstream, f.requested_ms, 0, Trigger.AFTER), f.upstreams)

    # -- what the API's :complete does (POST /v1/executions/{id}:complete with the token)
    def complete(self, execution_id: str, token: str, status: str, output: str | None) -> str:
        """The work's end, reported with its token: "applied", or why not ("unavailable": the
        database cannot be reached, the work tries again)."""
        if self._down("") or self.world.now < self.hang_until:
            return "unavailable"
        r = self.runs.get(execution_id)
        if r is None:
            return "unknown execution"
        if r[8] != hashlib.sha256(token.encode()).digest():
            return "another attempt's token"
        if r[1] != RUNNING:
            return f"already {r[1]}"
        now = self.now_ms()
        if now >= r[3]:
            return "past its deadline"
        r[1], r[6], r[7] = status, now, output
        return "applied"

    def _write(self, rows: list[HistoryRow]) -> int:
        dups = 0
        for r in rows:
            if r.status == "skipped":
                self.skips.setdefault(r.execution_id, r.error or "")
            old = self.history.get(r.key)
            if old is None:
                self.history[r.key] = r
            elif r.status not in ("skipped", "cancelled") and (old.node, old.fired_ms) != (r.node, r.fired_ms):
                self.duplicates[r.key] = self.duplicates.get(r.key, 0) + 1
                dups += 1
            if old is not None and replaces(old.status, r.status):
                self.history[r.key] = r  # as the store does (a success, or an end over a failure)
        return dups


@dataclass
class SimBackfill:
    """A backfill row: what the API wrote, and the lease and cursor its driver keeps."""

    row: BackfillRow
    driver: str | None = None
    lease_until: int = 0
    change: int = 0  # when it was created, cancelled or all handed out (SimDb.backfill_change)


def _answered(
    fn: Callable[Concatenate[SimStore, A], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SimStore, A], Coroutine[Any, Any, T]]:
    """A store call whose answer may be lost on its way back (SimDb.answer), what it did done."""

    @functools.wraps(fn)
    async def call(self: SimStore, *args: A.args, **kwargs: A.kwargs) -> T:
        out = await fn(self, *args, **kwargs)
        self.db.answer()
        return out

    return call


class SimStore(NodeStore):
    def __init__(self, db: SimDb, holder: str = "") -> None:
        self.db = db
        self.holder = holder
        self.node = holder.split("/")[0]

    @_answered
    async def load_slots(self, slots: Sequence[int], decoder: Decoder) -> tuple[int, Loaded]:
        await self.db.call(self.node)
        wanted = set(slots)
        out = Loaded()
        for job in sorted(self.db.jobs.values(), key=lambda j: j.id):
            if job.slot in wanted and not job.deleted:
                out.add(decoder.job(job.row()), job.updated_ms)
        return self.db.change + 1, out

    async def poll_changes(
        self, cursor: int, slots: Collection[int] | None = None
    ) -> tuple[int, list[JobRow], list[TriggerRow]]:
        await self.db.call(self.node)
        now = self.db.world.now
        wanted = None if slots is None else set(slots)
        jobs = sorted(self.db.jobs.values(), key=lambda j: j.change)
        rows = [j.row() for j in jobs if j.change >= cursor and (wanted is None or j.slot in wanted)]
        triggers = [t for c, t, slot in self.db.triggers if c >= cursor and (wanted is None or slot in wanted)]
        self.db.answer()
        self.db.polls.setdefault(self.holder, []).append(now)  # a read the node got (the checker's)
        return self.db.change + 1, rows, triggers

    @_answered
    async def recent_triggers(self, slots: Sequence[int], since_ms: int) -> list[TriggerRow]:
        await self.db.call(self.node)
        wanted = set(slots)
        return [t for _, t, slot in self.db.triggers if slot in wanted and t.requested_ms > since_ms]

    @_answered
    async def attempts(self, idents: Sequence[Ident]) -> dict[Ident, Attempts]:
        await self.db.call(self.node)
        wanted = set(idents)
        found: dict[Ident, Attempts] = {}
        for (job_id, ms, ev, attempt, trigger), row in self.db.history.items():
            ident = (job_id, ms, ev, trigger)
            if ident in wanted:
                old = found.get(ident, Attempts(0, False))
                final = row.status in ("succeeded", "permanently_failed", "skipped", "cancelled")
                ended = (old.final and not old.only_skipped) or ends(row.status, row.error)
                last = max(old.last_attempt, attempt)
                found[ident] = Attempts(last, old.final or final, (old.final or final) and not ended)
        return found

    @_answered
    async def live_incarnations(self, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        await self.db.call(self.node)
        jobs = self.db.jobs
        return {i: (jobs[i].incarnation, jobs[i].created_ms) for i in job_ids if i in jobs and not jobs[i].deleted}

    @_answered
    async def payloads(self, job_ids: Sequence[str]) -> dict[str, PayloadRow]:
        await self.db.call(self.node)
        jobs = self.db.jobs
        return {
            i: PayloadRow(jobs[i].version, jobs[i].incarnation, jobs[i].payload.encode())
            for i in job_ids
            if i in jobs and not jobs[i].deleted
        }

    @_answered
    async def cluster_config(self) -> ClusterConfig:
        await self.db.call(self.node)
        return ClusterConfig({}, {})

    @_answered
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
        await self.db.call(self.node)
        db = self.db
        ms = fired_through_ms
        if epoch is not None and epoch in db.lost_epochs:
            ms = min(ms, db.lost_epochs[epoch])
        old = db.progress.get((node_id, incarnation))
        if old is not None and old.epoch == epoch:
            ms = max(ms, old.fired_through)
        firing = max(fired_through_ms, firing_ms if firing_ms is not None else fired_through_ms)
        if old is not None:
            firing = max(firing, old.firing_through)
        db.progress[(node_id, incarnation)] = Progress(ms, slots, epoch, firing, db.now_ms(), open_ms)

    @_answered
    async def lose_epoch(
        self,
        epoch: str,
        current: str,
        since_ms: int,
        node_id: str,
        reach_ms: int | None = None,
        live: Collection[str] = (),
    ) -> int:
        await self.db.call(self.node)
        db = self.db
        since_ms = self._after_earlier(epoch, since_ms, reach_ms)
        if reach_ms is not None and reach_ms < since_ms:
            gone = [
                p.reach
                for (_, incarnation), p in db.progress.items()
                if p.epoch == epoch and p.updated_ms > reach_ms and incarnation not in live
            ]
            if gone:
                since_ms = max(reach_ms, min(since_ms, *gone))
        return self._lose(epoch, current, since_ms)

    def _after_earlier(self, epoch: str, since_ms: int, reach_ms: int | None) -> int:
        """No later than another loss recorded after ``reach_ms`` (see NodeStore.lose_epoch)."""
        if reach_ms is None or reach_ms >= since_ms:
            return since_ms
        db = self.db
        earlier = [t for e, t in db.lost_epochs.items() if e != epoch and db.lost_at.get(e, 0) > reach_ms]
        return min(since_ms, max(reach_ms, min(earlier))) if earlier else since_ms

    def _lose(self, epoch: str, current: str, since_ms: int) -> int:
        db = self.db
        since_ms = db.lost_epochs[epoch] = min(since_ms, db.lost_epochs.get(epoch, since_ms))
        db.lost_at.setdefault(epoch, db.now_ms())
        for p in db.progress.values():
            if p.epoch != current and p.fired_through > since_ms:
                p.firing_through = max(p.firing_through, p.fired_through)
                p.fired_through = since_ms
        return since_ms

    @_answered
    async def unnoticed_losses(
        self, current: str, reach_ms: int, margin_ms: int, node_id: str
    ) -> list[tuple[str, int]]:
        await self.db.call(self.node)
        epochs: dict[str, tuple[int, int]] = {}
        for p in self.db.progress.values():
            if p.epoch is None or p.epoch == current or p.updated_ms <= reach_ms or p.epoch in self.db.lost_epochs:
                continue
            last, least = epochs.get(p.epoch, (p.updated_ms, p.reach))
            epochs[p.epoch] = (max(last, p.updated_ms), min(least, p.reach))
        out = []
        for epoch, (last, least) in sorted(epochs.items()):
            since = max(reach_ms, min(last - margin_ms, least))
            out.append((epoch, self._lose(epoch, current, self._after_earlier(epoch, since, reach_ms))))
        found = {e for e, _ in out}
        for epoch, since in sorted(self.db.lost_epochs.items()):
            if epoch != current and epoch not in found and self.db.lost_at.get(epoch, 0) > reach_ms:
                out.append((epoch, since))  # recorded lately by another node (see NodeStore)
        return out

    @_answered
    async def slot_marks(self) -> SlotMarks:
        await self.db.call(self.node)
        return slot_marks_of(
            (p.fired_through, max(p.firing_through, p.fired_through), p.slots) for p in self.db.progress.values()
        )

    @_answered
    async def back(
        self, mark_ms: int | None, now_ms: int, outage_after_ms: int, node_id: str
    ) -> tuple[int, int] | None:
        await self.db.call(self.node)
        last = max([b for _, b in self.db.outages] + self.db.backs, default=None)
        outage = decide_outage(mark_ms, last, now_ms, outage_after_ms)
        if outage is None:
            self.db.backs.append(now_ms)
        else:
            self.db.outages.append(outage)
        return outage

    @_answered
    async def outages(self, since_ms: int) -> list[tuple[int, int]]:
        await self.db.call(self.node)
        return sorted((a, b) for a, b in self.db.outages if b > since_ms)

    @_answered
    async def delete_completed(self, jobs: Sequence[tuple[str, int]]) -> list[str]:
        await self.db.call(self.node)
        deleted = []
        for job_id, version in sorted(set(jobs)):
            job = self.db.jobs.get(job_id)
            if job is None or job.version != version or job.deleted:
                continue
            self.db.change_job(job_id, deleted=True)
            deleted.append(job_id)
        return deleted

    @_answered
    async def backfills(self) -> list[BackfillRow]:
        await self.db.call(self.node)
        out = []
        for b in self.db.backfills.values():
            job = self.db.jobs.get(b.row.job_id)
            live = None if job is None or job.deleted else job.incarnation
            out.append(replace(b.row, live_incarnation=live))
        return out

    @_answered
    async def backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
        """As PostgreSQL serves them: without a cursor the running and the cancelled backfills,
        then those changed since; light rows (no timing document), the job's liveness as of now."""
        await self.db.call(self.node)
        out = []
        for b in self.db.backfills.values():
            if (b.row.state in ("running", "cancelled")) if cursor is None else b.change >= cursor:
                job = self.db.jobs.get(b.row.job_id)
                live = None if job is None or job.deleted else job.incarnation
                out.append(replace(b.row, timing="", live_incarnation=live))
        return self.db.backfill_change + 1, out, cursor is None

    @_answered
    async def backfill_timing(self, backfill_id: str) -> str | None:
        await self.db.call(self.node)
        b = self.db.backfills.get(backfill_id)
        return None if b is None else b.row.timing

    @_answered
    async def lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        await self.db.call(self.node)
        b = self.db.backfills.get(backfill_id)
        now = self.db.now_ms()
        if b is None or b.row.state != "running" or (b.driver not in (None, holder) and b.lease_until >= now):
            return None
        b.driver, b.lease_until = holder, now + lease_ms
        return b.row.cursor_ms, b.row.dispatched

    @_answered
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
        await self.db.call(self.node)
        b = self.db.backfills.get(backfill_id)
        if b is None or b.driver != holder:
            return False
        running = b.row.state == "running"
        cursor = b.row.cursor_ms if cursor_ms is None else max(cursor_ms, b.row.cursor_ms or cursor_ms)
        b.row = replace(b.row, cursor_ms=cursor, dispatched=max(dispatched, b.row.dispatched))
        if done and running:
            self.db.backfill_changed(backfill_id, "dispatched")
        b.lease_until = self.db.now_ms() + (0 if release else lease_ms)
        if release or not running or done:
            b.driver = None
        return running

    @_answered
    async def end_backfill(self, backfill_id: str, reason: str) -> None:
        await self.db.call(self.node)
        b = self.db.backfills.get(backfill_id)
        if b is not None and b.row.state == "running":
            b.driver = None
            self.db.backfill_changed(backfill_id, "cancelled")

    @_answered
    async def end_orphaned_backfill(self, backfill_id: str) -> bool:
        await self.db.call(self.node)
        b = self.db.backfills.get(backfill_id)
        if b is None or b.row.state != "running":
            return False
        job = self.db.jobs.get(b.row.job_id)
        if job is not None and not job.deleted and job.incarnation == b.row.incarnation:
            return False
        b.driver = None
        self.db.backfill_changed(backfill_id, "cancelled")
        return True

    # -- what executions wait for
    @_answered
    async def start_runs(self, runs: Sequence[RunStart]) -> dict[str, tuple[bool, AsyncRun]]:
        await self.db.call(self.node)
        now, out = self.db.now_ms(), {}
        for r in runs:
            old = self.db.runs.get(r.execution_id)
            if old is None or (old[0] < r.attempt and old[1] != "succeeded"):
                beat = r.heartbeat_ms or r.timeout_ms
                self.db.runs[r.execution_id] = [
                    r.attempt,
                    "running",
                    now,
                    now + min(r.timeout_ms, beat),
                    now + r.timeout_ms,
                    r.heartbeat_ms,
                    None,
                    None,
                    r.token_hash,
                ]
                started = True
            else:
                started = False
            run = self.db.run_of(r.execution_id)
            assert run is not None
            out[r.execution_id] = (started, run)
        return out

    @_answered
    async def async_runs(self, execution_ids: Sequence[str]) -> dict[str, AsyncRun]:
        await self.db.call(self.node)
        return {i: run for i in execution_ids if (run := self.db.run_of(i)) is not None}

    @_answered
    async def time_out_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        await self.db.call(self.node)
        now = self.db.now_ms()
        for i, attempt in items:
            r = self.db.runs.get(i)
            if r is not None and r[0] == attempt and r[1] == "running" and r[3] <= now:
                r[1], r[6] = "timed_out", now
        return {i: run for i, _ in items if (run := self.db.run_of(i)) is not None}

    @_answered
    async def unaccept_runs(self, items: Sequence[tuple[str, int]]) -> dict[str, AsyncRun]:
        await self.db.call(self.node)
        now = self.db.now_ms()
        for i, attempt in items:
            r = self.db.runs.get(i)
            if r is not None and r[0] == attempt and r[1] == "running":
                r[1], r[6] = "unaccepted", now
        return {i: run for i, _ in items if (run := self.db.run_of(i)) is not None}

    @_answered
    async def last_successes(self, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, int]]:
        await self.db.call(self.node)
        return {k: self.db.last_success[k] for k in wanted if k in self.db.last_success}

    @_answered
    async def upstreams_of(self, execution_ids: Sequence[str]) -> dict[str, Upstreams]:
        await self.db.call(self.node)
        return {i: self.db.upstreams[i] for i in execution_ids if i in self.db.upstreams}

    @_answered
    async def record_upstreams(self, rows: Sequence[tuple[str, str, str, Upstreams]]) -> None:
        await self.db.call(self.node)
        for eid, _, _, ups in rows:
            self.db.upstreams.setdefault(eid, ups)

    def write_history(self, rows: list[HistoryRow]) -> int:
        return self.db.write(rows, self.node)


# --------------------------------------------------------------------------- receivers
@dataclass(frozen=True, slots=True)
class SimTarget:
    receiver: str
    timeout: float
    kind: str = "http"


@dataclass
class Arrival:
    """A request that reached a receiver."""

    at: float
    node: str
    holder: str
    job_id: str
    execution_id: str
    scheduled_ms: int
    attempt: int
    ok: bool
    upstream_ids: str | None = None  # the Cronman-Upstream-Execution-Ids header, if sent
    payload: bytes = b""  # what it carried


@dataclass
class Work:
    """Asynchronous work a receiver accepted: what it will report, when (never: None), and what
    the API answered each time it reported (the last answer last)."""

    accepted: float
    execution_id: str
    job_id: str
    attempt: int
    token: str | None
    status: str
    report_at: float | None
    answers: list[tuple[float, str]] = field(default_factory=list)

    def applied_at(self) -> float | None:
        return next((t for t, a in self.answers if a == "applied"), None)


@dataclass
class Receivers:
    """Every receiver's behaviour and everything that reached them. Behaviours: ``ok``;
    ``fail_first`` (the first attempt of each execution fails); ``flaky`` (fails one time in
    three, decided by the seed); ``slow`` (answers after 3 s); ``async`` (a receiver of
    asynchronous work: accepts nine requests in ten, one in twenty only after 3 s, and its work
    reports its end through the API later, or never: see accept_work)."""

    world: World
    rng: Any
    behaviour: dict[str, str] = field(default_factory=dict)
    arrivals: list[Arrival] = field(default_factory=list)
    # asynchronous work: the database its reports reach (as the API's :complete writes it), the
    # draws of its fate (a generator of their own), and every piece of work accepted
    db: SimDb | None = None
    work_rng: random.Random = field(default_factory=lambda: random.Random(0))
    works: list[Work] = field(default_factory=list)

    def answer(self, receiver: str, attempt: int) -> tuple[bool, float]:
        kind = self.behaviour.get(receiver, "ok")
        if kind == "async":
            return self.work_rng.random() > 0.1, (3.0 if self.work_rng.random() < 0.05 else 0.002)
        if kind == "fail_first":
            return attempt > 1, 0.005
        if kind == "flaky":
            return self.rng.random() > 0.33, 0.005
        if kind == "slow":
            return True, 3.0
        return True, 0.002

    def accept_work(self, delivery: Delivery) -> None:
        """An accepted request of asynchronous work: it ends later, within 0.2 to 1.3 times its
        completion timeout (so sometimes past its deadline), as a success (three in four) or a
        failure, or never (one in ten); it reports with the token its request carried, and tries
        again each second while the database is away."""
        assert self.db is not None
        rng, now = self.work_rng, self.world.now
        job = self.db.jobs.get(delivery.job_id)
        timeout = float((job.options.get("completion") or {}).get("timeout_seconds", 10)) if job else 10.0
        fate = rng.random()
        status = "failed" if fate < 0.25 else "succeeded"
        at = None if fate < 0.1 else now + rng.uniform(0.2, 1.3 * timeout)
        token = dict(delivery.extra).get(COMPLETION_TOKEN_HEADER)
        work = Work(now, delivery.execution_id, delivery.job_id, delivery.attempt, token, status, at)
        self.works.append(work)
        if at is not None and token is not None:
            self.world.at(at, functools.partial(self._report, work, 0))

    def _report(self, work: Work, tries: int) -> None:
        assert self.db is not None and work.token is not None
        answer = self.db.complete(work.execution_id, work.token, work.status, f"work {work.status}")
        work.answers.append((self.world.now, answer))
        if answer == "unavailable" and tries < 120:
            self.world.at(self.world.now + 1.0, functools.partial(self._report, work, tries + 1))


class SimSender(Sender):
    kind = "http"

    def __init__(self, receivers: Receivers, node_id: str, holder: str) -> None:
        self.receivers = receivers
        self.node_id = node_id
        self.holder = holder

    def decode(self, doc: dict[str, Any]) -> SimTarget:
        return SimTarget(doc["url"], float(doc.get("timeout_seconds", 2.0)))

    def submit(self, target: SimTarget, delivery: Delivery) -> asyncio.Future[Outcome]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        world = self.receivers.world
        timer = loop.call_later(target.timeout, _settle, future, Outcome(False, None, "timed out"))

        def arrive() -> None:
            ok, took = self.receivers.answer(target.receiver, delivery.attempt)
            self.receivers.arrivals.append(
                Arrival(
                    world.now,
                    self.node_id,
                    self.holder,
                    delivery.job_id,
                    delivery.execution_id,
                    _ms(delivery.scheduled_for),
                    delivery.attempt,
                    ok,
                    dict(delivery.extra).get(UPSTREAMS_HEADER),
                    delivery.body,
                )
            )
            if ok and self.receivers.behaviour.get(target.receiver) == "async":
                self.receivers.accept_work(delivery)
            outcome = Outcome(True, 200, None) if ok else Outcome(False, 500, "HTTP 500: \x00receiver\ud800 error")

            def reply() -> None:
                if loop in world.loops:
                    loop.call_soon(_settle, future, outcome, timer)

            world.at(world.now + took + LATENCY / 2, reply)

        world.at(world.now + LATENCY / 2, arrive)
        return future


def _settle(future: asyncio.Future[Outcome], outcome: Outcome, timer: asyncio.TimerHandle | None = None) -> None:
    if timer is not None:
        timer.cancel()
    if not future.done():
        future.set_result(outcome)


def _ms(iso_text: str) -> int:
    from cronman.model.timeutil import parse_iso

    return parse_iso(iso_text)
