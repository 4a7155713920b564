"""What must hold at the end of every simulated run (the guarantee, as docs/architecture.md
states it):

1. every occurrence due while any node was alive is delivered at least once, and within a lease,
   two heartbeat intervals and 2 s of its due time, or of the end of a fault of Redis, PostgreSQL
   or the whole cluster it fell into (_Deadlines);
2. every extra delivery of one attempt is attributable to a named fault (a process killed after
   delivering, a process paused past its lease, Redis losing its keys, being unreachable or too
   slow to renew a lease), and never comes from the process that had itself already delivered that
   attempt with success;
3. retries, manual triggers, redeliveries and backfills survive every handover (Redis losing its
   data loses the retries parked there whose holder has stopped since, and the claims of a
   backfill's executions not sent yet: that is the one named exception);
4. occurrences due while no node ran at all get their job's misfire policy, in every slot;
5. a deleted or paused job gets no further attempt once the change has reached the nodes;
6. every execution delivered ends with a final row in history (unless Redis lost it in between);
7. no exception escapes: nothing is logged with a traceback, no task dies unobserved;
8. jobs that wait (the seeds that draw them, world.CHAINS_FROM): asynchronous work ends in history
   as its work reported it (_async_work); an after job's executions follow successes of each of its
   upstreams, each used once, and every upstream success fires it or is superseded (_after_jobs);
   a job that requires others is sent with their recent successes, and skipped only when none was
   known when it stopped waiting (_requirements);
9. every delivery carries its job's payload, byte for byte (_payloads); with payloads out of
   memory (world.PAYLOADS_FROM), a node cut off from PostgreSQL holds back what it has to read.

Boundaries (a job created, paused, deleted; the cluster stopped) are fuzzy by the time a change
takes to reach the nodes and by the nodes' clock skew: occurrences that close to one are not
judged.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from cronman.model.backfills import occurrences
from cronman.model.execution import UPSTREAM_REASON, Trigger, backfill_trigger, execution_id
from cronman.model.misfire import REASON_PREFIX as MISFIRE_REASON
from cronman.model.schedule import Timing, timing_from_dict
from scheduler_node.execution import Descriptor
from scheduler_node.history import HistoryRow
from scheduler_node.sim.parts import Arrival, Work
from scheduler_node.sim.world import EPOCH, Fault, JobPlan, Sim, bound_seconds
from scheduler_node.waits import RUNNING_RECHECK_MS

MAX_SKEW = 1.5  # seconds a node's clock can be off the world's (world.py)
FUZZ = 3.0  # seconds around a boundary that are not judged (change propagation, clock skew)


@dataclass
class Report:
    seed: int
    occurrences: int = 0
    deliveries: int = 0
    duplicates: int = 0
    duplicates_attributed: dict[str, int] = field(default_factory=dict)
    takeovers: int = 0
    covered: int = 0  # occurrences a standby left to the slot's leader (it had claimed them)
    backlogged: int = 0  # late occurrences queued through a node's backlog (see Firer.take_queued)
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    # The latest first delivery of a judged occurrence, seconds after it was due (a figure, not a
    # violation: faults delay deliveries by design, up to a lease or a timeout of some kind).
    worst_lag: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def _windows(plan: JobPlan, end: float) -> list[tuple[float, float]]:
    """When the job existed and was not paused."""
    out: list[tuple[float, float]] = []
    for created in plan.created:
        gone = next((d for d in plan.deleted if d > created), end)
        cuts = sorted(p for p in plan.paused if created <= p[0] < gone)
        t = created
        for p0, p1 in cuts:
            out.append((t, p0))
            t = max(t, p1)
        out.append((t, gone))
    return [(a, b) for a, b in out if b > a]


def _near(t: float, spans: list[tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in spans)


def _edges(sim: Sim, points: list[float]) -> list[tuple[float, float]]:
    """Around each change of a job, the time it may take to reach the nodes: longer while the
    database is down or slow (a node learns of changes from it)."""
    down = sorted((f.start, f.end) for f in sim.faults if f.kind in ("db_down", "db_slow", "db_hang", "db_partition"))
    poll = sim.settings.change_poll_seconds
    out = []
    for p in points:
        reached = p
        for a, b in down:
            if a <= reached + poll and b >= reached:  # down before the next poll saw the change
                reached = max(reached, b)
        out.append((p - FUZZ, reached + FUZZ + max(0.0, poll - 1.0)))
    return out


@dataclass
class _Run:
    """What the checks read of a finished run: its deliveries by execution, the span judged, and
    what history says ended."""

    sim: Sim
    report: Report
    arrivals: dict[str, list[Arrival]]
    deadline: _Deadlines
    lo: float
    hi: float
    outages: list[tuple[float, float]]  # recorded times no scheduler ran (seconds)
    # executions a skip ended that the node holding their claim decided (not a misfire plan's)
    decided_skips: set[str]
    cancelled: set[str]

    def in_outage(self, t: float) -> bool:
        return any(a - FUZZ <= t <= b + FUZZ for a, b in self.outages) or any(
            s - FUZZ <= t <= r + FUZZ for s, r in self.sim.stopped_all
        )

    def skipped_then_lost(self, eid: str, due: float, first: float) -> bool:
        """Skipped by the node that held its claim (an overlap), then claimed again after Redis
        lost its data and delivered unchecked (PostgreSQL away: at least once). The execution
        owed nothing more: the delivery is the loss's (seeds 8302341, 8306137, 8311250)."""
        return eid in self.decided_skips and any(due - FUZZ <= x < first for x in self.sim.redis.losses)


@dataclass
class _Job:
    """A job of the workload as the checks judge it: its timing, and when it was active."""

    plan: JobPlan
    timing: Timing
    events: int
    overlap: bool  # overlap_policy skip
    windows: list[tuple[float, float]]  # when it existed and was not paused
    edges: list[tuple[float, float]]  # around its changes: not judged


