"""What one job, one claim and one history row cost, measured (the figures behind docs/scaling.md):

    cronman bench --scenarios footprint
    python -m bench.footprint [--jobs 100000] [--claims 20000] [--rows 50000] [--loaded 200000] [--json FILE]

- node memory per owned job: Python heap allocated (tracemalloc) to decode and install jobs in a
  firer: the job object, its timing, its timer entry and its share of the node's maps. Jobs that
  share a target and payload (a fleet calling a few endpoints) and jobs with their own each;
- Redis memory per open claim (claim key with its lease + its entry in the slot's index), per
  finished claim (the done mark kept ``done_ttl_seconds``) and per history row waiting to be written
  (kept until the writer says it is in PostgreSQL), from ``INFO memory`` of a Redis of its own;
- Redis CPU per execution (two owners claim it, one marks it done, the row is forgotten once
  written; and with only the slot's leader claiming, as when standing by), in batches of 100 as a
  node's timer passes send them: on one Redis, where a batch is one script call, and on a
  3-primary Redis Cluster, where it is one call per slot tag;
- PostgreSQL bytes per history row (table, TOAST and indexes of a day partition) written by the
  node's own writer, and per job (the jobs table and its indexes, jobs COPYed as the bench loads
  them), from a PostgreSQL of its own;
- node resident memory per job after a load: 200,000 jobs of the ``scale10m`` fleet mix COPYed
  there, then loaded, kept until ready and installed in a firer in a fresh process, as a node does.

Starts its own Redis and PostgreSQL (the embedded ones: ``pip install -e '.[devservers]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
import tracemalloc
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cronman.model.execution import Trigger, execution_id
from cronman.model.hashing import slot_of


def _job_row(i: int, shared: bool) -> Any:
    from scheduler_node.jobs import JobRow

    job_id = f"tenant-{i % 97:02d}-job-{i:07d}"
    url = "https://hooks.example.com/cron" if shared else f"https://hooks.example.com/cron/{job_id}"
    payload = '{"task":"report"}' if shared else json.dumps({"task": "report", "job": job_id, "n": i})
    schedule = {"type": "interval", "every_seconds": 60} if i % 2 else {"type": "cron", "expression": "*/5 * * * *"}
    return JobRow(
        job_id,
        slot_of(job_id),
        i + 1,
        json.dumps(schedule),
        json.dumps({"type": "http", "url": url, "timeout_seconds": 10}),
        payload,
        json.dumps({"max_attempts": 3, "backoff_seconds": 10}),
        False,
        1_790_000_000_000,
        "default",
        "{}",
        1,
        False,
    )


def _history_row(job_id: str, scheduled: int, eid: str) -> Any:
    """A typical row: first attempt, delivered with a 200, 12 ms late, 28 ms to answer."""
    from scheduler_node.history import HistoryRow

    node = "cronman-scheduler-7d9f8c6b5-x2k4q"
    return HistoryRow(
        job_id, scheduled, 0, 1, eid, "schedule", "succeeded", node, scheduled + 12, scheduled + 40, 12, 200, None,
        None, None, 1, "default",
    )  # fmt: skip


def _installer(now_ms: int) -> tuple[Any, Any]:
    """A firer with no parts (installing jobs touches none) and a decoder: (firer, decoder)."""
    from scheduler_node.firer import Firer, FirerConfig
    from scheduler_node.jobs import Decoder
    from scheduler_node.metrics import NodeMetrics
    from scheduler_node.senders import Senders
    from scheduler_node.senders.http import HttpSender

    senders = Senders([HttpSender(100, dev_mode=True)])
    firer = Firer(
        FirerConfig(node_id="n", lease_ms=5000, max_in_flight=100, namespace_share=1.0, sweep_seconds=1.0),
        clock=lambda: now_ms,
        claims=None,  # type: ignore[arg-type]
        senders=senders,
        history=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        metrics=NodeMetrics("n"),
    )
    return firer, Decoder(senders.decode)


def node_bytes_per_job(count: int, shared: bool) -> float:
    """Heap bytes per job decoded and installed in a firer (timer entry included)."""
    firer, decoder = _installer(1_790_000_000_000)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    # The rows are made inside the window and dropped before the end, as a load drops them: what a
    # job keeps of its row (its id, its slot and version numbers) counts, the rest does not.
    rows = [_job_row(i, shared) for i in range(count)]
    for row in rows:
        firer.install(decoder.job(row), 1_790_000_000_000)
    del rows, row
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(firer.jobs) == count and len(firer.table.fires) == count
    return (after - before) / count


async def _redis_figures(url: str, count: int) -> dict[str, float]:
    from cronman.redis.keys import Keys
    from cronman.redis.redisconn import async_client
    from cronman.settings import Settings
    from scheduler_node.claims import RedisClaims
    from scheduler_node.execution import Descriptor
    from scheduler_node.history import row_to_text
    from scheduler_node.parts import Finish, Ticket

    client = async_client(Settings(redis_url=url))
    claims = RedisClaims(client, Keys("cronman:"), f"cronman-scheduler-7d9f8c6b5-x2k4q/{uuid.uuid4().hex[:8]}", 60_000)

    async def used() -> int:
        await asyncio.sleep(0.2)
        return int((await client.info("memory"))["used_memory"])

    tickets, rows = [], []
    for i in range(count):
        job_id = f"tenant-{i % 97:02d}-job-{i:07d}"
        scheduled = 1_790_000_000_000 + i * 10
        d = Descriptor(job_id, 1, scheduled, 0, Trigger.SCHEDULE)
        eid = execution_id(job_id, scheduled, 0, Trigger.SCHEDULE)
        tickets.append(Ticket(slot_of(job_id), eid, d.member()))
        rows.append(row_to_text(_history_row(job_id, scheduled, eid)))
    try:
        await client.flushall()
        base = await used()
        for i in range(0, count, 1000):
            await claims.claim(tickets[i : i + 1000], 5_000)
        open_ = await used()
        for i in range(0, count, 1000):
            await claims.done(
                [Finish(t, "succeeded", 1, r) for t, r in zip(tickets[i : i + 1000], rows[i : i + 1000], strict=True)]
            )
        finished_unrecorded = await used()
        await claims.recorded([(t.slot, r) for t, r in zip(tickets, rows, strict=True)])
        finished = await used()
    finally:
        await client.aclose()
    return {
        "open_claim_bytes": round((open_ - base) / count, 1),
        "finished_claim_bytes": round((finished - base) / count, 1),
        "unrecorded_row_bytes": round((finished_unrecorded - finished) / count, 1),
        "row_text_bytes": round(sum(len(r) for r in rows) / count, 1),
    }


async def _cpu_per_execution(settings: Any, count: int, cpu_seconds: Any, both: bool = True) -> tuple[float, float]:
    """Redis CPU and the calling process's CPU (µs) per execution's claims, done mark and
    forgetting, in batches of 100: both owners claim (the default), or only the slot's leader
    (``both=False``: standing by, ``standby_grace_seconds`` above 0)."""
    from cronman.redis.keys import Keys
    from cronman.redis.redisconn import RedisMode, async_client
    from scheduler_node.claims import RedisClaims
    from scheduler_node.parts import Finish, Ticket

    sharded = RedisMode(settings.redis_mode) is RedisMode.CLUSTER
    clients = [async_client(settings), async_client(settings)]
    keys = Keys("cpu:" if both else "cpu-leader:")  # a run of its own: no claim of the other run's found
    a, b = (RedisClaims(c, keys, f"node-{n}/x", 60_000, sharded=sharded) for n, c in zip("ab", clients))
    tickets = []
    for i in range(count):
        job_id = f"tenant-{i % 97:02d}-job-{i:07d}"
        tickets.append(Ticket(slot_of(job_id), f"{job_id}-{i}", f"1|{i}|0|schedule||1|{job_id}"))
    try:
        await a.claim(tickets[:100], 5000)  # scripts loaded, connections open
        before, client_before = cpu_seconds(), time.process_time()
        for i in range(100, count, 100):
            batch = tickets[i : i + 100]
            await a.claim(batch, 5000)
            if both:
                await b.claim(batch, 5000)
            await a.done([Finish(t, "succeeded", 1, f"row-{t.name}") for t in batch])
            await a.recorded([(t.slot, f"row-{t.name}") for t in batch])
        client = time.process_time() - client_before
        n = count - 100
        return round((cpu_seconds() - before) * 1e6 / n, 1), round(client * 1e6 / n, 1)
    finally:
        for c in clients:
            await c.aclose()


def redis_cpu(count: int, work: Path) -> dict[str, float]:
    import redis as redis_lib

    from cronman.dev.embedded import EmbeddedRedis
    from cronman.dev.embedded_redis import RedisClusterProcs
    from cronman.settings import Settings

    def used(clients: list[Any]) -> float:
        return sum(float(c.info("cpu")["used_cpu_user"]) + float(c.info("cpu")["used_cpu_sys"]) for c in clients)

    out: dict[str, float] = {}
    server = EmbeddedRedis(work / "redis-cpu", persist=False)
    server.start()
    try:
        one = [redis_lib.Redis.from_url(server.url())]
        out["redis_cpu_us_per_execution"], out["client_cpu_us_per_execution"] = asyncio.run(
            _cpu_per_execution(Settings(redis_url=server.url()), count, lambda: used(one))
        )
        out["redis_cpu_us_per_execution_standby"], _ = asyncio.run(
            _cpu_per_execution(Settings(redis_url=server.url()), count, lambda: used(one), both=False)
        )
    finally:
        server.stop()
    procs = RedisClusterProcs(work / "redis-cluster")
    procs.start()
    try:
        primaries = [procs.client(p) for p in procs.primary_ports()]
        settings = Settings(redis_mode="cluster", redis_url=",".join(procs.seed_urls(3)))
        out["redis_cluster_cpu_us_per_execution"], out["cluster_client_cpu_us_per_execution"] = asyncio.run(
            _cpu_per_execution(settings, count, lambda: used(primaries))
        )
    finally:
        procs.stop()
    return out


def redis_bytes(count: int, work: Path) -> dict[str, float]:
    from cronman.dev.embedded import EmbeddedRedis

    server = EmbeddedRedis(work / "redis", persist=False)
    server.start()
    try:
        return asyncio.run(_redis_figures(server.url(), count))
    finally:
        server.stop()


def postgres_bytes(count: int, work: Path, load_jobs: int = 200_000) -> dict[str, float]:
    import psycopg2

    from cronman.dev.embedded import EmbeddedPostgres
    from cronman.store.migrate import run_maintenance, upgrade
    from cronman.store.store import make_engine
    from scheduler_node.store import PgNodeStore

    server = EmbeddedPostgres(work / "pg", durable=False, log=work / "pg.log")
    server.start()
    executor = ThreadPoolExecutor(2)
    try:
        admin = psycopg2.connect(server.url("postgres"))
        admin.autocommit = True
        admin.cursor().execute("CREATE DATABASE footprint")
        admin.close()
        url = server.url("footprint")
        upgrade(url)
        engine = make_engine(url, pool_size=2)
        today = datetime.now(UTC).date()
        run_maintenance(engine, today, 45, 2)
        day_ms = int(datetime(today.year, today.month, today.day, tzinfo=UTC).timestamp() * 1000)
        store = PgNodeStore(engine, executor)
        for start in range(0, count, 5000):
            batch = []
            for i in range(start, min(count, start + 5000)):
                job_id = f"tenant-{i % 97:02d}-job-{i % 20_000:07d}"
                scheduled = day_ms + 3_600_000 + i * 100
                batch.append(_history_row(job_id, scheduled, execution_id(job_id, scheduled, 0, Trigger.SCHEDULE)))
            store.write_history(batch)
        conn = psycopg2.connect(url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE scheduled_jobs")
            partition = f"scheduled_jobs_{today:%Y%m%d}"
            cur.execute("SELECT pg_total_relation_size(%s), pg_relation_size(%s)", (partition, partition))
            total, heap = cur.fetchone()  # type: ignore[misc]
        conn.close()
        engine.dispose()
        jobs = _jobs_bytes(url, count)
        admin = psycopg2.connect(server.url("postgres"))
        admin.autocommit = True
        admin.cursor().execute("CREATE DATABASE fleet")
        admin.close()
        upgrade(server.url("fleet"))
        admin = psycopg2.connect(server.url("postgres"))
        admin.autocommit = True
        admin.cursor().execute("CREATE DATABASE writes")
        admin.close()
        upgrade(server.url("writes"))
        return {
            "history_row_bytes": round(total / count, 1),
            "history_row_heap_bytes": round(heap / count, 1),
            "job_row_bytes": jobs,
            **load_rss(server.url("fleet"), load_jobs, work),
            **history_write_cost(server.url("writes"), executor),
        }
    finally:
        executor.shutdown()
        server.stop()


def history_write_cost(url: str, executor: ThreadPoolExecutor, jobs: int = 4000, rounds: int = 12) -> dict[str, float]:
    """What a node's history writer spends per row: the same ``jobs`` delivered once a second for
    ``rounds`` seconds, written in batches of 1,000 as a busy node writes them (the history rows
    and each job's health row). Figures of the rounds after the first three (the health rows
    exist by then): the writer's CPU (this process, adapting and sending; PostgreSQL waited for
    is not counted), the wall time, and the share of health updates PostgreSQL made HOT."""
    import psycopg2

    from cronman.store.migrate import run_maintenance
    from cronman.store.store import make_engine
    from scheduler_node.store import PgNodeStore

    if rounds < 4:
        raise ValueError("history_write_cost measures the rounds after the first three: give it at least 4")
    engine = make_engine(url, pool_size=2)
    today = datetime.now(UTC).date()
    run_maintenance(engine, today, 45, 2)
    day_ms = int(datetime(today.year, today.month, today.day, tzinfo=UTC).timestamp() * 1000)
    store = PgNodeStore(engine, executor)
    ids = [f"tenant-{i % 97:02d}-job-{i:07d}" for i in range(jobs)]
    cpu = wall = 0.0
    measured = 0
    try:
        for r in range(rounds):
            at = day_ms + 3_600_000 + r * 1000
            rows = [_history_row(j, at, execution_id(j, at, 0, Trigger.SCHEDULE)) for j in ids]
            for k in range(0, jobs, 1000):
                c0, t0 = time.process_time(), time.perf_counter()
                store.write_history(rows[k : k + 1000])
                if r >= 3:
                    cpu += time.process_time() - c0
                    wall += time.perf_counter() - t0
                    measured += len(rows[k : k + 1000])
    finally:
        engine.dispose()
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            # the writers' backends report their counts when they end (just now): wait for them
            for _ in range(50):
                cur.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'job_health'")
                updated, hot = cur.fetchone()  # type: ignore[misc]
                if updated >= jobs * (rounds - 1):
                    break
                time.sleep(0.1)
    finally:
        conn.close()
    return {
        "history_write_cpu_us_per_row": round(cpu / measured * 1e6, 1),
        "history_write_wall_us_per_row": round(wall / measured * 1e6, 1),
        "health_hot_update_share": round(hot / updated, 3) if updated else 0.0,
    }


def _jobs_bytes(url: str, count: int) -> float:
    """Bytes per job in the jobs table with its indexes, for jobs loaded as the bench loads them."""
    import psycopg2

    from bench.loader import JobTemplate, copy_jobs

    template = JobTemplate.of(
        {
            "schedule": {"type": "cron", "expression": "*/5 * * * *"},
            "target": {"type": "http", "url": "https://hooks.example.com/cron", "timeout_seconds": 10},
            "labels": {"team": "billing", "tier": "batch"},
        }
    )
    copy_jobs(url, ((f"tenant-{i % 97:02d}-job-{i:07d}", template) for i in range(count)), count)
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE jobs")
            cur.execute("SELECT pg_total_relation_size('jobs')")
            return round(int(cur.fetchone()[0]) / count, 1)  # type: ignore[index]
    finally:
        conn.close()


def load_rss(url: str, count: int, work: Path) -> dict[str, float]:
    """Resident memory per job after a node's load: ``count`` jobs of the ``scale10m`` fleet mix
    (payloads of 100-500 bytes each different, ids of 20-40 characters) COPYed, then read in a
    process of its own (resident memory counts what the load's transient objects left behind, which
    a traced heap does not)."""
    import subprocess

    from bench import scale10m
    from bench.loader import copy_jobs

    jobs, _ = scale10m.rows(count, 0, "https://hooks.example.com/cron")
    copy_jobs(url, jobs, count)
    out = work / "load-rss.json"
    subprocess.run(
        [sys.executable, "-m", "bench.footprint", "--load-rss", url, "--json", str(out)],
        check=True,
        timeout=600,
    )
    figures: dict[str, float] = json.loads(out.read_text())
    return figures


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _measure_load(url: str) -> dict[str, float]:
    """In a fresh process: the node's load of every slot (streamed and decoded, the jobs kept with
    what each still owes until the node is ready, then installed in a firer, at the product's
    payload horizon), and the resident memory it leaves per job over the process's own."""
    from cronman.model.hashing import SLOTS
    from cronman.settings import Settings
    from cronman.store.store import make_engine
    from scheduler_node.jobs import ALWAYS_KEPT_BYTES
    from scheduler_node.store import PgNodeStore

    engine = make_engine(url, pool_size=1)
    executor = ThreadPoolExecutor(1)
    now = int(time.time() * 1000)
    firer, decoder = _installer(now)
    # with the product's payload horizon: payloads of jobs due past it left out (scheduler_node.payloads)
    horizon_s = Settings.model_fields["payload_horizon_seconds"].default
    if horizon_s > 0:
        firer.table.keep_until = now + int(horizon_s * 1000)
        decoder.payload_limit = ALWAYS_KEPT_BYTES
    store = PgNodeStore(engine, executor)
    gc.collect()
    base = _rss_mb()
    started = time.process_time()
    _, loaded = store.feed.load_slots(list(range(SLOTS)), decoder)
    count = len(loaded)
    gc.freeze()
    # as a node that is not ready yet keeps them (scheduler_node.loading: Loading.load, then Node.become_ready)
    since = now - 5000
    pending: dict[str, int] = {}
    for job, updated_ms in loaded:
        firer.stage(job)
        pending[job.id] = max(since, updated_ms - 1)
    del loaded
    for job_id, start in pending.items():
        firer.install(firer.jobs.pop(job_id), start)
    del pending
    firer.compact()
    cpu = time.process_time() - started
    gc.collect()
    rss = _rss_mb()
    executor.shutdown()
    engine.dispose()
    return {
        "load_jobs": count,
        "load_rss_baseline_mb": round(base, 1),
        "load_rss_bytes_per_job": round((rss - base) * 2**20 / max(count, 1)),
        "load_cpu_us_per_job": round(cpu * 1e6 / max(count, 1), 1),
    }


