"""The scenarios of ``cronman bench``. Each one is bounded in time, starts from a clean slate (no
nodes, no jobs, no history, an empty Redis and ledger) and stops the nodes it started.
"""

from __future__ import annotations

import asyncio
import json
import math
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import requests

from bench.apifloor import run_api_floor
from bench.celery_peer import run_celery
from bench.floor import run_floor
from bench.ledger import analyse
from bench.limit import run_limit
from bench.loader import JobTemplate, copy_jobs
from bench.scale10m import run_scale10m
from bench.stack import BenchNode, BenchStack, CpuMeter
from bench.ui import run_ui
from cronman.dev.embedded import _die_with_parent
from cronman.model.timeutil import iso
from cronman.settings import Settings

# Defaults for a full run; ``--quick`` uses QUICK over them; ``--param name=value`` overrides either.
DEFAULTS: dict[str, float] = {
    "nodes": 3,
    "steady.jobs": 15000,
    "steady.every": 1,
    "steady.warmup": 10,
    "steady.measure": 30,
    "steady.tail": 5,
    "ceiling.count": 0,  # 0: as many requests as steady offers in its window (jobs x measure / every)
    "ceiling.concurrency": 100,
    "peer.jobs": 10000,  # the peer cannot even load steady's 15,000 in time
    "peer.warmup": 10,
    "peer.measure": 30,
    "peer.tail": 3,
    # the Celery peer fires steady's job set (steady.jobs, steady.every); bench/celery_peer.py
    "celery.warmup": 10,
    "celery.measure": 30,
    "celery.tail": 5,
    "celery.workers": 2,  # worker processes (one a core)
    "celery.concurrency": 100,  # greenlets (gevent) or children (prefork) per worker
    "celery.prefetch": 4,  # worker_prefetch_multiplier
    "celery.gevent": 1,  # 0: the prefork pool
    "celery.standby": 1,  # a second beat waiting on RedBeat's lock
    "burst.jobs": 100_000,
    "burst.lead": 30,  # seconds from the start of loading to the due second
    "burst.bound": 90,  # give up waiting this long after the due second
    "burst.delete_after": 0,  # 1: the jobs delete themselves once fired (delete_after_completion)
    "failover.jobs": 1000,
    "failover.warmup": 10,
    "failover.measure": 40,
    "failover.kill_after": 10,
    "failover.tail": 12,
    "scale.jobs": 1_000_000,
    "scale.ready_timeout": 240,
    "crud.seconds": 10,
    "crud.concurrency": 32,
    "crud.batch_size": 1000,
    "crud.batch_concurrency": 2,
    "ui.jobs": 100_000,
    "ui.requests": 50,
    "ownership.changes": 10,
    "footprint.jobs": 100_000,
    "footprint.claims": 20_000,
    "footprint.rows": 50_000,
    "footprint.loaded": 200_000,
    "limit.seconds": 10,
    "limit.connections": 100,
    # bench/floor.py; a batch of 0: what a node sends at steady's load
    "floor.claim_batch": 0,
    "floor.done_batch": 0,
    "floor.executions": 300_000,
    "floor.rows": 200_000,
    "scale10m.jobs": 10_000_000,
    "scale10m.probes": 2000,
    "scale10m.ready_timeout": 900,
    "scale10m.catch_up_timeout": 300,
    "scale10m.warmup": 10,
    "scale10m.measure": 40,
    "scale10m.kill_after": 10,
    "scale10m.tail": 10,
}
QUICK: dict[str, float] = {
    "steady.jobs": 500,
    "steady.warmup": 5,
    "steady.measure": 8,
    "steady.tail": 3,
    "peer.jobs": 500,
    "peer.warmup": 4,
    "peer.measure": 8,
    "celery.warmup": 4,
    "celery.measure": 8,
    "celery.tail": 3,
    "burst.jobs": 10_000,
    "burst.lead": 12,
    "burst.bound": 40,
    "failover.jobs": 200,
    "failover.warmup": 5,
    "failover.measure": 20,
    "failover.kill_after": 5,
    "failover.tail": 10,
    "scale.jobs": 100_000,
    "scale.ready_timeout": 120,
    "crud.seconds": 3,
    "crud.batch_size": 500,
    "ui.jobs": 10_000,
    "ownership.changes": 3,
    "footprint.jobs": 10_000,
    "footprint.claims": 2_000,
    "footprint.rows": 5_000,
    "footprint.loaded": 20_000,
    "limit.seconds": 3,
    "floor.executions": 50_000,
    "floor.rows": 20_000,
    "scale10m.jobs": 100_000,
    "scale10m.probes": 300,
    "scale10m.ready_timeout": 120,
    "scale10m.catch_up_timeout": 60,
    "scale10m.warmup": 4,
    "scale10m.measure": 20,
    "scale10m.kill_after": 5,
    "scale10m.tail": 8,
}
NODE_READY_TIMEOUT = 90.0