def _job(sim: Sim, plan: JobPlan) -> _Job:
    return _Job(
        plan,
        timing_from_dict(plan.doc["schedule"], plan.id, plan.doc.get("namespace", "default")),
        int(plan.doc["options"].get("events_per_trigger", 1)),
        plan.doc["options"].get("overlap_policy") == "skip",
        _windows(plan, sim.end),
        _edges(sim, [*plan.created, *plan.deleted, *(p for pair in plan.paused for p in pair)]),
    )


def check(sim: Sim) -> Report:
    run = _begin(sim)
    for plan in sim.jobs.values():
        job = _job(sim, plan)
        _scheduled(run, job)  # 1, 5
        _attempts_after_delete(run, plan)  # 5
        _triggers(run, job)  # 3
        _backfills(run, job)  # 3
        _retries(run, job)  # 3
    # 2: duplicates
    _duplicates(sim, run.arrivals, run.report)
    # 4: misfire policies
    _misfires(sim, run.arrivals, run.report, run.deadline)
    _history(run)  # 6
    _exceptions(sim, run.report)  # 7
    _payloads(run)  # 9
    if sim.chains:  # 8
        _async_work(run)
        _after_jobs(run)
        _requirements(run)
    return run.report


def _begin(sim: Sim) -> _Run:
    """The report's figures, and what the checks read of the run."""
    cfg = sim.cfg
    report = Report(cfg.seed)
    report.covered = sum(p.node.firer.left_to_leader for p in sim.started if p.node.firer is not None)
    report.backlogged = sum(p.node.firer.backlogged for p in sim.started if p.node.firer is not None)
    for f in sim.faults:
        report.faults[f.kind] = report.faults.get(f.kind, 0) + 1
    arrivals: dict[str, list[Arrival]] = defaultdict(list)
    for a in sim.receivers.arrivals:
        arrivals[a.execution_id].append(a)
    report.deliveries = len(sim.receivers.arrivals)
    # (as written: a delivery made after the skip, unchecked, replaces its row in history)
    decided_skips = {eid for eid, reason in sim.db.skips.items() if not reason.startswith(MISFIRE_REASON)}
    cancelled = {r.execution_id for r in sim.db.history.values() if r.status == "cancelled"}
    return _Run(
        sim,
        report,
        arrivals,
        _Deadlines(sim),
        EPOCH + cfg.warmup,
        EPOCH + cfg.duration,
        [(a / 1000, b / 1000) for a, b in sim.db.outages],
        decided_skips,
        cancelled,
    )


def _scheduled(run: _Run, job: _Job) -> None:
    """1, 5: every scheduled occurrence while the job was active, delivered and in time; none
    delivered while it was deleted or paused, by a node that knew it."""
    plan, timing = job.plan, job.timing
    t_ms = timing.next_after(int(run.lo * 1000) - 1)
    while t_ms is not None and t_ms <= run.hi * 1000:
        t = t_ms / 1000
        active = any(a <= t < b for a, b in job.windows)
        if active and not _near(t, job.edges) and not run.in_outage(t):
            for ev in range(job.events):
                _occurrence(run, job, t_ms, ev)
        elif not active and not _near(t, job.edges):
            for ev in range(job.events):
                late = [
                    a
                    for a in run.arrivals.get(execution_id(plan.id, t_ms, ev, Trigger.SCHEDULE), [])
                    if _knew(run.sim, a.holder, _last_change(plan, t), a.at)
                ]
                if late:
                    run.report.violations.append(
                        f"delivered while deleted or paused: {plan.id} at {_at(t)} (attempt {late[0].attempt} "
                        f"by {late[0].holder} at {_at(late[0].at)})"
                    )
        t_ms = timing.next_after(t_ms)


def _occurrence(run: _Run, job: _Job, t_ms: int, ev: int) -> None:
    """1: one event of an occurrence judged: delivered, and by its deadline."""
    plan, report, t = job.plan, run.report, t_ms / 1000
    report.occurrences += 1
    eid = execution_id(plan.id, t_ms, ev, Trigger.SCHEDULE)
    got = run.arrivals.get(eid)
    # (one that requires other jobs waits for them up to its bound, then is skipped: _requirements;
    # asynchronous work recorded as sent by a node that lost it before sending is waited for)
    # (and with payloads out of memory, one whose payload was not read ahead reads it before it is
    # sent: a node cut off from PostgreSQL holds it back, as it does what waits)
    waits = bool(_unsent_wait(plan) or plan.doc["options"].get("require") or run.sim.payload_rng is not None)
    due_by = run.deadline(t + _require_wait(plan), needs_db=waits)
    if _unsent_wait(plan):  # (and faults after it was recorded delay its timeout and its retry)
        due_by = run.deadline(due_by + _unsent_wait(plan), needs_db=True)
    if not got and (_held_back(run.sim, plan, t_ms, ev) or (_unsent_wait(plan) and due_by > run.sim.end)):
        return  # (or owed after the run's end: an attempt recorded and not sent, waited for)
    if (
        not got
        and _require_wait(plan)
        and any(t - FUZZ <= x <= t + _require_wait(plan) + FUZZ for x in run.sim.redis.losses)
    ):
        return  # parked while it waited, in Redis, which lost it (see _retries)
    if got:
        first = min(a.at for a in got)
        report.worst_lag = max(report.worst_lag, first - t)
        # (one the job's pause or delete cancelled before it was due by may come
        # later all the same: a loss of Redis's data claims the past again, seed 7500045)
        if first > due_by and not _stopped_after(plan, t, due_by) and not run.skipped_then_lost(eid, t, first):
            report.violations.append(
                f"late: {plan.id} at {_at(t)} event {ev} delivered {first - t:.1f}s after its due "
                f"time, past the bound ({run.deadline.bound:.1f}s; due by {_at(due_by)}, faults "
                f"counted) (execution {eid})"
            )
    if (
        not got
        and not (job.overlap and _ended(run.sim, plan.id, t_ms, ev, "skipped"))
        and not _stopped_after(plan, t, due_by)
    ):
        report.violations.append(f"missed: {plan.id} at {_at(t)} event {ev} (execution {eid})")


