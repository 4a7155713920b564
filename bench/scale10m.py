"""The ``scale10m`` scenario: EventBridge Scheduler's default quota (ten million schedules) stored,
three nodes started together, one of them killed while the cluster fires.

The job set is what a fleet registers, not ten million copies of one document:

- the mix of the ``scale`` scenario: 30 % each every hour, every 6 hours, every day (each job at its
  own phase), 10 % monthly crons, half in UTC and half in America/New_York;
- ids of 20 to 40 characters (``<team>.<task>-<n>``), payloads of 100 to 500 bytes, each different,
  and 10 % of the jobs with headers;
- ``scale10m.probes`` of them (2,000 by default) fire every second: they are what the failover is
  measured on. The rest fire about a thousand times a second between them, as their phases fall.

Figures: ``node_ready_s`` (node start to every node owning its share, the slowest node),
``rss_mb_per_node`` (the largest resident set at that point, and settled), ``caught_up_s`` (from
then until the nodes have no late occurrence queued: what fell due while they loaded, delivered
late; the warm-up and the window with the kill start after it, so that the failover is measured
on a cluster that keeps up, not on one still catching up a cold start), ``failover_refire_s``
(after SIGKILL of one node, the latest delivery of a probe occurrence due in the 15 s after the
kill, counted from its due time or the kill, whichever is later) and ``missed`` (probe
occurrences due in the measured window never delivered).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bench.ledger import analyse
from bench.loader import JobTemplate, copy_jobs

if TYPE_CHECKING:
    from bench.scenarios import Bench

TEAMS = ("ops", "billing", "payments", "search", "identity", "inventory", "notifications", "ml", "growth", "ledger")
TASKS = ("sync", "report", "cleanup", "reindex", "invoice-run", "token-rotation", "digest", "export", "warmup")
SCHEDULES: tuple[dict[str, Any], ...] = (
    {"type": "interval", "every_seconds": 3600},
    {"type": "interval", "every_seconds": 21600},
    {"type": "interval", "every_seconds": 86400},
    {"type": "cron", "expression": "0 3 1 * *"},
    {"type": "cron", "expression": "30 2 1 * *", "timezone": "America/New_York"},
)
# 30 % each of the three intervals, 10 % of the two monthly crons (5 % each)
MIX = (0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 4)
HEADERS = {"X-Team": "bench", "X-Request-Source": "cronman-scale10m"}
# characters payloads are cut from: every payload is a different slice
_POOL = hashlib.shake_256(b"cronman scale10m").hexdigest(1 << 16)


def templates(url: str) -> tuple[list[JobTemplate], list[JobTemplate]]:
    """(without headers, with headers), one per schedule of the mix."""
    plain = [JobTemplate.of({"schedule": s, "target": {"type": "http", "url": url}}) for s in SCHEDULES]
    headed = [
        JobTemplate.of({"schedule": s, "target": {"type": "http", "url": url, "headers": HEADERS}}) for s in SCHEDULES
    ]
    return plain, headed


def job_id(n: int) -> str:
    """``<team>.<task>-<n>``, 20 to 40 characters."""
    team, task = TEAMS[n % len(TEAMS)], TASKS[(n // len(TEAMS)) % len(TASKS)]
    text = f"{team}.{task}-{n:09d}"
    if len(text) < 20:
        text = f"{team}.{task}-job-{n:09d}"
    return text


def payload(job: str, n: int) -> str:
    """A JSON object of 100 to 500 bytes, different for every job."""
    size = 100 + (n * 7919) % 401
    head = f'{{"job":"{job}","attempt_window":{n % 3600},"params":"'
    fill = size - len(head) - 2
    start = (n * 104729) % (len(_POOL) - 512)
    return f'{head}{_POOL[start : start + fill]}"}}'


def rows(count: int, probes: int, url: str) -> tuple[Iterator[tuple[str, JobTemplate, str]], dict[str, Any]]:
    """The job set, and the schedules of the probe jobs (every second)."""
    plain, headed = templates(url)
    every_second = {"type": "interval", "every_seconds": 1}
    probe = JobTemplate.of({"schedule": every_second, "target": {"type": "http", "url": url}})
    probe_ids = [f"probe.every-second-{i:06d}" for i in range(probes)]

    def gen() -> Iterator[tuple[str, JobTemplate, str]]:
        for i, pid in enumerate(probe_ids):
            yield pid, probe, payload(pid, i)
        for n in range(count - probes):
            jid = job_id(n)
            kind = MIX[n % len(MIX)]
            t = headed[kind] if n % 10 == 3 else plain[kind]
            yield jid, t, payload(jid, n)

    return gen(), dict.fromkeys(probe_ids, probe.schedule)


# Resident memory a node needs per job it owns with this job set, the node's own baseline included
# (measured at 10M: 451 B on 2026-11-29 with payloads out of memory beyond the payload horizon,
# from 763 B with every payload held; 852 B at 5M on 2026-11-25). Kept a third above the
# measurement, and the check below leaves 15 % of what is available to PostgreSQL, Redis and the
# bench. Each job is owned by two nodes (after a node is lost, by the two left: the same total).
NODE_BYTES_PER_OWNED_JOB = 600


def memory_check(jobs: int) -> None:
    """Refuse to start when the nodes could not hold the job set: better a clear line than the
    kernel's OOM killer taking a node, PostgreSQL or the bench itself."""
    need = jobs * 2 * NODE_BYTES_PER_OWNED_JOB
    available = 0
    with open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    if available and need > available * 0.85:
        fits = int(available * 0.85 / (2 * NODE_BYTES_PER_OWNED_JOB) // 1_000_000 * 1_000_000)
        raise RuntimeError(
            f"{jobs:,} jobs need about {need / 2**30:.1f} GiB of node memory ({NODE_BYTES_PER_OWNED_JOB} bytes per"
            f" owned job, each job owned twice) and {available / 2**30:.1f} GiB is available;"
            f" run it with --param scale10m.jobs={fits} (docs/performance.md, scale10m)"
        )


def run_scale10m(b: Bench) -> dict[str, Any]:
    stack = b.stack
    assert stack.receiver is not None
    count, probes = b.i("scale10m.jobs"), b.i("scale10m.probes")
    memory_check(count)
    stack.reset()
    slots: dict[int, int] = {}
    generated, probe_schedules = rows(count, probes, b.receiver_url)
    b.say(f"  scale10m: loading {count:,} jobs ({probes:,} of them every second)")
    load = copy_jobs(stack.database_url, generated, count, slots)
    b.say(f"  scale10m: loaded in {load['copy_s']}s ({load['jobs_per_s']:,.0f}/s); starting {b.i('nodes')} nodes")
    nodes, up = _start_nodes(b, slots)
    caught_up_s = _caught_up(b, nodes)
    w = _kill_window(b, nodes, probe_schedules)
    fig, after, refire = w["fig"], w["after"], w["refire"]
    at_ready, settled_rss, shares = up["rss_mb_at_ready"], up["rss_mb_settled"], up["share"]
    return {
        "jobs": count,
        "probes": probes,
        "node_ready_s": up["node_ready_s"],
        "readyz_s": {n.node_id: round(n.ready_after or 0.0, 2) for n in nodes},
        "caught_up_s": caught_up_s,
        "ready_cpu": up["ready_cpu"],
        "rss_mb_per_node": max(max(at_ready.values()), max(settled_rss.values())),
        "rss_mb_at_ready": at_ready,
        "rss_mb_settled": settled_rss,
        "rss_mb_after_failover": w["after_rss"],
        "bytes_per_owned_job": round(max(settled_rss.values()) * 2**20 / max(shares.values())),
        "share": shares,
        "killed": w["killed"],
        "killed_after_s": w["killed_after_s"],
        "failover_refire_s": round(refire, 2) if after.missed == 0 else None,
        "failover_refire_s_delivered": round(refire, 2),
        "missed": fig.missed,
        "doubled": fig.doubled,
        "probe_lag_ms": fig.lag_ms,
        "probe_lag_ms_15s_after_kill": after.lag_ms,
        "other_deliveries": w["others"],
        "other_per_s": w["other_per_s"],
        "load": load,
        "cpu": w["cpu"],
        "node_counters": w["counters"],
        "stop": w["stop"],
    }


def _start_nodes(b: Bench, slots: dict[int, int]) -> tuple[list[Any], dict[str, Any]]:
    """Start the nodes together and wait for each to own its share of the loaded jobs: the nodes,
    and how long it took, with what (RSS at ready and settled, the machine's cores meanwhile)."""
    from bench.stack import CpuMeter

    stack, timeout = b.stack, b.p("scale10m.ready_timeout")
    t_start = time.monotonic()
    nodes = stack.start_nodes(b.i("nodes"))
    # where becoming ready spends the machine: the nodes' and PostgreSQL's cores, and how busy
    # the machine was (what bounds it, docs/performance.md)
    ready_meter = CpuMeter(stack.processes()).start()
    stack.wait_ready(nodes, timeout)
    at_ready = {n.node_id: round(n.rss_mb(), 1) for n in nodes}
    stack.wait_settled(nodes, slots, timeout)
    owning = time.monotonic() - t_start
    ready_cpu = ready_meter.stop()
    settled_rss = {n.node_id: round(n.rss_mb(), 1) for n in nodes}
    members = sorted(n.node_id for n in nodes)
    shares = {n.node_id: stack.expected_jobs(n.node_id, members, slots) for n in nodes}
    warmup, measure, kill_after = b.p("scale10m.warmup"), b.p("scale10m.measure"), b.p("scale10m.kill_after")
    b.say(
        f"  scale10m: every node owns its share {owning:.1f}s after start; RSS {max(settled_rss.values()):,.0f} MB"
        f" (largest); {warmup:g}s warm-up, then SIGKILL of one node {kill_after:g}s into {measure:g}s"
    )
    b.say(
        f"  scale10m: until then the machine was {ready_cpu['machine_busy']:.0%} busy: "
        + ", ".join(f"{k} {v:.2f}" for k, v in ready_cpu["cores_used"].items() if v)
        + " cores"
    )
    return nodes, {
        "node_ready_s": round(owning, 2),
        "ready_cpu": ready_cpu,
        "rss_mb_at_ready": at_ready,
        "rss_mb_settled": settled_rss,
        "share": shares,
    }


def _caught_up(b: Bench, nodes: list[Any]) -> float | None:
    """Seconds until no node has a late occurrence queued (``cronman_backlog``), twice a second
    apart: the catch-up of what fell due while the nodes loaded is delivered. None if it was not
    within ``scale10m.catch_up_timeout`` (the window then starts anyway)."""
    t0 = time.monotonic()
    deadline = t0 + b.p("scale10m.catch_up_timeout")
    quiet = 0
    while time.monotonic() < deadline:
        backlog = sum(_gauge(n, "cronman_backlog") for n in nodes)
        quiet = quiet + 1 if backlog == 0 else 0
        if quiet >= 2:
            took = round(time.monotonic() - t0 - 1.0, 1)
            b.say(f"  scale10m: the catch-up of the load's minutes delivered {took:.1f}s after that")
            return took
        time.sleep(1.0)
    b.say("  scale10m: the nodes still had late occurrences queued at the catch-up timeout")
    return None


def _gauge(node: Any, name: str) -> float:
    """A gauge of one node's /metrics (0 when it cannot be read)."""
    import requests

    try:
        text = requests.get(f"{node.url}/metrics", timeout=5).text
    except requests.RequestException:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _kill_window(b: Bench, nodes: list[Any], probe_schedules: dict[str, Any]) -> dict[str, Any]:
    """After the warm-up, the measured window with one node SIGKILLed in it, and the tail: what the
    probes got, and how long the occurrences due after the kill took to be delivered."""
    from bench.scenarios import node_counters, sleep_until
    from bench.stack import CpuMeter

    stack = b.stack
    assert stack.receiver is not None
    warmup, measure = b.p("scale10m.warmup"), b.p("scale10m.measure")
    kill_after, tail = b.p("scale10m.kill_after"), b.p("scale10m.tail")
    t0 = math.ceil(time.time()) + warmup
    t1 = t0 + measure
    sleep_until(t0 - 0.5)
    stack.receiver.reset()
    sleep_until(t0)
    meter = CpuMeter(stack.processes()).start()
    sleep_until(t0 + kill_after)
    victim = nodes[0].node_id
    killed_at = stack.kill_node(victim)
    sleep_until(t1)
    cpu = meter.stop()
    sleep_until(t1 + tail)
    survivors = [n for n in nodes if n.alive()]
    counters = node_counters(survivors)
    after_rss = {n.node_id: round(n.rss_mb(), 1) for n in survivors}
    arrivals = stack.receiver.snapshot()
    stopped = stack.stop_nodes()
    after = analyse(probe_schedules, arrivals, killed_at, min(t1, killed_at + 15))
    # the latest delivery of an occurrence due after the kill, from its due time (or the kill)
    refire = 0.0
    for (_, due_ms), at in after.first_arrival.items():
        refire = max(refire, at - max(due_ms / 1000, killed_at))
    others = sum(1 for a in arrivals if a.at >= t0 and a.job_id not in probe_schedules)
    return {
        "fig": analyse(probe_schedules, arrivals, t0, t1),
        "after": after,
        "refire": refire,
        "after_rss": after_rss,
        "killed": victim,
        "killed_after_s": round(killed_at - t0, 2),
        "others": others,
        "other_per_s": round(others / (t1 + tail - t0), 1),
        "cpu": cpu,
        "counters": counters,
        "stop": stopped,
    }