@dataclass
class Bench:
    stack: BenchStack
    params: dict[str, float]
    say: Callable[[str], None] = print
    profile_dir: Path | None = None
    results: dict[str, Any] = field(default_factory=dict)

    def p(self, name: str) -> float:
        return self.params[name]

    def i(self, name: str) -> int:
        return int(self.params[name])

    @property
    def receiver_url(self) -> str:
        assert self.stack.receiver is not None
        return f"{self.stack.receiver.url}/hook"


def sleep_until(epoch: float) -> None:
    delay = epoch - time.time()
    if delay > 0:
        time.sleep(delay)


def interval_doc(url: str, every: int) -> dict[str, Any]:
    return {"schedule": {"type": "interval", "every_seconds": every}, "target": {"type": "http", "url": url}}


def node_counters(nodes: list[BenchNode]) -> dict[str, float]:
    """Counters of the nodes' /metrics (cronman_*_total), summed over the nodes, per label set."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for node in nodes:
        if not node.alive():
            continue
        try:
            text = requests.get(f"{node.url}/metrics", timeout=5).text
        except requests.RequestException:
            continue
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not s.name.startswith("cronman_") or not s.name.endswith(("_total", "_sum", "_count")):
                    continue
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "node")
                key = f"{s.name}{{{labels}}}" if labels else s.name
                out[key] = round(out.get(key, 0.0) + s.value, 3)
    return out


def cpu_us_per(cpu: dict[str, Any], prefix: str, per_s: float | None) -> float | None:
    """CPU microseconds the parts named ``prefix*`` spent per unit of ``per_s`` (fires, requests)."""
    cores = sum(v for k, v in cpu["cores_used"].items() if k.startswith(prefix))
    return round(cores / per_s * 1e6, 1) if per_s else None


def _sum(*values: float | None) -> float | None:
    return None if any(v is None for v in values) else round(sum(v for v in values if v is not None), 1)


def start_cluster(b: Bench, slot_counts: dict[int, int]) -> tuple[list[BenchNode], float]:
    stack = b.stack
    nodes = stack.start_nodes(b.i("nodes"))
    stack.wait_ready(nodes, NODE_READY_TIMEOUT)
    settle = stack.wait_settled(nodes, slot_counts, NODE_READY_TIMEOUT)
    return nodes, settle


# ---------------------------------------------------------------------------------------------
# steady


def run_steady(b: Bench) -> dict[str, Any]:
    stack = b.stack
    assert stack.receiver is not None
    jobs, every = b.i("steady.jobs"), b.i("steady.every")
    warmup, measure, tail = b.p("steady.warmup"), b.p("steady.measure"), b.p("steady.tail")
    stack.reset()
    template = JobTemplate.of(interval_doc(b.receiver_url, every))
    ids = [f"steady-{i:06d}" for i in range(jobs)]
    slots: dict[int, int] = {}
    load = copy_jobs(stack.database_url, ((j, template) for j in ids), jobs, slots)
    b.say(f"  steady: {jobs} jobs every {every}s loaded in {load['copy_s']}s; starting {b.i('nodes')} nodes")
    nodes, settle = start_cluster(b, slots)
    t0 = math.ceil(time.time()) + warmup
    t1 = t0 + measure
    ready = max(n.ready_after or 0.0 for n in nodes)
    b.say(f"  steady: nodes ready in {ready:.1f}s, settled {settle:.1f}s later; warm-up {warmup:g}s, then {measure:g}s")
    sleep_until(t0 - 0.5)
    stack.receiver.reset()
    sleep_until(t0)
    meter = CpuMeter(stack.processes()).start()
    spy = stores = None
    if b.profile_dir is not None:
        from bench.profiling import start_py_spy
        from bench.storeprofile import StoreMeter

        stores = StoreMeter(stack.database_url, stack.redis_url).start()
        spy = start_py_spy(nodes[0].pid, measure, b.profile_dir, stack.logs)
    sleep_until(t1)
    cpu = meter.stop()
    if stores is not None:
        stores.stop()
    sleep_until(t1 + tail)
    counters = node_counters(nodes)
    connections = stack.receiver.stats()["max_connections"]  # the nodes' to the receiver, at most at once
    arrivals = stack.receiver.snapshot()
    fig = analyse(dict.fromkeys(ids, template.schedule), arrivals, t0, t1)
    rss = {n.node_id: round(n.rss_mb(), 1) for n in nodes if n.alive()}
    profile = None
    if spy is not None:
        from bench.profiling import finish_py_spy

        profile = finish_py_spy(spy, nodes[0].node_id)
    if stores is not None and b.profile_dir is not None:
        from bench.storeprofile import write_report

        report = stores.report(round(fig.arrivals_per_s * measure))
        write_report(report, b.profile_dir / "bench-stores.txt")
        profile = {**(profile or {}), "stores": report}
    b.say(f"  steady: {fig.fires_per_s:.0f} fires/s, lag p99 {fig.lag_ms['p99']} ms; stopping nodes")
    stopped = stack.stop_nodes()
    out = fig.as_dict()
    out.update(
        stop=stopped,
        jobs=jobs,
        every_seconds=every,
        nodes=len(nodes),
        warmup_s=warmup,
        load=load,
        settle_s=round(settle, 2),
        cpu=cpu,
        node_cpu_us_per_fire=cpu_us_per(cpu, "bench-node-", fig.fires_per_s),
        store_cpu_us_per_fire=_sum(
            cpu_us_per(cpu, "postgres", fig.fires_per_s), cpu_us_per(cpu, "redis", fig.fires_per_s)
        ),
        rss_mb=rss,
        node_counters=counters,
        receiver_connections=connections,
    )
    if profile is not None:
        out["profile"] = profile
    return out


# ---------------------------------------------------------------------------------------------
# ceiling


def _ceiling_once(b: Bench, count: int, jobs: int, loop: str) -> dict[str, Any]:
    stack = b.stack
    assert stack.receiver is not None
    stack.receiver.reset()
    argv = [
        sys.executable,
        "-m",
        "bench.ceiling",
        "--url",
        b.receiver_url,
        "--count",
        str(count),
        "--concurrency",
        str(b.i("ceiling.concurrency")),
        "--jobs",
        str(jobs),
        "--loop",
        loop,
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent()
    )
    # the client reports its own CPU time (it has exited, and cannot be measured, when the meter stops)
    parts = {k: v for k, v in stack.processes().items() if k in ("receiver", "bench")}
    meter = CpuMeter(parts).start()
    try:
        out, err = proc.communicate(timeout=60 + count / 500)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError("the ceiling client did not finish in time") from None
    cpu = meter.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"the ceiling client failed: {err[-2000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["received"] = stack.receiver.count()
    result["cpu"] = cpu
    result["client_cpu_us_per_request"] = result.get("cpu_us_per_request")  # the client's own account
    return result


def run_ceiling(b: Bench) -> dict[str, Any]:
    jobs = b.i("steady.jobs")
    count = b.i("ceiling.count")
    if count <= 0:
        count = int(jobs * b.p("steady.measure") / b.p("steady.every"))
    b.stack.stop_nodes()
    fastest = _ceiling_once(b, count, jobs, "uvloop")
    b.say(f"  ceiling: {fastest['requests']} requests in {fastest['seconds']}s on {fastest['loop']}")
    plain = _ceiling_once(b, count, jobs, "asyncio") if fastest["loop"] == "uvloop" else fastest
    b.say(f"  ceiling: {plain['requests']} requests in {plain['seconds']}s on the default asyncio loop")
    best = fastest if fastest["requests_per_s"] >= plain["requests_per_s"] else plain
    return {
        "requests_per_s": best["requests_per_s"],
        "requests": best["requests"],
        "errors": best["errors"],
        "seconds": best["seconds"],
        "concurrency": best["concurrency"],
        "loop": best["loop"],
        "client_cpu_us_per_request": best["client_cpu_us_per_request"],
        "requests_per_s_uvloop": fastest["requests_per_s"] if fastest["loop"] == "uvloop" else None,
        "requests_per_s_asyncio": plain["requests_per_s"],
        "runs": {"uvloop": fastest, "asyncio": plain} if fastest is not plain else {"asyncio": plain},
    }


# ---------------------------------------------------------------------------------------------
# peer


def _read_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError("the peer did not report in time")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the peer exited ({proc.poll()})")
    doc: dict[str, Any] = json.loads(line)
    return doc


def run_peer(b: Bench) -> dict[str, Any]:
    try:
        import apscheduler
    except ImportError:
        raise RuntimeError("APScheduler is not installed: pip install -e '.[bench]'") from None
    stack = b.stack
    assert stack.receiver is not None
    stack.reset()
    jobs, every = b.i("peer.jobs"), b.i("steady.every")
    warmup, measure, tail = b.p("peer.warmup"), b.p("peer.measure"), b.p("peer.tail")
    seconds = warmup + measure + 2
    argv = [
        sys.executable,
        "-m",
        "bench.peer",
        "--url",
        b.receiver_url,
        "--jobs",
        str(jobs),
        "--every",
        str(every),
        "--seconds",
        str(seconds),
        "--concurrency",
        str(b.i("ceiling.concurrency")),
    ]
    log = open(stack.logs / "peer.log", "ab")  # noqa: SIM115 - the child keeps its own copy
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, preexec_fn=_die_with_parent()
    )
    log.close()
    try:
        hello = _read_line(proc, 120)
        started = float(hello["started_at"])
        t0 = math.ceil(started) + warmup
        t1 = t0 + measure
        version = apscheduler.__version__
        b.say(f"  peer: APScheduler {version} on {hello['loop']} with {jobs} jobs; measuring {measure:g}s")
        sleep_until(t0 - 0.5)
        stack.receiver.reset()
        sleep_until(t0)
        meter = CpuMeter({"peer": [proc.pid], "receiver": [stack.receiver.pid]}).start()
        sleep_until(t1)
        cpu = meter.stop()
        final = _read_line(proc, seconds + 60)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    sleep_until(t1 + tail)
    template = JobTemplate.of(interval_doc(b.receiver_url, every))
    ids = [f"steady-{i:06d}" for i in range(jobs)]
    fig = analyse(dict.fromkeys(ids, template.schedule), stack.receiver.snapshot(), t0, t1)
    out = fig.as_dict()
    out.update(
        name="apscheduler",
        version=apscheduler.__version__,
        loop=hello["loop"],
        jobs=jobs,
        every_seconds=every,
        add_seconds=hello.get("add_seconds"),
        sent=final.get("sent"),
        errors=final.get("errors"),
        cpu=cpu,
        cpu_us_per_fire=cpu_us_per(cpu, "peer", fig.fires_per_s),
    )
    return out


# ---------------------------------------------------------------------------------------------
# burst


def run_burst(b: Bench) -> dict[str, Any]:
    stack = b.stack
    assert stack.receiver is not None
    jobs, lead, bound = b.i("burst.jobs"), b.p("burst.lead"), b.p("burst.bound")
    delete_after = bool(b.i("burst.delete_after"))
    stack.reset()
    nodes, _ = start_cluster(b, {})
    due = math.ceil(time.time() + lead)
    spec: dict[str, Any] = {
        "schedule": {"type": "once", "at": iso(due * 1000)},
        "target": {"type": "http", "url": b.receiver_url},
    }
    if delete_after:
        spec["delete_after_completion"] = True
    template = JobTemplate.of(spec)
    ids = [f"burst-{i:07d}" for i in range(jobs)]
    slots: dict[int, int] = {}
    load = copy_jobs(stack.database_url, ((j, template) for j in ids), jobs, slots)
    b.say(f"  burst: {jobs} once jobs due at {iso(due * 1000)} loaded in {load['copy_s']}s; nodes picking them up")
    loaded_margin: float | None
    try:
        stack.wait_settled(nodes, slots, max(1.0, due - time.time() - 0.5))
        loaded_margin = round(due - time.time(), 2)
    except RuntimeError:
        loaded_margin = None  # not all loaded before the due second: still measured, and said
        b.say("  burst: WARNING the nodes had not loaded every job before the due second")
    sleep_until(due - 0.5)
    stack.receiver.reset()
    sleep_until(due)
    meter = CpuMeter(stack.processes()).start()
    deadline = due + bound
    while time.time() < deadline:
        if stack.receiver.count() >= jobs:
            break
        time.sleep(0.2)
    cpu = meter.stop()
    time.sleep(1.0)  # a late duplicate would show now
    deleted_s = _all_deleted(stack.database_url, "burst-", due, deadline) if delete_after else None
    counters = node_counters(nodes)
    arrivals = stack.receiver.snapshot()
    stopped = stack.stop_nodes()
    fig = analyse(dict.fromkeys(ids, template.schedule), arrivals, due, due + 1)
    last = max(fig.first_arrival.values(), default=None)
    drain = round(last - due, 3) if last is not None else None
    rate = round(fig.delivered / drain, 1) if drain else None
    return {
        "jobs": jobs,
        "due_at": iso(due * 1000),
        "drain_s": drain if fig.missed == 0 else None,
        "drain_s_delivered": drain,
        "delivered": fig.delivered,
        "missed": fig.missed,
        "doubled": fig.doubled,
        "max_rate_per_s": rate,
        "node_cpu_us_per_fire": cpu_us_per(cpu, "bench-node-", fig.delivered / cpu["seconds"]),
        "lag_ms": fig.lag_ms,
        "loaded_before_due_s": loaded_margin,
        "delete_after": delete_after,
        "deleted_s": deleted_s,
        "load": load,
        "bound_s": bound,
        "cpu": cpu,
        "node_counters": counters,
        "stop": stopped,
    }


def _all_deleted(database_url: str, prefix: str, due: float, deadline: float) -> float | None:
    """Seconds from the due second until no job whose id starts with ``prefix`` is left (the jobs
    delete themselves once fired), or None if some are left at ``deadline``."""
    conn = psycopg2.connect(database_url, connect_timeout=10)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            while True:
                cur.execute("SELECT count(*) FROM jobs WHERE id LIKE %s AND deleted_at IS NULL", (prefix + "%",))
                (left,) = cur.fetchone()
                if left == 0:
                    return round(time.time() - due, 3)
                if time.time() >= deadline:
                    return None
                time.sleep(0.2)
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# failover


def run_failover(b: Bench) -> dict[str, Any]:
    stack = b.stack
    assert stack.receiver is not None
    jobs = b.i("failover.jobs")
    warmup, measure, tail = b.p("failover.warmup"), b.p("failover.measure"), b.p("failover.tail")
    stack.reset()
    template = JobTemplate.of(interval_doc(b.receiver_url, 1))
    ids = [f"failover-{i:06d}" for i in range(jobs)]
    slots: dict[int, int] = {}
    copy_jobs(stack.database_url, ((j, template) for j in ids), jobs, slots)
    nodes, _ = start_cluster(b, slots)
    t0 = math.ceil(time.time()) + warmup
    t1 = t0 + measure
    kill_at = t0 + b.p("failover.kill_after")
    victim = nodes[0].node_id
    b.say(f"  failover: {jobs} jobs every 1s on {len(nodes)} nodes; SIGKILL {victim} {kill_at - t0:g}s into the window")
    sleep_until(t0 - 0.5)
    stack.receiver.reset()
    sleep_until(kill_at)
    killed_at = stack.kill_node(victim)
    sleep_until(t1 + tail)
    survivors = [n for n in nodes if n.alive()]
    counters = node_counters(survivors)
    arrivals = stack.receiver.snapshot()
    stopped = stack.stop_nodes()
    schedules = dict.fromkeys(ids, template.schedule)
    fig = analyse(schedules, arrivals, t0, t1)
    before = analyse(schedules, arrivals, t0, killed_at)
    after = analyse(schedules, arrivals, killed_at, min(t1, killed_at + 15))
    out = fig.as_dict()
    out.update(
        jobs=jobs,
        killed=victim,
        killed_after_s=round(killed_at - t0, 2),
        worst_lag_ms=fig.lag_ms["max"],
        lag_ms_before_kill=before.lag_ms,
        lag_ms_15s_after_kill=after.lag_ms,
        node_counters=counters,
        stop=stopped,
    )
    return out


# ---------------------------------------------------------------------------------------------
# scale


def _scale_templates(url: str) -> list[JobTemplate]:
    target = {"type": "http", "url": url}
    docs: list[dict[str, Any]] = [
        {"schedule": {"type": "interval", "every_seconds": 3600}, "target": target},
        {"schedule": {"type": "interval", "every_seconds": 21600}, "target": target},
        {"schedule": {"type": "interval", "every_seconds": 86400}, "target": target},
        {"schedule": {"type": "cron", "expression": "0 3 1 * *"}, "target": target},
        {"schedule": {"type": "cron", "expression": "30 2 1 * *", "timezone": "America/New_York"}, "target": target},
    ]
    return [JobTemplate.of(d) for d in docs]


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def run_scale(b: Bench) -> dict[str, Any]:
    stack = b.stack
    jobs = b.i("scale.jobs")
    stack.reset()
    templates = _scale_templates(b.receiver_url)
    # 30% each of the three intervals, 10% of the two monthly cron rules
    mix = [0] * 3 + [1] * 3 + [2] * 3 + [3, 4]
    slots: dict[int, int] = {}
    rows = ((f"scale-{i:07d}", templates[mix[i % len(mix)]]) for i in range(jobs))
    b.say(f"  scale: loading {jobs} jobs")
    load = copy_jobs(stack.database_url, rows, jobs, slots)
    b.say(f"  scale: {jobs} jobs loaded in {load['copy_s']}s ({load['jobs_per_s']}/s); starting nodes together")
    nodes = stack.start_nodes(b.i("nodes"))
    stack.wait_ready(nodes, b.p("scale.ready_timeout"))
    at_ready = {n.node_id: round(n.rss_mb(), 1) for n in nodes}
    bodies = {n.node_id: n.readyz()[1] for n in nodes}
    settle = stack.wait_settled(nodes, slots, b.p("scale.ready_timeout"))
    time.sleep(2.0)
    settled_rss = {n.node_id: round(n.rss_mb(), 1) for n in nodes}
    peak = {n.node_id: _peak_rss_mb(n.pid) for n in nodes}
    members = sorted(n.node_id for n in nodes)
    shares = {n.node_id: stack.expected_jobs(n.node_id, members, slots) for n in nodes}
    stopped = stack.stop_nodes()
    ready = {n.node_id: round(n.ready_after or 0.0, 2) for n in nodes}
    return {
        "jobs": jobs,
        "node_ready_s": max(ready.values()),
        "rss_mb_per_node": max(max(at_ready.values()), max(settled_rss.values())),
        "ready_s": ready,
        "settled_after_ready_s": round(settle, 2),
        "jobs_at_ready": {k: v.get("jobs") for k, v in bodies.items()},
        "share": shares,
        "rss_mb_at_ready": at_ready,
        "rss_mb_settled": settled_rss,
        "rss_mb_peak": peak,
        "load": load,
        "stop": stopped,
    }


# ---------------------------------------------------------------------------------------------
# crud


async def _crud_single(url: str, auth: dict[str, str], target: str, seconds: float, concurrency: int) -> dict[str, Any]:
    import aiohttp

    ok = errors = 0
    lat: list[float] = []
    seq = iter(range(10**9))
    statuses: dict[int, int] = {}
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=auth) as s:

        async def worker() -> None:
            nonlocal ok, errors
            while time.monotonic() < stop_at:
                n = next(seq)
                doc = {
                    "id": f"crud-{n:08d}",
                    "schedule": {"type": "interval", "every_seconds": 3600},
                    "target": {"type": "http", "url": target},
                    "payload": {"bench": n},
                }
                t = time.perf_counter()
                try:
                    async with s.post(f"{url}/v1/jobs", json=doc, timeout=aiohttp.ClientTimeout(total=30)) as r:
                        await r.read()
                        statuses[r.status] = statuses.get(r.status, 0) + 1
                        if r.status == 201:
                            ok += 1
                            lat.append(time.perf_counter() - t)
                        else:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError, OSError):
                    errors += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    lat.sort()
    return {
        "created": ok,
        "errors": errors,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": round(elapsed, 2),
        "per_s": round(ok / elapsed, 1) if elapsed else 0.0,
        "latency_ms": {
            "p50": round(lat[len(lat) // 2] * 1000, 1) if lat else None,
            "p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1) if lat else None,
        },
    }


async def _crud_batch(
    url: str, auth: dict[str, str], target: str, seconds: float, concurrency: int, size: int
) -> dict[str, Any]:
    import aiohttp

    created = failed = requests_done = 0
    statuses: dict[int, int] = {}
    batches = iter(range(10**9))
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=auth) as s:
        probe = {
            "jobs": [
                {
                    "id": "crud-batch-probe",
                    "schedule": {"type": "interval", "every_seconds": 3600},
                    "target": {"type": "http", "url": target},
                }
            ]
        }
        async with s.post(f"{url}/v1/jobs:batch", json=probe) as r:
            await r.read()
            if r.status in (404, 405):
                return {"available": False, "probe_status": r.status}

        async def worker() -> None:
            nonlocal created, failed, requests_done
            while time.monotonic() < stop_at:
                n = next(batches)
                body = {
                    "jobs": [
                        {
                            "id": f"crud-b{n:06d}-{i:04d}",
                            "schedule": {"type": "interval", "every_seconds": 3600},
                            "target": {"type": "http", "url": target},
                            "payload": {"bench": i},
                        }
                        for i in range(size)
                    ]
                }
                try:
                    async with s.post(f"{url}/v1/jobs:batch", json=body, timeout=aiohttp.ClientTimeout(total=120)) as r:
                        raw = await r.read()
                        statuses[r.status] = statuses.get(r.status, 0) + 1
                        requests_done += 1
                        if 200 <= r.status < 300:
                            doc = json.loads(raw)
                            if isinstance(doc, dict) and "created" in doc:
                                created += int(doc.get("created") or 0) + int(doc.get("replaced") or 0)
                                failed += int(doc.get("failed") or 0)
                            else:
                                created += size
                        else:
                            failed += size
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                    failed += size

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    return {
        "available": True,
        "jobs_created": created,
        "jobs_failed": failed,
        "requests": requests_done,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": round(elapsed, 2),
        "jobs_per_s": round(created / elapsed, 1) if elapsed else 0.0,
    }


def run_crud(b: Bench) -> dict[str, Any]:
    stack = b.stack
    stack.reset()
    url = stack.ensure_api()
    seconds = b.p("crud.seconds")
    spies = None
    if b.profile_dir is not None:  # the API's workers during the single creates (py-spy slows them down)
        from bench.profiling import start_py_spy_many, worker_pids

        workers = worker_pids(stack.processes()["api"][0], Settings.model_fields["api_workers"].default)
        spies = start_py_spy_many(workers, seconds, b.profile_dir, stack.logs)
    meter = CpuMeter(stack.processes()).start()
    single = asyncio.run(_crud_single(url, stack.auth, b.receiver_url, seconds, b.i("crud.concurrency")))
    single_cpu = meter.stop()
    profile = None
    if spies is not None and b.profile_dir is not None:
        from bench.profiling import finish_py_spy_many

        profile = finish_py_spy_many(spies, b.profile_dir, "api", "cronman API workers (crud single creates)")
    b.say(f"  crud: {single['created']} single creates in {single['seconds']}s ({single['per_s']}/s)")
    meter = CpuMeter(stack.processes()).start()
    batch = asyncio.run(
        _crud_batch(url, stack.auth, b.receiver_url, seconds, b.i("crud.batch_concurrency"), b.i("crud.batch_size"))
    )
    batch["cpu"] = meter.stop()
    if batch.get("available"):
        b.say(f"  crud: {batch['jobs_created']} jobs in batches in {batch['seconds']}s ({batch['jobs_per_s']}/s)")
    else:
        b.say(f"  crud: POST /v1/jobs:batch is not available here ({batch.get('probe_status')})")
    single["cpu"] = single_cpu
    per_s = single["per_s"]
    return {
        "single_per_s": per_s,
        "api_cpu_us_per_create": cpu_us_per(single_cpu, "api", per_s),
        "postgres_cpu_us_per_create": cpu_us_per(single_cpu, "postgres", per_s),
        "batch_jobs_per_s": batch.get("jobs_per_s"),
        "single": single,
        "batch": batch,
        "api_workers": Settings.model_fields["api_workers"].default,
        **({"profile": profile} if profile is not None else {}),
    }


def run_ownership(b: Bench) -> dict[str, Any]:
    """Membership changes at 50, 200 and 500 simulated nodes: loop time, slots moved, balance
    (bench.ownership; pure computation, no stack)."""
    from bench.ownership import render, run

    figures = run(changes=b.i("ownership.changes"))
    b.say(render([{"nodes": int(n), **r} for n, r in figures["by_nodes"].items()]))
    return figures


def run_footprint(b: Bench) -> dict[str, Any]:
    """Memory per owned job, Redis bytes per claim, PostgreSQL bytes per history row
    (bench.footprint; starts a Redis and a PostgreSQL of its own)."""
    from bench.footprint import run

    return run(b.i("footprint.jobs"), b.i("footprint.claims"), b.i("footprint.rows"), b.i("footprint.loaded"))


SCENARIOS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "steady": run_steady,
    "ceiling": run_ceiling,
    "peer": run_peer,
    "celery": run_celery,
    "burst": run_burst,
    "failover": run_failover,
    "scale": run_scale,
    "crud": run_crud,
    "api-floor": run_api_floor,
    "ui": run_ui,
    "ownership": run_ownership,
    "footprint": run_footprint,
    "limit": run_limit,
    "floor": run_floor,
    "scale10m": run_scale10m,
}
# Scenarios that need no PostgreSQL, Redis or receiver: a run of only these starts none.
STACKLESS = frozenset({"ownership", "footprint"})
