"""The figures of a bench run: the JSON document, the targets with pass/fail, and the table."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import metadata
from typing import Any

# The targets of the performance work: half the cost per delivery and a third of the memory per job,
# against yardsticks measured in the same run (the C tools' floor, the Celery peer, the minimal
# create endpoint). ``sized``: met only at the full sizes, so not judged in a --quick run (which
# shrinks sizes and durations about tenfold).


@dataclass(frozen=True)
class Target:
    path: str
    op: str  # ">=", "<=", "=="
    value: float
    label: str
    sized: bool = True


TARGETS = (
    Target("steady.fires_per_s", ">=", 15000, "steady: fires/s sustained, 3 nodes"),
    Target("steady.lag_ms.p99", "<=", 1000, "steady: lag p99 (ms)"),
    Target("steady.missed", "==", 0, "steady: missed", sized=False),
    Target("steady.doubled", "==", 0, "steady: doubled", sized=False),
    Target("steady.node_cpu_us_per_fire", "<=", 45, "steady: node CPU per delivery, all nodes (us)"),
    Target("steady.store_cpu_us_per_fire", "<=", 25, "steady: PostgreSQL + Redis CPU per delivery (us)"),
    Target("ratio_to_ceiling", ">=", 2.0, "ratio to ceiling (steady fires/s / bare aiohttp client's rate)"),
    Target("ratio_to_floor", ">=", 0.4, "ratio to floor (steady fires/s / the C tools' rate per delivery)"),
    Target("ratio_to_celery", ">=", 3.0, "ratio to Celery (steady fires/s / beat + RedBeat + workers)"),
    Target("ratio_to_limit", ">=", 0.3, "ratio to limit (highest sustained rate / wrk's rate)"),
    Target("ratio_to_peer", ">=", 5, "ratio to peer (steady fires/s / APScheduler fires/s)"),
    Target("burst.drain_s", "<=", 4, "burst: drain (s) of 100,000 due in one second"),
    Target("burst.missed", "==", 0, "burst: missed", sized=False),
    Target("failover.missed", "==", 0, "failover: missed", sized=False),
    Target("failover.doubled", "==", 0, "failover: doubled", sized=False),
    Target("scale.node_ready_s", "<=", 15, "scale: node start to ready (s), 1M jobs"),
    Target("scale.rss_mb_per_node", "<=", 600, "scale: resident memory per node (MB)"),
    Target("scale10m.node_ready_s", "<=", 60, "scale10m: node start to every node owning its share (s)"),
    Target("scale10m.rss_mb_per_node", "<=", 2048, "scale10m: resident memory per node (MB)"),
    Target("scale10m.bytes_per_owned_job", "<=", 300, "scale10m: node RSS per owned job (bytes)"),
    Target("scale10m.failover_refire_s", "<=", 5, "scale10m: a node killed, its slots fire again (s)"),
    Target("scale10m.missed", "==", 0, "scale10m: missed", sized=False),
    Target("footprint.node_bytes_per_job_own_target", "<=", 250, "footprint: node memory per owned job (bytes)"),
    Target("crud.single_per_s", ">=", 1000, "crud: single creates/s"),
    Target("crud.batch_jobs_per_s", ">=", 10000, "crud: jobs/s in batches of 1,000"),
    Target("ratio_to_api_floor", ">=", 0.5, "ratio to api-floor (single creates / minimal Flask + psycopg2)"),
    Target("ui.jobs_page_ms.p95", "<=", 300, "ui: jobs page p95 (ms), 100,000 jobs"),
    Target("ui.selector_ms.p95", "<=", 300, "ui: jobs page with a label selector p95 (ms)"),
    Target(
        "ownership.by_nodes.200.loop_ms_max",
        "<=",
        20,
        "ownership: loop time per membership change, 200 nodes (ms, worst)",
        sized=False,
    ),
)

# Figures shown in the table without a target of their own.
CONTEXT = (
    ("steady.lag_ms.p50", "steady: lag p50 (ms)"),
    ("steady.lag_ms.max", "steady: lag max (ms)"),
    ("steady.cpu.machine_busy", "steady: machine busy (fraction of all cores)"),
    ("steady.cpu.cores_unaccounted", "steady: busy cores outside the stack (other load, kernel)"),
    ("limit.requests_per_s", "limit: wrk on the ledger receiver, requests/s"),
    ("ratio_to_ceiling_at_max", "ratio to the aiohttp client's ceiling (burst)"),
    ("ceiling.requests_per_s", "ceiling: bare aiohttp client, requests/s"),
    ("ceiling.requests_per_s_asyncio", "ceiling: same, default asyncio loop, requests/s"),
    ("ceiling.client_cpu_us_per_request", "ceiling: client CPU per request (us)"),
    ("floor.per_delivery_us.total", "floor: CPU per delivery by the C tools (us)"),
    ("floor.per_delivery_us.request", "floor: a request, wrk and the receiver (us)"),
    ("floor.per_delivery_us.claim", "floor: a claim, claim.lua by redis-benchmark (us)"),
    ("floor.per_delivery_us.done", "floor: a done mark, done.lua by redis-benchmark (us)"),
    ("floor.per_delivery_us.history_row", "floor: a history row by COPY (us)"),
    ("floor.rate_per_s", "floor: deliveries/s on this machine's cores"),
    ("celery.fires_per_s", "celery: beat + RedBeat + workers, fires/s"),
    ("celery.arrivals_per_s", "celery: deliveries arriving a second, late ones included"),
    ("celery.lag_ms.p99", "celery: lag p99 (ms)"),
    ("celery.lag_ms_own_due.p99", "celery: lag p99 after the instant beat meant (ms)"),
    ("celery.missed", "celery: missed"),
    ("celery.doubled", "celery: doubled"),
    ("celery.cpu_us_per_fire", "celery: beat and workers' CPU per delivery (us)"),
    ("peer.fires_per_s", "peer: APScheduler fires/s"),
    ("peer.cpu_us_per_fire", "peer: APScheduler CPU per delivery (us)"),
    ("peer.lag_ms.p99", "peer: lag p99 (ms)"),
    ("peer.missed", "peer: missed"),
    ("burst.max_rate_per_s", "burst: delivered / drain (fires/s, cronman's max rate)"),
    ("burst.lag_ms.p50", "burst: lag p50 (ms)"),
    ("burst.node_cpu_us_per_fire", "burst: node CPU per delivery, all nodes (us)"),
    ("failover.worst_lag_ms", "failover: worst lag (ms)"),
    ("failover.lag_ms_15s_after_kill.p99", "failover: lag p99 in the 15 s after the kill (ms)"),
    ("scale.load.copy_s", "scale: COPY of the jobs (s)"),
    ("scale.settled_after_ready_s", "scale: ready to settled (s)"),
    ("scale10m.load.copy_s", "scale10m: COPY of the 10M jobs (s)"),
    ("scale10m.caught_up_s", "scale10m: owning its share to the load's catch-up delivered (s)"),
    ("scale10m.bytes_per_owned_job", "scale10m: node RSS per owned job (bytes)"),
    ("scale10m.doubled", "scale10m: doubled"),
    ("scale10m.other_per_s", "scale10m: deliveries/s of the other jobs meanwhile"),
    ("crud.single.latency_ms.p99", "crud: single create latency p99 (ms)"),
    ("crud.api_cpu_us_per_create", "crud: API CPU per single create (us)"),
    ("api_floor.creates_per_s", "api-floor: minimal Flask + psycopg2 creates/s"),
    ("api_floor.server_cpu_us_per_create", "api-floor: its CPU per create (us)"),
    ("ui.jobs_page_2_ms.p95", "ui: jobs page 2 p95 (ms)"),
    ("ui.selector_sorted_by_next_fire_ms.p95", "ui: selector, sorted by next fire p95 (ms)"),
    ("ui.search_ms.p95", "ui: search p95 (ms)"),
    ("ui.failing_ms.p95", "ui: failing jobs p95 (ms)"),
    ("ui.failures_ms.p95", "ui: failures page p95 (ms)"),
    ("ui.api_selector_ms.p95", "ui: GET /v1/jobs?selector= p95 (ms)"),
    ("ownership.by_nodes.200.loop_ms_median", "ownership: loop time per change, 200 nodes (ms, median)"),
    ("ownership.by_nodes.200.loop_idle_ms", "ownership: loop stall with nothing to compute (ms, noise)"),
    ("ownership.by_nodes.200.first_computation_ms", "ownership: cold table, 200 nodes, computed alone (ms)"),
    ("ownership.by_nodes.50.loop_ms_max", "ownership: loop time per change, 50 nodes (ms, worst)"),
    ("ownership.by_nodes.500.loop_ms_max", "ownership: loop time per change, 500 nodes (ms, worst)"),
    ("ownership.by_nodes.200.slots_moved_on_loss_mean", "ownership: slots moved on a loss, 200 nodes"),
    ("ownership.by_nodes.200.slots_moved_on_loss_expected", "ownership: expected (R x 4096 / N), 200 nodes"),
    ("ownership.by_nodes.200.balance_max_over_mean", "ownership: balance max/mean, 200 nodes"),
    ("footprint.node_bytes_per_job_shared_target", "footprint: node heap per owned job, shared target (bytes)"),
    ("footprint.load_rss_bytes_per_job", "footprint: node RSS per job after a load of the fleet mix (bytes)"),
    ("footprint.load_cpu_us_per_job", "footprint: node CPU per job loaded (us)"),
    ("footprint.open_claim_bytes", "footprint: Redis per open claim (bytes)"),
    ("footprint.finished_claim_bytes", "footprint: Redis per finished claim, while kept (bytes)"),
    ("footprint.unrecorded_row_bytes", "footprint: Redis per history row not yet written (bytes)"),
    ("footprint.history_row_bytes", "footprint: PostgreSQL per history row, with indexes (bytes)"),
    ("footprint.history_at_10000_per_s.gb_per_day", "footprint: history GB/day at 10,000 fires/s"),
    ("footprint.history_at_100000_per_s.gb_per_day", "footprint: history GB/day at 100,000 fires/s"),
    ("footprint.history_write_cpu_us_per_row", "footprint: history writer CPU per row, batches of 1,000 (us)"),
    ("footprint.health_hot_update_share", "footprint: job health updates PostgreSQL made HOT (share)"),
)


def lookup(doc: dict[str, Any], path: str) -> Any:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def judge(t: Target, value: Any, quick: bool) -> str:
    if value is None or not isinstance(value, int | float):
        return "n/a"
    if quick and t.sized:
        return "(quick)"
    ok = {">=": value >= t.value, "<=": value <= t.value, "==": value == t.value}[t.op]
    return "pass" if ok else "FAIL"


def evaluate(doc: dict[str, Any], quick: bool) -> list[dict[str, Any]]:
    return [
        {
            "metric": t.path,
            "label": t.label,
            "value": lookup(doc, t.path),
            "target": f"{t.op} {t.value:g}",
            "verdict": judge(t, lookup(doc, t.path), quick),
        }
        for t in TARGETS
    ]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    return str(v)


def render_table(doc: dict[str, Any]) -> str:
    rows = [("metric", "value", "target", "verdict")]
    rows += [(r["label"], _fmt(r["value"]), r["target"], r["verdict"]) for r in doc["targets"]]
    rows += [(label, _fmt(lookup(doc, path)), "", "") for path, label in CONTEXT if lookup(doc, path) is not None]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out = []
    for n, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) if i != 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def render_markdown(doc: dict[str, Any]) -> str:
    """The same table in Markdown (for docs/performance.md)."""
    lines = ["| metric | value | target | verdict |", "|---|---:|---|---|"]
    lines += [f"| {r['label']} | {_fmt(r['value'])} | {r['target']} | {r['verdict']} |" for r in doc["targets"]]
    lines += [
        f"| {label} | {_fmt(lookup(doc, path))} | | |" for path, label in CONTEXT if lookup(doc, path) is not None
    ]
    return "\n".join(lines)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_facts(database_url: str | None = None, redis_url: str | None = None) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if models:
            facts["cpu_model"] = models[0]
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    facts["memory_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    facts["packages"] = {
        d: _version(d)
        for d in (
            "cronman",
            "aiohttp",
            "redis",
            "psycopg2-binary",
            "SQLAlchemy",
            "gunicorn",
            "uvloop",
            "APScheduler",
            "celery",
            "celery-redbeat",
            "gevent",
        )
    }
    if database_url:
        try:
            import psycopg2

            conn = psycopg2.connect(database_url, connect_timeout=5)
            with conn.cursor() as cur:
                cur.execute("SHOW server_version")
                facts["postgres"] = cur.fetchone()[0]  # type: ignore[index]
            conn.close()
        except Exception:  # noqa: BLE001 - a fact we can do without
            pass
    if redis_url:
        try:
            import redis

            client = redis.Redis.from_url(redis_url, socket_timeout=5)
            facts["redis"] = client.info("server").get("redis_version")
            client.close()
        except Exception:  # noqa: BLE001
            pass
    return facts