def _attempts_after_delete(run: _Run, plan: JobPlan) -> None:
    """5: no attempt of a deleted job's executions after the delete reached the nodes."""
    for deleted in plan.deleted:
        back = next((c for c in plan.created if c > deleted), None)
        for eid, got in run.arrivals.items():
            for a in got:
                if (
                    a.job_id == plan.id
                    and (back is None or a.at < back)
                    and a.scheduled_ms / 1000 < deleted
                    and _knew(run.sim, a.holder, deleted, a.at)
                ):
                    run.report.violations.append(
                        f"attempt after delete: {plan.id} execution {eid} attempt {a.attempt} at {_at(a.at)} "
                        f"(deleted {_at(deleted)})"
                    )


def _triggers(run: _Run, job: _Job) -> None:
    """3: manual triggers."""
    plan = job.plan
    for asked, requested_ms in plan.triggers:
        if _stopped_after(plan, asked - FUZZ):
            continue  # deleted or paused before it could be delivered: cancelled
        if asked > run.hi:
            continue
        for ev in range(job.events):
            eid = execution_id(plan.id, requested_ms, ev, Trigger.MANUAL)
            if not run.arrivals.get(eid):
                run.report.violations.append(f"trigger lost: {plan.id} asked at {_at(asked)} (execution {eid})")


def _backfills(run: _Run, job: _Job) -> None:
    """3: backfills: every execution handed out, unless the job went or Redis lost its claims;
    one handed out before a pause reached its node is cancelled by it, and says so in history."""
    plan = job.plan
    for asked, backfill_id, from_ms, to_ms in plan.backfills:
        if any(d >= asked - FUZZ for d in plan.deleted) or any(x >= asked for x in run.sim.redis.losses):
            continue
        trigger = backfill_trigger(backfill_id)
        paused = any(p >= asked - FUZZ for p, _ in plan.paused)
        for t_ms in occurrences(job.timing, from_ms, to_ms, 10_000):
            for ev in range(job.events):
                eid = execution_id(plan.id, t_ms, ev, trigger)
                if not run.arrivals.get(eid) and not (paused and eid in run.cancelled):
                    run.report.violations.append(
                        f"backfill lost: {plan.id} {backfill_id} at {_at(t_ms / 1000)} event {ev} (execution {eid})"
                    )


def _retries(run: _Run, job: _Job) -> None:
    """3: retries of a receiver that fails every first attempt."""
    sim, plan, edges = run.sim, job.plan, job.edges
    if sim.receivers.behaviour.get(plan.receiver) != "fail_first":
        return
    for eid, got in run.arrivals.items():
        if got[0].job_id != plan.id or any(a.ok for a in got):
            continue
        first = min(a.at for a in got)
        if first > run.hi or _near(first, edges) or any(first - 1 <= b and a <= first + 15 for a, b in edges):
            continue
        due = got[0].scheduled_ms / 1000
        if _stopped_after(plan, due - FUZZ) or not any(a <= due < b for a, b in job.windows):
            continue  # deleted or paused after it fell due: what it still owed is cancelled
        if any(first - 1 <= x for x in sim.redis.losses):
            # Redis lost the parked retry (a named fault: its holder may be gone), or the
            # claim of the first attempt, whose answer was still on its way: the slot's
            # other owner claimed the occurrence anew and ended it (seed 911903, every
            # fault: skipped for an overlap), and the retry found it ended. The same second
            # of grace as the history check below.
            continue
        if _lost_in_outage(sim, due, first):
            continue  # Redis lost it as the whole cluster stopped: the misfire policy decides
        if run.skipped_then_lost(eid, due, first):
            continue  # history says it ended; a node that takes its retry over ends it there
        run.report.violations.append(f"retry lost: {plan.id} execution {eid} never succeeded")


def _history(run: _Run) -> None:
    """6: every execution delivered ends with a final row in history (unless Redis lost it in
    between, or its next attempt was still to come at the end of the run)."""
    sim = run.sim
    finals = {"succeeded", "permanently_failed", "cancelled", "skipped"}
    final_ids = {r.execution_id for r in sim.db.history.values() if r.status in finals}
    losses = sim.redis.losses
    retrying = _retrying_at_the_end(sim)
    for eid, got in run.arrivals.items():
        first = min(a.at for a in got)
        if first > run.hi or eid in final_ids or any(x >= first - 1 for x in losses):
            continue
        if eid in retrying and max(a.at for a in got) >= sim.end - _retry_span(sim, got[0].job_id):
            continue  # retried until the end, its next attempt was still to come
        run.report.violations.append(f"no final history row: execution {eid} of {got[0].job_id}")


def _exceptions(sim: Sim, report: Report) -> None:
    """7: nothing logged with a traceback, no task dead unobserved."""
    for text in sim.logged_errors[:5]:
        report.violations.append(f"exception logged: {text}")
    for err in sim.world.errors[:5]:
        report.violations.append(f"unhandled in {err.get('loop')}: {err.get('message')} {err.get('exception')!r}")


def _retrying_at_the_end(sim: Sim) -> set[str]:
    """Executions whose next attempt was still to come when the nodes were stopped at the end of
    the run: their claims are parked in Redis until about then or later (seed 981343: a retry's
    attempt 1 taken over twice, from nodes killed while sending it, reached attempt 5 of a
    receiver too slow for its timeout 0.02 s after the run ended). They have no final row yet."""
    after = int((sim.end - sim.settings.lease_seconds) * 1000)
    out: set[str] = set()
    for members in sim.redis.space.open.values():
        for member, score in members.items():
            if score >= after:
                d = Descriptor.parse(member)
                out.add(execution_id(d.job_id, d.scheduled_ms, d.event_index, d.trigger))
    return out