def per_day(row_bytes: float, fires_per_s: float) -> dict[str, float]:
    rows = fires_per_s * 86_400
    return {"rows_per_day": rows, "gb_per_day": round(rows * row_bytes / 1e9, 1)}


def run(jobs: int = 100_000, claims: int = 20_000, rows: int = 50_000, loaded: int = 200_000) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cronman-footprint-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the embedded PostgreSQL may run as an unprivileged user
        out: dict[str, Any] = {
            "node_bytes_per_job_shared_target": round(node_bytes_per_job(jobs, shared=True), 1),
            "node_bytes_per_job_own_target": round(node_bytes_per_job(jobs, shared=False), 1),
            **redis_bytes(claims, work),
            **redis_cpu(claims, work),
            **postgres_bytes(rows, work, loaded),
        }
    for rate in (10_000, 100_000):
        out[f"history_at_{rate}_per_s"] = per_day(out["history_row_bytes"], rate)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--claims", type=int, default=20_000)
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--loaded", type=int, default=200_000, help="jobs of the fleet mix a node loads")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--load-rss", default=None, metavar="URL", help=argparse.SUPPRESS)  # the child's part
    args = p.parse_args(argv)
    if args.load_rss:
        figures = _measure_load(args.load_rss)
        if args.json:
            Path(args.json).write_text(json.dumps(figures) + "\n")
        return 0
    figures = run(args.jobs, args.claims, args.rows, args.loaded)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
