"""One simulated cluster run: a workload of jobs with receivers that answer well or badly, the
real nodes on simulated Redis and PostgreSQL, and a nemesis that kills, pauses, restarts (one
after the other), adds and removes nodes, empties or cuts off Redis, stalls PostgreSQL, and stops
the whole cluster. Everything is drawn from one seed, so a run replays exactly."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from cronman.model.schedule import LAZY_PHASE_MIN_MS
from cronman.settings import Settings
from scheduler_node.node import Node, NodeParts
from scheduler_node.senders import Senders
from scheduler_node.sim.loop import InlineExecutor, SimLoop, World
from scheduler_node.sim.parts import Receivers, SimClaims, SimDb, SimMembership, SimRedis, SimSender, SimStore

SLOW_FROM = 100_000  # seeds from here on also draw slow spells (SimConfig.slow)
FLAKY_FROM = 300_000  # seeds from here on also draw spells of lost answers (SimConfig.flaky)
# Seeds of this range also draw spells of PostgreSQL's answers lost (SimConfig.db_flaky); a range,
# not a start, so that the seeds above it (the opt-in faults' mixes, the seeds kept because they
# found a defect) replay the runs they always had.
DB_FLAKY_SEEDS = range(400_000, 500_000)
# Seeds from here on give the nodes a backlog room of a few executions (SimConfig.backlog), so that
# catch-ups and a loss's claims again wait in the backlog, as millions of jobs make them do.
BACKLOG_FROM = 950_000
# Seeds from here on draw half their Redis outages 5-12 s long (SimConfig.long_redis_down): past
# the outage threshold, with the nodes alive and retrying, a node becoming ready as Redis returns
# judges whether the cluster was firing.
LONG_REDIS_DOWN_FROM = 980_000
# Seeds from here on draw the nodes' timings (SimConfig.timings: draw_timings) and their jobs'
# phases (SimConfig.phases), and run for at least twice the drawn heartbeat TTL; the seeds below
# (7,300,001-7,301,500 among them, a sweep of 60 s runs) replay the runs they always had.
TIMINGS_FROM = 7_500_000
# Seeds from here on add jobs that wait (SimConfig.chains): asynchronous work, whose receivers
# accept it and report its end later (or never); chains extract -> transform -> load, load after
# transform and audit (a fan-in); jobs that require an extract's recent success. Drawn from a
# generator of their own; every seed below replays the run it always had.
CHAINS_FROM = 9_000_000
# Seeds from here on give every job a payload of its own of 100-400 bytes and the nodes a payload
# horizon of 0.5-8 s (SimConfig.payloads; drawn from a generator of their own): payloads are let go
# and read again (ahead, or when an execution needs one) all through the faults, and every
# delivery must carry its job's payload. Every seed below replays the run it always had.
PAYLOADS_FROM = 9_500_000
EPOCH = 1_893_456_000.0  # 2030-01-01T00:00:00Z: a fixed start, so runs do not depend on today

FAULTS = (
    "kill",
    "pause",
    "restart",
    "join",
    "leave",
    "redis_loss",
    "redis_down",
    "db_down",
    "cluster_stop",
)
# Faults only a run that names them draws (--faults), so that the default mix, and with it every
# seed's run, stays as it was. db_hang: PostgreSQL accepts and never answers for a while (a hung
# server, not a refused connection), every round trip waiting until it answers again. partition:
# one node cut off from Redis for 1-8 s, the others reaching it as ever (its leases run out while it
# still sends). db_partition: one node cut off from PostgreSQL, the others reaching it. power_cut:
# Redis (without persistence) and every node go down at once, Redis back empty, the nodes 1-8 s
# later: nobody that saw the old data lives to notice the loss.
OPT_IN_FAULTS = ("db_hang", "partition", "db_partition", "power_cut")


# The settings whose values the seeds from TIMINGS_FROM on draw (draw_timings), each from the range
# cronman.settings.Settings accepts.
TIMINGS = (
    "heartbeat_interval_seconds",
    "heartbeat_ttl_seconds",
    "membership_poll_seconds",
    "lease_seconds",
    "change_poll_seconds",
    "progress_seconds",
    "outage_after_seconds",
    "load_grace_seconds",
)


def accepted(name: str) -> tuple[float, float]:
    """The range of a setting, as cronman.settings.Settings validates it."""
    lo = hi = None
    for m in Settings.model_fields[name].metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    if lo is None or hi is None:
        raise ValueError(f"{name} has no closed range in Settings")
    return float(lo), float(hi)


def shipped_timings() -> dict[str, float]:
    """The timings a deployment gets when it sets none (Settings' defaults)."""
    return {name: float(Settings.model_fields[name].default) for name in TIMINGS}


def draw_timings(seed: int) -> dict[str, float]:
    """The nodes' timings for a seed: every third seed (a multiple of 3) runs the shipped defaults;
    the others draw each one log-uniformly (load grace: uniformly) from the range the settings
    accept, within the rules between them (Settings._timings_agree)."""
    if seed % 3 == 0:
        return shipped_timings()
    rng = random.Random(f"timings/{seed}")

    def draw(name: str, lo: float | None = None, hi: float | None = None) -> float:
        a, b = accepted(name)
        a, b = max(a, lo if lo is not None else a), min(b, hi if hi is not None else b)
        return round(math.exp(rng.uniform(math.log(a), math.log(b))), 3)

    interval = draw("heartbeat_interval_seconds")
    progress = draw("progress_seconds")
    grace = accepted("load_grace_seconds")
    # (most outage thresholds short enough for the run's stops of the whole cluster to be outages)
    least = 2 * max(progress, interval)
    if rng.random() < 0.7:
        outage = draw("outage_after_seconds", lo=least, hi=max(least, 30))
    else:
        outage = draw("outage_after_seconds", lo=max(least, 30))
    return {
        "heartbeat_interval_seconds": interval,
        "heartbeat_ttl_seconds": draw("heartbeat_ttl_seconds", lo=2 * interval),
        "membership_poll_seconds": draw("membership_poll_seconds", hi=interval),
        "lease_seconds": draw("lease_seconds"),
        "change_poll_seconds": draw("change_poll_seconds"),
        "progress_seconds": progress,
        "outage_after_seconds": outage,
        "load_grace_seconds": round(rng.uniform(*grace), 3),
    }


def bound_seconds(settings: Settings) -> float:
    """How late an occurrence due while any node was alive may be delivered, faults of the nodes
    whatever (docs/architecture.md, "The guarantee"): a lease, two heartbeats and 2 s."""
    return settings.lease_seconds + 2 * settings.heartbeat_interval_seconds + 2.0


@dataclass(frozen=True)
class SimConfig:
    seed: int
    duration: float = 35.0  # faults happen in (warmup, duration)
    settle: float = 18.0  # then every node is up and nothing fails
    warmup: float = 3.0
    slots: int = 64
    faults: frozenset[str] = frozenset(FAULTS)
    fault_every: float = 5.0  # mean seconds between faults
    lease_seconds: float = 2.0
    standby: bool | None = None  # a slot's standby leaves occurrences to its leader; None: odd seeds
    # Slow spells of Redis and PostgreSQL (round trips up to a second longer for a few seconds);
    # None: seeds from SLOW_FROM on, so that the seeds below replay the runs they always had.
    slow: bool | None = None
    tick: float | None = None  # the nodes' timer_tick_seconds; None: the product's default
    # Spells in which Redis applies claim calls and their answers are lost (a connection broken
    # after the request went out); None: seeds from FLAKY_FROM on.
    flaky: bool | None = None
    # The same for PostgreSQL: every call made and its answer lost (a connection broken after the
    # commit: a history write, a progress mark, an outage recorded, a backfill's lease); and Redis's
    # spells then lose the membership's answers too (a heartbeat, a standing); None: the seeds of
    # DB_FLAKY_SEEDS.
    db_flaky: bool | None = None
    # Jobs of an interval keep one timing for all of them, phased by each id when asked (what a node
    # does for intervals of a minute and more, see cronman.model.schedule.IdPhasedInterval); the
    # workload's intervals are seconds. None: seeds whose tens digit is odd.
    phased: bool | None = None
    # Late occurrences queued beyond a room of 3 claimed executions wait in the backlog, at least
    # one joining each pass (what a catch-up of hundreds of thousands does with the product's
    # room); None: seeds from BACKLOG_FROM on, a quarter of those that draw their timings.
    backlog: bool | None = None
    # Half the Redis outages last 5-12 s instead of 1-4 s, drawn from a generator of their own (the
    # rest of the run is drawn as it would be without them); None: seeds from LONG_REDIS_DOWN_FROM on.
    long_redis_down: bool | None = None
    # The nodes' timings drawn (draw_timings) instead of the fixed ones below, the run at least
    # twice the drawn heartbeat TTL long, its settling time at least the bound plus a lease and 8 s;
    # None: seeds from TIMINGS_FROM on.
    timings: bool | None = None
    # How the workload's interval jobs are phased: "spread" (each its own phase, to the millisecond)
    # or "one" (all of them, and a burst of jobs more, due at the same instants); None: drawn, for
    # the seeds that draw their timings (the others keep the workload they always had).
    phases: str | None = None
    # The jobs that wait besides the workload's (see CHAINS_FROM); None: seeds from CHAINS_FROM on.
    chains: bool | None = None
    # Payloads of their own and a payload horizon of seconds (see PAYLOADS_FROM); None: seeds from
    # PAYLOADS_FROM on.
    payloads: bool | None = None


@dataclass
class Fault:
    kind: str
    start: float
    end: float
    node: str = ""
    holder: str = ""
    worst: float = 0.0  # a slow spell's longest extra delay, each way of a round trip (s)


@dataclass
class JobPlan:
    """A job of the workload and what happened to it (times are simulated seconds)."""

    id: str
    doc: dict[str, Any]
    receiver: str
    created: list[float] = field(default_factory=list)
    deleted: list[float] = field(default_factory=list)
    paused: list[tuple[float, float]] = field(default_factory=list)  # (from, to)
    triggers: list[tuple[float, int]] = field(default_factory=list)  # (when asked, requested ms)
    backfills: list[tuple[float, str, int, int]] = field(default_factory=list)  # (when asked, id, from, to ms)


class Process:
    """One incarnation of a node: its loop, its Node, the event that stops it gracefully."""

    def __init__(self, sim: Sim, node_id: str, n: int) -> None:
        self.node_id = node_id
        self.incarnation = f"i{n}"
        self.holder = f"{node_id}/{self.incarnation}"
        self.born = sim.world.now
        self.ended: float | None = None  # killed, or asked to stop (it fires nothing more)
        self.loop: SimLoop = sim.world.new_loop(self.holder)
        skew = sim.skew.get(node_id, 0.0)
        settings = sim.settings.model_copy(update={"node_id": node_id})
        keep = int(settings.done_ttl_seconds * 1000)
        parts = NodeParts(
            claims=SimClaims(sim.redis, self.holder, keep),
            membership=SimMembership(sim.redis, node_id, int(settings.heartbeat_ttl_seconds * 1000)),
            store=SimStore(sim.db, self.holder),
            senders=Senders([SimSender(sim.receivers, node_id, self.holder)]),
            executor=InlineExecutor(),
        )
        world = sim.world
        self.node = Node(
            settings,
            clock=lambda: world.now + skew,
            parts=parts,
            slots=sim.cfg.slots,
            incarnation=self.incarnation,
            rng=random.Random(sim.rng.random()),
            tuning={"idle_seconds": 0.5, **({"backlog_room": 3, "backlog_min": 1} if sim.backlog else {})},
            phased_from_ms=0 if sim.phased else LAZY_PHASE_MIN_MS,
        )
        self.stop = asyncio.Event()
        self.stopping = False  # asked to stop (the event is set once its loop runs)
        self.task = self.loop.create_task(self._run(sim))
        self.task.add_done_callback(lambda _: world.kill(self.loop))

    async def _run(self, sim: Sim) -> None:
        if sim.tracing is not None:
            self.loop.call_soon(self._watch, sim)
        await self.node.run(self.stop)

    def _watch(self, sim: Sim) -> None:
        firer = self.node.firer
        if firer is None:
            self.loop.call_soon(self._watch, sim)
            return
        world, holder, wanted = sim.world, self.holder, sim.tracing

        def trace(step: str, e: Any, detail: str) -> None:
            if wanted in ("*", e.id, e.d.job_id):
                sim.trace.append(f"t+{world.now - EPOCH:8.3f} {holder:14} {step:9} {e.d.job_id} {e.id[:8]} {detail}")

        firer.trace = trace


class Sim:
    def __init__(self, cfg: SimConfig, tracing: str | None = None) -> None:
        timed = cfg.timings if cfg.timings is not None else cfg.seed >= TIMINGS_FROM
        timings = draw_timings(cfg.seed) if timed else {}
        if timed:
            lease, ttl = timings["lease_seconds"], timings["heartbeat_ttl_seconds"]
            bound = lease + 2 * timings["heartbeat_interval_seconds"] + 2.0  # (bound_seconds)
            cfg = replace(
                cfg,
                lease_seconds=lease,
                duration=max(cfg.duration, 2 * ttl),
                settle=max(cfg.settle, bound + lease + 8),
            )
            if cfg.phases is None:
                cfg = replace(cfg, phases=random.Random(f"phases/{cfg.seed}").choice(("spread", "one")))
        self.cfg = cfg
        self.timed = timed
        self.tracing = tracing  # a job id, an execution id, or "*": steps recorded in self.trace
        self.trace: list[str] = []
        self.rng = random.Random(cfg.seed)
        self.world = World(EPOCH)
        self.redis = SimRedis(self.world)
        self.db = SimDb(self.world, cfg.slots)
        self.receivers = Receivers(self.world, random.Random(self.rng.random()))
        self.receivers.db = self.db
        self.chains = cfg.chains if cfg.chains is not None else cfg.seed >= CHAINS_FROM
        payloads = cfg.payloads if cfg.payloads is not None else cfg.seed >= PAYLOADS_FROM
        self.payload_rng = random.Random(f"payloads/{cfg.seed}") if payloads else None
        self.waiting: set[str] = set()  # the jobs of the chains' workload (_waiting_jobs)
        # the timings of the seeds that do not draw them (validated with the drawn ones: accepted)
        fixed: dict[str, Any] = {
            "heartbeat_interval_seconds": 1.0,
            "heartbeat_ttl_seconds": 4.0,
            "membership_poll_seconds": 0.5,
            "lease_seconds": cfg.lease_seconds,
            "change_poll_seconds": 1.0,
            "load_grace_seconds": 2.0,
            "progress_seconds": 1.0,
            "outage_after_seconds": 5.0,
        }
        self.settings = Settings(
            node_id="sim",
            database_url="postgresql://sim/sim",
            redis_url="redis://sim",
            **{**fixed, **timings},
            standby_grace_seconds=0.5 if (cfg.standby if cfg.standby is not None else cfg.seed % 2 == 1) else 0.0,
            history_flush_seconds=0.2,
            history_recover_after_seconds=3.0,
            done_ttl_seconds=60.0,
            node_port=-1,
            dev_mode=True,
        )
        if cfg.tick is not None:
            self.settings = self.settings.model_copy(update={"timer_tick_seconds": cfg.tick})
        if self.payload_rng is not None:
            horizon = round(self.payload_rng.uniform(0.5, 8.0), 1)
            self.settings = self.settings.model_copy(update={"payload_horizon_seconds": horizon})
        self.phased = cfg.phased if cfg.phased is not None else (cfg.seed // 10) % 2 == 1
        if cfg.backlog is not None:
            self.backlog = cfg.backlog
        elif timed:  # a quarter of them: a catch-up's pace starved on purpose (see check._Deadlines)
            self.backlog = random.Random(f"backlog/{cfg.seed}").random() < 0.25
        else:
            self.backlog = cfg.seed >= BACKLOG_FROM
        long_down = cfg.long_redis_down if cfg.long_redis_down is not None else cfg.seed >= LONG_REDIS_DOWN_FROM
        self.long_down_rng = random.Random(f"long-redis-down/{cfg.seed}") if long_down else None
        self.processes: dict[str, Process] = {}
        self.starts = 0
        self.faults: list[Fault] = []
        self.jobs: dict[str, JobPlan] = {}
        self.skew: dict[str, float] = {}
        self.node_ids: list[str] = []
        self.stopped_all: list[tuple[float, float]] = []  # (stop, restart) of the whole cluster
        self.held_until = 0.0  # while the whole cluster is stopped, no node starts
        self.started: list[Process] = []  # every process, in the order started

    # ------------------------------------------------------------------ processes
    def start(self, node_id: str) -> None:
        self.starts += 1
        self.processes[node_id] = Process(self, node_id, self.starts)
        self.started.append(self.processes[node_id])

    def alive(self) -> list[str]:
        return sorted(n for n, p in self.processes.items() if p.loop in self.world.loops)

    def kill(self, node_id: str) -> None:
        p = self.processes[node_id]
        self.faults.append(Fault("kill", self.world.now, self.world.now, node_id, p.holder))
        self.world.kill(p.loop)
        p.ended = self.world.now if p.ended is None else p.ended

    def terminate(self, node_id: str) -> None:
        p = self.processes[node_id]
        p.ended = self.world.now if p.ended is None else p.ended
        p.stopping = True
        p.loop.call_soon(p.stop.set)

    def pause(self, node_id: str, seconds: float) -> None:
        p = self.processes[node_id]
        self.faults.append(Fault("pause", self.world.now, self.world.now + seconds, node_id, p.holder))
        self.world.paused.add(p.loop)
        self.world.at(self.world.now + seconds, lambda: self.world.paused.discard(p.loop))

    # ------------------------------------------------------------------ workload
    def _workload(self) -> None:
        rng = self.rng
        receivers = {"ok": 0.6, "fail_first": 0.2, "flaky": 0.12, "slow": 0.08}
        for i in range(rng.randint(10, 20)):
            job_id = f"job-{i}"
            kind = rng.choices(list(receivers), weights=list(receivers.values()))[0]
            receiver = f"r-{i}"
            self.receivers.behaviour[receiver] = kind
            shape = rng.random()
            if shape < 0.6:
                schedule: dict[str, Any] = {"type": "interval", "every_seconds": rng.randint(1, 5)}
                if rng.random() < 0.5:
                    schedule["start_at"] = _iso(EPOCH + rng.randint(0, 4))
            elif shape < 0.85:
                step = rng.choice([1, 2, 3, 5])
                schedule = {"type": "cron", "expression": f"*/{step} * * * * *"}
            else:
                schedule = {"type": "once", "at": _iso(EPOCH + rng.uniform(self.cfg.warmup, self.cfg.duration))}
            options: dict[str, Any] = {}
            if rng.random() < 0.4:
                options["misfire_policy"] = rng.choice(["fire_once", "skip", "fire_all"])
                options["catchup_window_seconds"] = rng.choice([5, 15, 3600])
            if rng.random() < 0.2:
                options["events_per_trigger"] = 2
            if rng.random() < 0.1:
                options["overlap_policy"] = "skip"
            doc = {
                "schedule": schedule,
                "target": {"type": "http", "url": receiver, "timeout_seconds": 2.0},
                "retry": {
                    "max_attempts": rng.randint(2, 5),
                    "backoff_seconds": rng.choice([0.2, 0.5, 1.0]),
                    "max_backoff_seconds": 3,
                },
                "options": options,
                "namespace": rng.choice(["a", "b"]),
            }
            plan = self.jobs[job_id] = JobPlan(job_id, doc, receiver)
        if self.cfg.phases is not None:
            self._phase(self.cfg.phases)
        if self.chains:
            self._waiting_jobs()
        if self.payload_rng is not None:
            for job_id, plan in self.jobs.items():
                pad = self.payload_rng.randbytes(self.payload_rng.randint(50, 200)).hex()
                plan.doc["payload"] = {"job": job_id, "pad": pad}
        for job_id, plan in self.jobs.items():
            self.db.put_job(job_id, **plan.doc)
            plan.created.append(self.world.now)

    def _phase(self, how: str) -> None:
        """Phase the interval jobs (from a generator of their own): "spread", each its own phase to
        the millisecond; "one", all of them in one phase, with 10-40 jobs more of one interval due
        at those same instants (a burst: a node claims them in one pass, both owners of a slot
        race for each, catch-ups queue them all at once)."""
        rng = random.Random(f"phases/{self.cfg.seed}/{how}")
        intervals = [p.doc["schedule"] for p in self.jobs.values() if p.doc["schedule"]["type"] == "interval"]
        if how == "spread":
            for schedule in intervals:
                schedule["start_at"] = _iso(EPOCH + rng.uniform(0, schedule["every_seconds"]))
            return
        start = _iso(EPOCH + rng.uniform(0, 1))
        for schedule in intervals:
            schedule["start_at"] = start
        every = rng.choice([1, 2, 3])
        receivers = {"ok": 0.8, "fail_first": 0.1, "flaky": 0.1}
        first = len(self.jobs)
        for i in range(first, first + rng.randint(10, 40)):
            kind = rng.choices(list(receivers), weights=list(receivers.values()))[0]
            self.receivers.behaviour[f"r-{i}"] = kind
            doc = {
                "schedule": {"type": "interval", "every_seconds": every, "start_at": start},
                "target": {"type": "http", "url": f"r-{i}", "timeout_seconds": 2.0},
                "retry": {"max_attempts": 3, "backoff_seconds": 0.5, "max_backoff_seconds": 3},
                "options": {"misfire_policy": rng.choice(["fire_once", "skip", "fire_all"])},
                "namespace": rng.choice(["a", "b"]),
            }
            self.jobs[f"job-{i}"] = JobPlan(f"job-{i}", doc, f"r-{i}")

    def _waiting_jobs(self) -> None:
        """Jobs that wait (from a generator of their own): one to three of asynchronous work
        (completion timeout 2-20 s, no heartbeat); one or two chains extract-k (asynchronous one
        time in two) -> transform-k (after extract-k) -> load-k (after transform-k and audit-k);
        most chains with a report-k that requires extract-k's recent success. Their receivers
        answer well or badly (a flaky one with two attempts fails an execution for good one time
        in nine: the chain below it is skipped)."""
        rng = random.Random(f"chains/{self.cfg.seed}")
        self.receivers.work_rng = random.Random(rng.random())

        def repeating() -> dict[str, Any]:
            if rng.random() < 0.5:
                return {"type": "interval", "every_seconds": rng.randint(3, 8)}
            return {"type": "cron", "expression": f"*/{rng.choice([3, 4, 5, 6])} * * * * *"}

        def completion() -> dict[str, Any]:
            return {"mode": "callback", "timeout_seconds": rng.randint(2, 20)}

        def add(job_id: str, schedule: dict[str, Any], ns: str, options: dict[str, Any]) -> None:
            receiver = f"r-{job_id}"
            if "completion" in options:
                self.receivers.behaviour[receiver] = "async"
            else:
                self.receivers.behaviour[receiver] = rng.choices(["ok", "fail_first", "flaky"], [0.6, 0.2, 0.2])[0]
            doc = {
                "schedule": schedule,
                "target": {"type": "http", "url": receiver, "timeout_seconds": 2.0},
                "retry": {
                    "max_attempts": rng.randint(2, 4),
                    "backoff_seconds": rng.choice([0.2, 0.5, 1.0]),
                    "max_backoff_seconds": 3,
                },
                "options": options,
                "namespace": ns,
            }
            self.jobs[job_id] = JobPlan(job_id, doc, receiver)
            self.waiting.add(job_id)

        for k in range(rng.randint(1, 3)):
            add(f"async-{k}", repeating(), rng.choice(["a", "b"]), {"completion": completion()})
        for k in range(rng.randint(1, 2)):
            ns = rng.choice(["a", "b"])
            add(f"extract-{k}", repeating(), ns, {"completion": completion()} if rng.random() < 0.5 else {})
            within = rng.choice([30, 120, 86400])
            add(f"transform-{k}", {"type": "after", "jobs": [f"extract-{k}"], "within_seconds": within}, ns, {})
            add(f"audit-{k}", repeating(), ns, {})
            fan_in = {"type": "after", "jobs": [f"transform-{k}", f"audit-{k}"], "within_seconds": within}
            add(f"load-{k}", fan_in, ns, {"completion": completion()} if rng.random() < 0.3 else {})
            if rng.random() < 0.7:
                require = {
                    "jobs": [f"extract-{k}"],
                    "within_seconds": rng.choice([10, 30, 3600]),
                    "wait_seconds": rng.choice([0, 3, 10]),
                }
                add(f"report-{k}", repeating(), ns, {"require": require})

    def _job_events(self) -> None:
        """Pauses, resumes, deletes, re-creations and manual triggers during the run."""
        rng = self.rng
        t = self.cfg.warmup
        while True:
            t += rng.expovariate(1 / 4.0)
            if t >= self.cfg.duration:
                return
            job = rng.choice(sorted(self.jobs))
            what = rng.choices(["trigger", "pause", "delete"], weights=[0.6, 0.25, 0.15])[0]
            self.world.at(EPOCH + t, functools.partial(self._job_event, job, what))

    def _job_event(self, job_id: str, what: str) -> None:
        plan = self.jobs[job_id]
        row = self.db.jobs[job_id]
        now = self.world.now
        if row.deleted or (job_id in self.waiting and what != "trigger"):
            return  # (the chains' jobs are triggered by hand, never paused nor deleted)
        if what == "trigger":
            t = self.db.trigger(job_id)
            plan.triggers.append((now, t.requested_ms))
        elif what == "pause" and not row.paused:
            self.db.change_job(job_id, paused=True)
            back = now + self.rng.uniform(1, 6)
            plan.paused.append((now, back))
            self.world.at(back, lambda: None if row.deleted else self.db.change_job(job_id, paused=False))
        elif what == "delete":
            self.db.change_job(job_id, deleted=True)
            plan.deleted.append(now)
            if self.rng.random() < 0.5:
                again = now + self.rng.uniform(1, 5)
                self.world.at(again, lambda: self._recreate(job_id))

    def _backfills(self) -> None:
        """A few backfills of the last seconds of repeating jobs, drawn from a generator of their own
        (the other events of a seed stay what they were)."""
        rng = random.Random(self.cfg.seed * 7919 + 1)
        repeating = sorted(j for j, p in self.jobs.items() if p.doc["schedule"]["type"] not in ("once", "after"))
        for n in range(rng.randint(1, 3)):
            at = rng.uniform(self.cfg.warmup + 8, self.cfg.duration - 5)
            job_id, rate = rng.choice(repeating), rng.choice([2.0, 5.0, 20.0])
            self.world.at(EPOCH + at, functools.partial(self._backfill, f"bf-{n}", job_id, rate))

    def _backfill(self, backfill_id: str, job_id: str, rate: float) -> None:
        if self.db.jobs[job_id].deleted:
            return
        now_ms = int(self.world.now * 1000)
        from_ms, to_ms = now_ms - 15_000, now_ms - 1000
        self.db.backfill(backfill_id, job_id, from_ms, to_ms, rate)
        self.jobs[job_id].backfills.append((self.world.now, backfill_id, from_ms, to_ms))

    def _recreate(self, job_id: str) -> None:
        plan = self.jobs[job_id]
        self.db.put_job(job_id, **plan.doc)
        plan.created.append(self.world.now)

    # ------------------------------------------------------------------ the nemesis
    def _nemesis(self) -> None:
        if not self.cfg.faults:  # a run that scripts its own faults (tests/sim)
            return
        rng = self.rng
        t = self.cfg.warmup
        joined = 0
        while True:
            t += rng.expovariate(1 / self.cfg.fault_every)
            if t >= self.cfg.duration - 2:
                return
            kinds = sorted(self.cfg.faults)
            weights = [0.05 if k == "cluster_stop" else 1.0 for k in kinds]
            kind = rng.choices(kinds, weights=weights)[0]
            if kind == "join":
                joined += 1
            self.world.at(EPOCH + t, functools.partial(self._fault, kind, joined))

    def _fault(self, kind: str, joined: int) -> None:
        rng, now = self.rng, self.world.now
        alive = self.alive()
        lease = self.settings.lease_seconds
        if kind in ("kill", "pause", "restart", "leave", "partition", "db_partition") and not alive:
            return
        victim = rng.choice(alive) if alive else ""
        if kind == "kill":
            self.kill(victim)
            if rng.random() < 0.8:
                self.world.at(now + rng.uniform(0.5, 8), lambda: self._revive(victim))
        elif kind == "pause":
            self.pause(victim, lease + rng.uniform(-1.0, 6.0))
        elif kind == "restart":  # one step of a rolling restart: SIGTERM, then start again
            self.faults.append(Fault("restart", now, now, victim, self.processes[victim].holder))
            self.terminate(victim)
            self.world.at(now + rng.uniform(0.3, 2.0), lambda: self._revive(victim))
        elif kind == "join" and now >= self.held_until:
            node_id = f"node-j{joined}"
            self.node_ids.append(node_id)
            self.faults.append(Fault("join", now, now, node_id))
            self.start(node_id)
        elif kind == "leave" and len(alive) > 1:
            self.faults.append(Fault("leave", now, now, victim, self.processes[victim].holder))
            self.terminate(victim)
        elif kind == "redis_loss":
            self.faults.append(Fault("redis_loss", now, now))
            self.redis.lose_everything()
        elif kind == "redis_down":
            d = rng.uniform(1, 4)
            if self.long_down_rng is not None and self.long_down_rng.random() < 0.5:
                d = self.long_down_rng.uniform(5, 12)
            self.faults.append(Fault("redis_down", now, now + d))
            self.redis.down_until = now + d
        elif kind in ("partition", "db_partition"):
            d = min(rng.uniform(1, 8), EPOCH + self.cfg.duration - now)
            self.faults.append(Fault(kind, now, now + d, victim, self.processes[victim].holder))
            server = self.redis if kind == "partition" else self.db
            server.cut[victim] = max(server.cut.get(victim, 0.0), now + d)
        elif kind == "db_down":
            d = rng.uniform(1, 8)
            self.faults.append(Fault("db_down", now, now + d))
            self.db.down_until = now + d
        elif kind == "db_hang":
            d = min(rng.uniform(2, 15), EPOCH + self.cfg.duration - now)  # answering again by then
            self.faults.append(Fault("db_hang", now, now + d))
            self.db.hang_until = max(self.db.hang_until, now + d)
        elif kind == "power_cut" and alive and now >= self.held_until:
            d = min(rng.uniform(1, 8), EPOCH + self.cfg.duration - now)
            self.faults.append(Fault("power_cut", now, now + d))
            self.faults.append(Fault("redis_loss", now, now))
            self.redis.lose_everything()
            self.stopped_all.append((now, now + d))
            self.held_until = now + d
            for n in alive:
                self.kill(n)
            self.world.at(now + d, lambda: self._revive_all(alive))
        elif kind == "cluster_stop":
            d = min(rng.uniform(8, 20), EPOCH + self.cfg.duration - now)  # everything is back by then
            self.faults.append(Fault("cluster_stop", now, now + d))
            self.stopped_all.append((now, now + d))
            self.held_until = now + d
            for n in alive:
                if rng.random() < 0.5:
                    self.kill(n)
                else:
                    self.terminate(n)
            self.world.at(now + d, lambda: self._revive_all(alive))

    def _slow_spells(self) -> None:
        """One to three spells in which Redis or PostgreSQL answers slowly: each way of a round
        trip takes up to 50 ms to 1 s more, so that answers come late and out of order (a renewal
        may come back after its lease ran out). Drawn from a generator of their own: the rest of
        the run is drawn as it would be without them."""
        rng = random.Random(f"slow/{self.cfg.seed}")
        for server in (self.redis, self.db):
            server.slow.rng = random.Random(rng.random())
        for _ in range(rng.randint(1, 3)):
            start = EPOCH + rng.uniform(self.cfg.warmup, self.cfg.duration - 2)
            end = min(start + rng.uniform(1.0, 6.0), EPOCH + self.cfg.duration)
            worst = rng.choice((0.05, 0.2, 1.0))
            kind = rng.choice(("redis_slow", "db_slow"))
            (self.redis if kind == "redis_slow" else self.db).slow.spans.append((start, end, worst))
            self.faults.append(Fault(kind, start, end, worst=worst))

    def _flaky_spells(self, part: SimRedis | SimDb, kind: str, name: str) -> None:
        """One to three spells in which each call's answer is lost with a probability of 0.1 to
        0.6, the call made: the node must take what it asked for as maybe done (for Redis a claim
        of its own found again, a take or a park that happened, a done mark made; for PostgreSQL
        history written, a mark or an outage recorded). Drawn from a generator of their own,
        ``name``/seed."""
        rng = random.Random(f"{name}/{self.cfg.seed}")
        part.flaky_rng = random.Random(rng.random())
        for _ in range(rng.randint(1, 3)):
            start = EPOCH + rng.uniform(self.cfg.warmup, self.cfg.duration - 2)
            end = min(start + rng.uniform(1.0, 6.0), EPOCH + self.cfg.duration)
            p = rng.choice((0.1, 0.3, 0.6))
            part.flaky.append((start, end, p))
            self.faults.append(Fault(kind, start, end, worst=p))

    def _revive_when_stopped(self, node_id: str, _: object) -> None:
        self.world.at(self.world.now, lambda: self._revive(node_id))

    def _revive_all(self, node_ids: list[str]) -> None:
        for n in node_ids:
            self._revive(n)

    def _revive(self, node_id: str) -> None:
        """Start the node again, as a restarted pod. One still stopping (its last flush waiting on
        a hung PostgreSQL, say) comes back once it has stopped: a restart that found it stopping
        was skipped, and it stayed away until the rest (43 of 1,218 revivals in 200 seeds)."""
        if self.world.now < self.held_until:  # the whole cluster is stopped: nobody comes back early
            return
        if node_id not in self.node_ids:
            return
        if node_id not in self.alive():
            self.start(node_id)
            return
        p = self.processes[node_id]
        if p.stopping:
            p.task.add_done_callback(functools.partial(self._revive_when_stopped, node_id))

    def _drain(self, limit: float = 300.0) -> None:
        """Run on until no node has late work queued and no backfill is running, for at most
        ``limit`` seconds more: when the settling time ends, a catch-up drained a few occurrences a
        pass (SimConfig.backlog) may still hold what the faults left owed (seed 7600779: three
        losses of Redis's data and a power cut queued thousands of checks of history on a node
        whose jobs fire in bursts), and a backfill whose driver died waits for its lease, three
        claim leases (seed 7600660: 80 s), and the checks would take either for lost."""
        until = self.world.now + limit
        while self.world.now < until and (
            any((firer := self.processes[n].node.firer) is not None and firer.timer.queued() for n in self.alive())
            or any(b.row.state == "running" for b in self.db.backfills.values())
        ):
            self.world.run_until(self.world.now + 1.0)

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        cfg, rng = self.cfg, self.rng
        handler = _Capture()
        logging.getLogger("cronman").addHandler(handler)
        try:
            self._workload()
            count = rng.randint(3, 5)
            self.node_ids = [f"node-{i}" for i in range(count)]
            for n in self.node_ids:
                self.skew[n] = rng.uniform(-1.5, 1.5)
            for n in self.node_ids:
                self.world.at(EPOCH + rng.uniform(0, 1), functools.partial(self.start, n))
            self._job_events()
            self._backfills()
            self._nemesis()
            if cfg.slow if cfg.slow is not None else cfg.seed >= SLOW_FROM:
                self._slow_spells()
            if cfg.flaky if cfg.flaky is not None else cfg.seed >= FLAKY_FROM:
                self._flaky_spells(self.redis, "redis_flaky", "flaky")
            if cfg.db_flaky if cfg.db_flaky is not None else cfg.seed in DB_FLAKY_SEEDS:
                self._flaky_spells(self.db, "db_flaky", "db-flaky")
                self.redis.members_flaky = True  # Redis's lost answers reach heartbeats and standings too
            self.world.run_until(EPOCH + cfg.duration)
            # the nemesis rests: everything comes back and nothing fails any more
            self.redis.down_until = self.db.down_until = 0
            self.redis.cut.clear()
            self.db.cut.clear()
            self.held_until = 0.0
            self.world.paused.clear()
            for n in self.node_ids:
                # one still stopping comes back once stopped (seed 405491: three nodes stopped
                # 4.4 s behind a hang, past the rest, and none ran again)
                self._revive(n)
            self.world.run_until(EPOCH + cfg.duration + cfg.settle)
            if self.timed:
                self._drain()
            self.end = self.world.now
            for n in self.alive():  # a clean stop, so that everything in flight is recorded
                self.terminate(n)
            self.world.run_until(self.world.now + 5)
        finally:
            logging.getLogger("cronman").removeHandler(handler)
        self.logged_errors = handler.errors


class _Capture(logging.Handler):
    """Errors a run logs with a traceback: a bug escaped somewhere."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.errors.append(f"{record.name}: {record.getMessage()}: {record.exc_info[1]!r}")


def _iso(t: float) -> str:
    from cronman.model.timeutil import iso

    return iso(int(t * 1000))