def _retry_span(sim: Sim, job_id: str) -> float:
    """The longest an execution of the job can go between two attempts arriving: a timeout, the
    longest backoff, and a lease and a sweep should its holder die."""
    doc = sim.jobs[job_id].doc
    timeout = float(doc["target"].get("timeout_seconds", 2.0))
    # (asynchronous work: its timeout too, and a park while it runs should its holder die)
    work = doc["options"].get("completion")
    if work:
        timeout += float(work["timeout_seconds"]) + RUNNING_RECHECK_MS / 1000
    return timeout + float(doc["retry"].get("max_backoff_seconds", 3)) + 2 * sim.settings.lease_seconds


def _knew(sim: Sim, holder: str, change: float, at: float) -> bool:
    """Whether ``holder`` had read the change feed after ``change`` and before ``at``: a process
    acts on what it knows (a paused one, or one cut off from the database, knows less)."""
    polls = sim.db.polls.get(holder, [])
    i = bisect.bisect_left(polls, change)
    return i < len(polls) and polls[i] + 0.01 < at


def _last_change(plan: JobPlan, t: float) -> float:
    """The last change that made the job inactive at ``t`` (a delete or a pause)."""
    return max([d for d in plan.deleted if d <= t] + [p for p, _ in plan.paused if p <= t], default=t)


def _ended(sim: Sim, job_id: str, t_ms: int, ev: int, status: str) -> bool:
    return any(
        r.status == status and (r.job_id, r.scheduled_ms, r.event_index) == (job_id, t_ms, ev)
        for r in sim.db.history.values()
    )


def _stopped_after(plan: JobPlan, t: float, until: float = float("inf")) -> bool:
    """The job was paused or deleted after ``t`` (and by ``until``, when the occurrence was to be
    delivered at the latest): an occurrence that faults held back until then is rightly not
    delivered any more (a pause or a delete cancels what is still owed)."""
    return any(t < d <= until for d in plan.deleted) or any(t < p <= until for p, _ in plan.paused)


# Faults of what the nodes depend on, not of the nodes: while one lasts nothing can be claimed
# (Redis away, slow or losing answers, its data lost), or a slot taken over cannot be loaded nor its
# history checked (PostgreSQL away, hung, slow or losing answers), or no node runs at all. The
# bound counts from the end of the last of them an occurrence fell into.
_OUTSIDE = frozenset(
    {
        "redis_down",
        "redis_loss",
        "redis_slow",
        "redis_flaky",
        "db_down",
        "db_hang",
        "db_slow",
        "db_flaky",
        "power_cut",
        "cluster_stop",
    }
)


def _nobody_firing(sim: Sim) -> list[tuple[float, float]]:
    """When no node could fire: every one of them dead, stopping, paused or cut off from Redis (the
    whole cluster down, if not by a stop of it: the last node killed while the others had left, or
    the one node left cut off, say: seed 7601434)."""
    up: list[tuple[float, float]] = []
    for p in sim.started:
        end = p.ended if p.ended is not None else sim.end
        pauses = sorted(
            (f.start, f.end) for f in sim.faults if f.kind in ("pause", "partition") and f.holder == p.holder
        )
        t = p.born
        for a, b in pauses:
            if a > t:
                up.append((t, min(a, end)))
            t = max(t, b)
        if end > t:
            up.append((t, end))
    down: list[tuple[float, float]] = []
    t = EPOCH + sim.cfg.warmup
    for a, b in sorted(up):
        if a > t:
            down.append((t, a))
        t = max(t, b)
    return down


def _payloads(run: _Run) -> None:
    """9: every delivery carries its job's payload, byte for byte (the workload never changes a
    payload: a job created again has the one it had)."""
    jobs = run.sim.db.jobs
    for a in run.sim.receivers.arrivals:
        job = jobs.get(a.job_id)
        if job is not None and a.payload != job.payload.encode():
            run.report.violations.append(
                f"delivered another payload than its job's: {a.job_id} execution {a.execution_id} attempt "
                f"{a.attempt} by {a.holder} at {_at(a.at)}: {a.payload[:60]!r}"
            )


class _Deadlines:
    """When an occurrence due at ``t`` must have been delivered: within the bound (a lease, two
    heartbeat intervals and 2 s: scheduler_node.sim.world.bound_seconds) of its due time, whatever
    happened to the nodes (crashes, pauses, joins, leaves, restarts, one cut off), or of the end of
    a fault of Redis, PostgreSQL or the whole cluster (a stop of it, or no node firing at all) that
    began before then; plus the nodes' clock
    skew (one whose clock is behind fires that much later). What is owed is still owed after the
    deadline (a pause or a delete after it does not excuse a miss). Not ``judged``: no deadline."""

    def __init__(self, sim: Sim) -> None:
        self.bound = bound_seconds(sim.settings)
        self.spells = sorted([*((f.start, f.end) for f in sim.faults if f.kind in _OUTSIDE), *_nobody_firing(sim)])
        # Executions that wait for something (what they require, asynchronous work's record) need
        # PostgreSQL to be sent: a node cut off from it holds them back too (scheduler_node.waits)
        self.db_spells = sorted([*self.spells, *((f.start, f.end) for f in sim.faults if f.kind == "db_partition")])
        # With a backlog room of 3 (sim.backlog), a catch-up drains a few occurrences a timer pass,
        # as millions of jobs make it; what it owes is late by its length, not by a fault's: the
        # bound is not judged there (everything else is).
        self.judged = not sim.backlog

    def __call__(self, t: float, needs_db: bool = False) -> float:
        if not self.judged:
            return float("inf")
        allowed = self.bound + MAX_SKEW
        due = t + allowed
        for start, end in self.db_spells if needs_db else self.spells:
            if start > due:
                break
            due = max(due, end + allowed)
        return due


def _duplicates(sim: Sim, arrivals: dict[str, list[Arrival]], report: Report) -> None:
    lease = sim.cfg.lease_seconds
    succeeded = {(r.execution_id, r.attempt): r for r in sim.db.history.values() if r.status == "succeeded"}
    for eid, got in arrivals.items():
        by_attempt: dict[int, list[Arrival]] = defaultdict(list)
        for a in got:
            by_attempt[a.attempt].append(a)
        for attempt, same in by_attempt.items():
            if len(same) < 2:
                continue
            same.sort(key=lambda a: a.at)
            for k, second in enumerate(same[1:], start=1):
                report.duplicates += 1
                row = succeeded.get((eid, attempt))
                if (
                    row is not None
                    and row.finished_ms is not None
                    and second.holder == same[0].holder == row.node + "/" + second.holder.split("/")[1]
                ):
                    finished = row.finished_ms / 1000 - sim.skew.get(row.node, 0.0)
                    # (Redis losing its keys is the exception: the node claims what it lost again)
                    lost = any(
                        f.kind == "redis_loss" and same[0].at - lease <= f.start <= second.at for f in sim.faults
                    )
                    if same[0].at <= finished < second.at - 0.01 and not lost:
                        report.violations.append(
                            f"delivered again by the process that had finished it: execution {eid} "
                            f"({same[0].job_id}) attempt {attempt}, by {second.holder} at {_at(same[0].at)}, "
                            f"succeeded at {_at(finished)}, and again at {_at(second.at)}"
                        )
                        continue
                cause = _cause(sim, same[0], second, lease)
                if cause is None and k > 1:
                    # A delivery taken over from the one before it, itself a duplicate of the first
                    # with a cause of its own (seed 120323: node-1 lost a claim to node-3 while Redis
                    # was slow, node-3 was paused past its lease, and node-1 took the claim back)
                    cause = _cause(sim, same[k - 1], second, lease)
                if cause is None:
                    report.violations.append(
                        f"duplicate without a named fault: execution {eid} ({same[0].job_id}) attempt {attempt}, "
                        f"by {same[0].holder} at {_at(same[0].at)} and {second.holder} at {_at(second.at)}"
                    )
                else:
                    report.duplicates_attributed[cause] = report.duplicates_attributed.get(cause, 0) + 1


def _lost_in_outage(sim: Sim, due: float, first: float) -> bool:
    """Redis lost its data as the whole cluster stopped (a power cut), around an execution's first
    attempt, and the occurrence fell in the outage recorded for the stop: what the nodes find when
    they come back is the misfire policy's, not a retry's (seed 870335: a first attempt sent at
    the instant of the cut; nobody was left to retry it, nor Redis to remember it)."""
    recorded = [(a / 1000 - FUZZ, b / 1000) for a, b in sim.db.outages]
    return any(a <= due <= b for a, b in recorded) and any(
        first - FUZZ <= x and any(a <= x <= b for a, b in recorded) for x in sim.redis.losses
    )


def _cause(sim: Sim, first: Arrival, second: Arrival, lease: float) -> str | None:
    for f in sim.faults:
        if f.kind == "kill" and f.holder == first.holder and first.at - lease <= f.start <= second.at:
            return "killed after delivering"
        if (
            f.kind == "pause"
            and f.holder in (first.holder, second.holder)
            and f.start <= second.at
            and (f.end >= first.at - lease)
        ):
            return "paused past its lease"
        if f.kind == "redis_loss" and first.at - 60 <= f.start <= second.at:
            return "redis lost its keys"
        # Renewals fail while Redis is away: the claim store saw the claim taken from one of the
        # two holders by the other then, or at the first sweeps after it came back.
        if f.kind == "redis_down" and _taken(sim, first, second, f.start, f.end + lease + 4.0):
            return "redis unreachable"
        if (
            f.kind == "partition"
            and f.holder in (first.holder, second.holder)
            and _taken(sim, first, second, f.start, f.end + lease + 4.0)
        ):
            return "cut off from redis"
        if f.kind == "redis_slow" and _lapsed(sim, f, first, second, lease):
            return "redis too slow to renew a lease"
        if f.kind == "cluster_stop" and first.at - lease <= f.start <= second.at:
            return "killed after delivering"
    return None


def _lapsed(sim: Sim, f: Fault, first: Arrival, second: Arrival, lease: float) -> bool:
    """A slow spell let the first holder's lease run out while it still held the attempt it
    delivered, and the second holder took the claim over then. Leases are renewed every third of
    one, each renewal awaited, so renewals land up to four one-way delays further apart: only a
    spell that slow can do it. The first holder held the attempt at most its timeout after
    delivering it, and its park or done mark lands within one one-way delay after that: a
    takeover later than that took over what came next, not that attempt (a renewal that lands
    late must not bring an attempt back)."""
    if lease / 3 + 4 * f.worst <= lease:
        return False
    plan = sim.jobs.get(first.job_id)
    timeout = float(plan.doc["target"].get("timeout_seconds", 2.0)) if plan is not None else 2.0
    return f.end >= first.at - lease and _taken(
        sim, first, second, max(f.start, first.at - lease), first.at + timeout + f.worst + 0.01, one_way=True
    )


def _taken(sim: Sim, first: Arrival, second: Arrival, since: float, until: float, one_way: bool = False) -> bool:
    """The claim store saw the execution's claim taken, between ``since`` and ``until``, from the
    first delivery's holder by the second's: directly when ``one_way``, else through a chain of
    takeovers (A to B to A: a node can take back what was taken from it), either way round."""
    takes = sorted(
        (at, previous, taker)
        for at, name, previous, taker in sim.redis.takeovers
        if name.split(":")[0] == first.execution_id and since <= at <= until
    )
    if one_way:
        return any((previous, taker) == (first.holder, second.holder) for _, previous, taker in takes)
    for a, b in ((first.holder, second.holder), (second.holder, first.holder)):
        reached = {a}
        for _, previous, taker in takes:
            if previous in reached:
                if taker == b:
                    return True
                reached.add(taker)
    return False


def _overlapped(sim: Sim, job_id: str, t_ms: int) -> bool:
    """The occurrence ended skipped because the job's previous execution was still in flight."""
    return any(
        r.status == "skipped" and (r.job_id, r.scheduled_ms) == (job_id, t_ms) and "overlap" in (r.error or "")
        for r in sim.db.history.values()
    )


def _misfires(sim: Sim, arrivals: dict[str, list[Arrival]], report: Report, deadline: _Deadlines) -> None:
    """For each stop of the whole cluster that was recorded as an outage, each job that existed
    throughout got its policy: skip fires nothing of the outage, fire_once its latest occurrence,
    fire_all every occurrence within its catch-up window."""
    for stop, restart in sim.stopped_all:
        recorded = _outage_of(sim, stop, restart)
        if not recorded and restart - stop > sim.settings.outage_after_seconds + FUZZ:
            report.violations.append(f"the whole cluster stopped at {_at(stop)} but no outage was recorded")
        if not recorded:
            continue
        back = min(b for _, b in recorded)
        for plan in sim.jobs.values():
            if any(a <= stop - 10 and b >= back + 10 for a, b in _windows(plan, sim.end)):
                _misfire_policy(sim, arrivals, report, deadline, plan, stop, back)


def _outage_of(sim: Sim, stop: float, restart: float) -> list[tuple[float, float]]:
    """The outage a stop of the whole cluster became (seconds), if any."""
    # the outage this stop became (not a later one: after a short stop, recorded as none,
    # a later stop's outage is not this one's: seeds 880157 and 880196 with power cuts)
    # (nor one that starts after this stop ended, within FUZZ of its end, when another stop
    # began after it: that stop's, seed 912504, every fault, a power cut too short to be an
    # outage, and 3.6 s after its nodes came back a second one, recorded from a mark before
    # the second cut; but one outage that two stops fall in, the second before the nodes came
    # back from the first, is the first's too: seeds 911430, 912346, 912437. Nor one that
    # starts later after this stop's end than a node's clock can be off: no node became
    # ready after a short stop while PostgreSQL hung, and that outage began when the first
    # node back found no outage, seed 914644)
    later = any(s > restart for s, _ in sim.stopped_all)
    return [
        (a / 1000, b / 1000)
        for a, b in sim.db.outages
        if b / 1000 > stop
        and a / 1000 < restart + FUZZ
        and not (a / 1000 >= restart + MAX_SKEW or (later and a / 1000 >= restart))
    ]


def _misfire_policy(
    sim: Sim,
    arrivals: dict[str, list[Arrival]],
    report: Report,
    deadline: _Deadlines,
    plan: JobPlan,
    stop: float,
    back: float,
) -> None:
    """One job that existed throughout an outage (from ``stop`` until the nodes were ``back``)
    got its misfire policy."""
    opts = plan.doc["options"]
    policy = opts.get("misfire_policy", "fire_once")
    overlap_skip = opts.get("overlap_policy") == "skip"
    timing = timing_from_dict(plan.doc["schedule"], plan.id, plan.doc.get("namespace", "default"))
    missed = _occurrences_between(timing, (stop + FUZZ) * 1000, (back - FUZZ) * 1000)
    if not missed:
        return

    def first_attempt_after(t_ms: int) -> bool:
        eid = execution_id(plan.id, t_ms, 0, Trigger.SCHEDULE)
        return any(a.attempt == 1 and a.at >= back - FUZZ for a in arrivals.get(eid, []))

    def delivered(t_ms: int) -> bool:  # (or held back by its requirement: _requirements)
        return bool(arrivals.get(execution_id(plan.id, t_ms, 0, Trigger.SCHEDULE))) or _held_back(sim, plan, t_ms, 0)

    # What the outage's plan fires is owed from when the nodes are back, like any late
    # occurrence: a pause or a delete after that, before faults let it be delivered, cancels
    # it (seeds 7300386, 981004 and 981691: Redis away or the cluster cut again right after,
    # then the job paused).
    cancelled = _stopped_after(plan, back - FUZZ, deadline(back))

    if policy == "skip":
        fired = [t for t in missed if first_attempt_after(t)]
        if fired:
            report.violations.append(f"misfire skip fired {plan.id} at {_at(fired[0] / 1000)}")
    elif policy == "fire_all":
        window = int(opts.get("catchup_window_seconds", 3600))
        want = [t for t in missed if t / 1000 > back + FUZZ - window]
        # with overlap_policy skip, an occurrence caught up while the one before it is still
        # in flight is skipped for that reason, and says so in history
        lost = [t for t in want if not delivered(t) and not (overlap_skip and _overlapped(sim, plan.id, t))]
        if lost and not cancelled:
            report.violations.append(f"misfire fire_all did not fire {plan.id} at {_at(lost[0] / 1000)}")
    else:
        fired = [t for t in missed if first_attempt_after(t)]
        if len(fired) > 1:
            report.violations.append(
                f"misfire fire_once fired {len(fired)} of {plan.id}'s outage occurrences: "
                + ", ".join(_at(t / 1000) for t in fired[:5])
            )
        candidates = missed + _occurrences_between(timing, (back - FUZZ) * 1000, (back + FUZZ) * 1000)
        near = [t for t in candidates if delivered(t)]
        if not near and overlap_skip:  # its catch-up skipped for overlap, as its policy says
            near = [t for t in candidates if _overlapped(sim, plan.id, t)]
        if not near and not cancelled:
            report.violations.append(f"misfire fire_once fired nothing of {plan.id}'s outage")


def _occurrences_between(timing: Timing, after_ms: float, until_ms: float) -> list[int]:
    """The timing's occurrences after ``int(after_ms)`` and up to ``until_ms`` (ms)."""
    out: list[int] = []
    t = timing.next_after(int(after_ms))
    while t is not None and t <= until_ms:
        out.append(t)
        t = timing.next_after(t)
    return out


def _at(t: float) -> str:
    return f"t+{t - EPOCH:.3f}s"


# --------------------------------------------------------------------------- 8: jobs that wait
# Three defects of the product these checks found, now fixed (tests/sim: FOUND_WAITING); the
# violations begin with these words:
# - a success that replaces a failed row of the same attempt (the failure written first, by a node
#   that died after it, say) was not a row written for the first time, and history's writers applied
#   only those to the jobs downstream: the downstream job never heard of that success;
# - an execution that succeeds twice (delivered again after Redis lost its data, its first attempt
#   failing, its second succeeding): the downstream job ran again after that same execution;
# - the last attempt of asynchronous work whose receiver answered after the node stopped waiting
#   for its answer ("timed out") was failed for good, but its async_runs row stayed running: the API
#   took the work's success, which history never shows.
NEVER_APPLIED = "an upstream success never reached its downstream's wait"
TIMED_OUT_ACCEPTED = "its work's success was taken after its request timed out"
DOUBLE_SUCCESS = "an upstream execution that succeeded twice was followed twice"


def _require_wait(plan: JobPlan) -> float:
    """How long an occurrence of the job may wait for what it requires (s)."""
    req = plan.doc["options"].get("require")
    return float(req.get("wait_seconds", 0)) if req else 0.0


def _unsent_wait(plan: JobPlan) -> float:
    """How much later than other jobs' an occurrence of asynchronous work may be delivered (s): one
    completion timeout and its request's (an attempt recorded as sent by a node that lost its
    claim before sending it is waited for until its deadline, never sent again: scheduler_node.waits)."""
    work = plan.doc["options"].get("completion")
    return float(work["timeout_seconds"]) + float(plan.doc["target"].get("timeout_seconds", 2.0)) if work else 0.0


def _held_back(sim: Sim, plan: JobPlan, t_ms: int, ev: int) -> bool:
    """Skipped because what the job requires had not succeeded (see _requirements)."""
    if not plan.doc["options"].get("require"):
        return False
    return any(
        r.status == "skipped" and (r.error or "").startswith(UPSTREAM_REASON)
        for r in sim.db.history.values()
        if (r.job_id, r.scheduled_ms, r.event_index) == (plan.id, t_ms, ev)
    )


def _late_allowance(sim: Sim) -> float:
    """How long before the run's end something may have happened that the nodes had no time to act
    on: a park of running work, a lease and its sweep, a timer pass."""
    return RUNNING_RECHECK_MS / 1000 + 2 * sim.settings.lease_seconds + bound_seconds(sim.settings)


def _async_work(run: _Run) -> None:
    """8: an execution of asynchronous work succeeds in history only if its work reported success
    (for that attempt or an earlier one: a retry finds the success of the attempt before it), and
    one whose work's success was taken by the API succeeds (unless reported at the run's end)."""
    sim = run.sim
    works: dict[str, list[Work]] = defaultdict(list)
    for w in sim.receivers.works:
        works[w.execution_id].append(w)
    rows: dict[str, list[HistoryRow]] = defaultdict(list)
    for r in sim.db.history.values():
        rows[r.execution_id].append(r)
    late = sim.end - _late_allowance(sim)
    for plan in sim.jobs.values():
        if not plan.doc["options"].get("completion"):
            continue
        for eid, got in run.arrivals.items():
            if got[0].job_id != plan.id:
                continue
            reported = [(at, w) for w in works[eid] if w.status == "succeeded" and (at := w.applied_at()) is not None]
            succeeded = [r for r in rows[eid] if r.status == "succeeded"]
            for r in succeeded:
                if not any(w.attempt <= r.attempt for _, w in reported):
                    run.report.violations.append(
                        f"succeeded without its work reporting success: execution {eid} of {plan.id} attempt "
                        f"{r.attempt} (reports taken: {[(w.attempt, w.status) for w in works[eid] if w.applied_at()]})"
                    )
            first = min(a.at for a in got)
            if not reported or succeeded or any(x >= first - 1 for x in sim.redis.losses):
                continue  # (Redis losing its data loses what is parked there: see _history)
            at, w = min(reported, key=lambda x: x[0])
            if at >= late:
                continue
            statuses = sorted((r.attempt, r.status, r.error) for r in rows[eid])
            mine = [r for r in rows[eid] if r.attempt == w.attempt]
            if mine and mine[0].status in ("failed", "permanently_failed") and mine[0].error == "timed out":
                # The receiver accepted the request after the node's wait for its answer ran out:
                # the node counted the attempt failed, the row stayed running, the API took the
                # work's success (seed 9000039)
                run.report.violations.append(
                    f"{TIMED_OUT_ACCEPTED}: execution {eid} of {plan.id} attempt {w.attempt} reported at {_at(at)}; "
                    f"history: {statuses}"
                )
            else:
                run.report.violations.append(
                    f"its work reported success but it did not succeed: execution {eid} of {plan.id} attempt "
                    f"{w.attempt} reported at {_at(at)}; history: {statuses}"
                )


def _after_jobs(run: _Run) -> None:
    """8: each after job's executions, from the record of every application of its upstreams'
    ends to its wait (SimDb.applied, in order) and from history."""
    sim = run.sim
    succeeded = {r.execution_id: r for r in sim.db.history.values() if r.status == "succeeded"}
    skipped = {r.execution_id: r for r in sim.db.history.values() if r.status == "skipped"}
    for plan in sim.jobs.values():
        schedule = plan.doc["schedule"]
        if schedule["type"] != "after":
            continue
        ups = tuple(sorted(set(schedule["jobs"])))
        within_ms = int(schedule.get("within_seconds", 86400)) * 1000
        # every end applied, in order: upstream -> [(order, when, row)]; every fire
        ends: dict[str, list[tuple[tuple[int, int], int, HistoryRow]]] = defaultdict(list)
        used: dict[str, int] = defaultdict(int)
        for n, (now, _, downstream, applied, fires) in enumerate(sim.db.applied):
            if downstream != plan.id:
                continue
            for k, (u, row) in enumerate(applied):
                ends[u].append(((n, k), now, row))
            for f in fires:
                _fired(run, plan.id, f.requested_ms, ups, f.upstreams.skip_reason, succeeded, skipped)
                for i in f.upstreams.ids if not f.upstreams.skip_reason else ():
                    used[i] += 1
                    if used[i] == 2:
                        twice = sum(
                            1 for r in sim.db.history.values() if r.execution_id == i and r.status == "succeeded"
                        )
                        what = DOUBLE_SUCCESS if twice > 1 else "followed one upstream success twice"
                        run.report.violations.append(f"{what} ({plan.id}): {i}")
        for u in ups:
            for s in (r for r in succeeded.values() if r.job_id == u):
                if s.execution_id in used:
                    continue
                mine = [e for e in ends[u] if e[2].execution_id == s.execution_id and e[2].status == "succeeded"]
                if not mine:
                    run.report.violations.append(
                        f"{NEVER_APPLIED} ({u} -> {plan.id}): execution {s.execution_id} attempt {s.attempt}, "
                        f"finished {_at((s.finished_ms or 0) / 1000)}"
                    )
                    continue
                order = mine[0][0]
                if any(e[0] > order for e in ends[u]):
                    continue  # superseded by a later end of the same upstream
                # its upstream's last end: it fires once every other upstream's last end is a
                # success applied after it, all within the window when the last of them came
                if any(
                    not ends[o] or ends[o][-1][2].status != "succeeded" or ends[o][-1][0] < order for o in ups if o != u
                ):
                    continue
                them = [mine[0], *(ends[o][-1] for o in ups if o != u)]
                last = max(them, key=lambda e: e[0])
                if all((e[2].finished_ms or e[1]) >= last[1] - within_ms for e in them):
                    run.report.violations.append(
                        f"{plan.id} never fired after {u}'s success {s.execution_id} (its upstreams all "
                        f"succeeded by {_at(last[1] / 1000)})"
                    )


def _fired(
    run: _Run,
    job_id: str,
    requested_ms: int,
    ups: tuple[str, ...],
    skip_reason: str | None,
    succeeded: dict[str, HistoryRow],
    skipped: dict[str, HistoryRow],
) -> None:
    """8: one execution an after job got: its upstreams recorded (one success of each, in order),
    then delivered carrying them, or skipped with the reason (unless made after the faults ended)."""
    sim = run.sim
    eid = execution_id(job_id, requested_ms, 0, Trigger.AFTER)
    rec = sim.db.upstreams.get(eid)
    if rec is None or rec.skip_reason != skip_reason:
        run.report.violations.append(f"{job_id}'s execution {eid} has no record of its upstreams ({rec})")
        return
    if skip_reason is None and (
        rec.jobs != ups or any(succeeded.get(i) is None or succeeded[i].job_id != j for j, i in zip(ups, rec.ids))
    ):
        run.report.violations.append(f"{job_id}'s execution {eid} follows what did not succeed: {rec}")
    if requested_ms / 1000 > run.hi:
        return
    got = run.arrivals.get(eid, [])
    if skip_reason is not None:
        row = skipped.get(eid)
        if row is None or row.error != skip_reason or got:
            run.report.violations.append(
                f"{job_id}'s execution {eid} not skipped for its upstream ({skip_reason!r}): "
                f"{row and row.error!r}, {len(got)} deliveries"
            )
        return
    if not got:
        run.report.violations.append(f"{job_id}'s execution {eid} after its upstreams was never delivered")
    for a in got:
        if a.upstream_ids != ",".join(rec.ids):
            run.report.violations.append(
                f"{job_id}'s execution {eid} attempt {a.attempt} carried {a.upstream_ids!r}, not {rec.ids}"
            )


def _requirements(run: _Run) -> None:
    """8: an occurrence of a job that requires others is sent carrying successes of each, no older
    than its window before its time; it is skipped only if no such success had been written when
    it stopped waiting (its time and its wait, by a clock up to MAX_SKEW early)."""
    sim = run.sim
    succeeded = {r.execution_id: r for r in sim.db.history.values() if r.status == "succeeded"}
    finished: dict[str, int] = {}
    for _, _, _, r in sim.db.successes:
        finished[r.execution_id] = max(finished.get(r.execution_id, 0), r.finished_ms or 0)
    for plan in sim.jobs.values():
        req = plan.doc["options"].get("require")
        if not req:
            continue
        since_of = int(req.get("within_seconds", 86400)) * 1000
        wait = float(req.get("wait_seconds", 0))
        for eid, got in run.arrivals.items():
            a = got[0]
            if a.job_id != plan.id or eid != execution_id(plan.id, a.scheduled_ms, 0, Trigger.SCHEDULE):
                continue
            for a in got:
                ids = (a.upstream_ids or "").split(",") if a.upstream_ids else []
                found = [succeeded.get(i) for i in ids]
                # (a success is as recent as the latest of its rows written says: an execution
                # delivered twice has two, each finished by its node's clock, skewed up to MAX_SKEW)
                if len(ids) != len(req["jobs"]) or any(
                    r is None
                    or r.job_id != j
                    or finished.get(r.execution_id, r.finished_ms or 0) < a.scheduled_ms - since_of - MAX_SKEW * 1000
                    for j, r in zip(req["jobs"], found)
                ):
                    run.report.violations.append(
                        f"{plan.id}'s execution {eid} attempt {a.attempt} sent without its requirement met: "
                        f"it carried {a.upstream_ids!r}"
                    )
        for r in sim.db.history.values():
            if r.job_id != plan.id or r.status != "skipped" or not (r.error or "").startswith(UPSTREAM_REASON):
                continue
            by = r.scheduled_ms / 1000 + wait - MAX_SKEW - 0.1
            known = [
                s
                for at, _, job, s in sim.db.successes
                if job in req["jobs"] and at < by and (s.finished_ms or 0) >= r.scheduled_ms - since_of
            ]
            if {s.job_id for s in known} >= set(req["jobs"]):
                run.report.violations.append(
                    f"{plan.id}'s occurrence at {_at(r.scheduled_ms / 1000)} skipped ({r.error}) though "
                    f"{known[0].job_id} succeeded ({known[0].execution_id}) before it stopped waiting"
                )
