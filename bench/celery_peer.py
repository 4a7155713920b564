"""The ``celery`` scenario: Celery beat with RedBeat feeding Celery workers that make the HTTP call
(:mod:`bench.celery_app`), on the steady scenario's job set (the same ids, number of jobs,
interval and phases), at the same ledger receiver, on the bench's own Redis (database 1: the
broker's queue and RedBeat's schedules) and on the same machine.

Configured as an operator would for short HTTP tasks on two cores: two beats (one leads under
RedBeat's lock, one stands by), ``beat_max_loop_interval`` of 1 s, and ``celery.workers`` worker
processes (two: one a core) on the gevent pool with ``celery.concurrency`` greenlets each (the
pool Celery's documentation gives for I/O-bound tasks; ``--param celery.gevent=0`` runs the default
prefork pool instead, ``celery.concurrency`` children each), prefetching four messages a slot,
early acknowledgement, no result backend and no events, without gossip, mingle and heartbeat.

The ledger counts the peer as it counts cronman (:mod:`bench.ledger`): an occurrence is
(job id, scheduled time) of the steady grid, and a Celery delivery's scheduled time is the grid
instant at or before the instant beat sent it for (see :mod:`bench.celery_app`). Beat's
interval schedules drift (each run is due ``every`` after the previous send): a job whose drift
passes one interval skips a grid instant, counted missed, which is what the job's owner sees.
``lag_ms`` is against the grid (drift included), ``lag_ms_own_due`` against the instant beat meant,
``drift_ms`` the difference.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from bench import checkout_on_path
from bench.ledger import analyse, percentile
from bench.loader import JobTemplate, payload_of
from bench.receiver import Arrival
from bench.stack import CpuMeter
from cronman.dev.embedded import Child
from cronman.model.schedule import phase_for
from cronman.model.timeutil import parse_iso

if TYPE_CHECKING:
    from bench.scenarios import Bench

APP = "bench.celery_app"
DB = 1  # the bench's Redis database for the peer (cronman's keys are in 0)
INSTALL = "pip install -e '.[bench]'"


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("celery", "celery-redbeat", "kombu", "gevent"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _require() -> None:
    try:
        import celery  # noqa: F401
        import redbeat  # noqa: F401
    except ImportError:
        raise RuntimeError(f"the celery scenario needs celery and celery-redbeat: {INSTALL}") from None


def _gevent() -> bool:
    try:
        import gevent  # noqa: F401
    except ImportError:
        return False
    return True


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", APP, *args]


def _start(b: Bench, env: dict[str, str], pool: str) -> dict[str, list[Child]]:
    logs = b.stack.logs
    beats = [
        Child(
            f"celery-beat-{n}",
            _celery(
                "beat",
                "-S",
                f"{APP}:LedgerScheduler",
                "--max-interval",
                "1",
                "-l",
                "WARNING",
                "--pidfile",
                str(logs / f"celery-beat-{n}.pid"),
                "-s",
                str(logs / f"celery-beat-{n}.schedule"),
            ),
            env=env,
            log=logs / f"celery-beat-{n}.log",
            cwd=str(logs),
        )
        for n in range(1, 1 + (2 if b.i("celery.standby") else 1))
    ]
    workers = [
        Child(
            f"celery-worker-{n}",
            _celery(
                "worker",
                "-P",
                pool,
                "-c",
                str(b.i("celery.concurrency")),
                "-n",
                f"bench-{n}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "WARNING",
            ),
            env=env,
            log=logs / f"celery-worker-{n}.log",
            cwd=str(logs),
        )
        for n in range(1, 1 + b.i("celery.workers"))
    ]
    return {"beat": beats, "worker": workers}


def _stop(children: list[Child], grace: float = 10.0) -> list[str]:
    """SIGTERM each (a worker finishes what it holds), then SIGKILL the process and whatever it
    forked; returns the names that had to be killed."""
    import psutil

    trees: dict[str, list[Any]] = {}
    for c in children:
        try:
            trees[c.name] = psutil.Process(c.pid).children(recursive=True)
        except psutil.Error:
            trees[c.name] = []
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(c.alive() for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = []
    for c in children:
        if c.alive():
            killed.append(c.name)
            c.proc.kill()
        c.proc.wait(10)
        for p in trees[c.name]:
            try:
                p.kill()
            except psutil.Error:
                pass
    return killed


def _own_figures(arrivals: list[Arrival], ids: set[str], t0: float, t1: float) -> dict[str, Any]:
    """Lag against the instant beat meant, and that instant's drift from the grid (ms)."""
    own, drift = [], []
    for a in arrivals:
        if a.job_id not in ids or not a.execution_id.startswith("due-"):
            continue
        try:
            scheduled = parse_iso(a.scheduled_for)
            due = int(a.execution_id[4:])
        except ValueError:
            continue
        if t0 * 1000 <= scheduled < t1 * 1000:
            own.append(int(a.at * 1000) - due)
            drift.append(due - scheduled)
    own.sort()
    drift.sort()
    return {
        "lag_ms_own_due": {q: percentile(own, p) for q, p in (("p50", 0.5), ("p99", 0.99))}
        | {"max": own[-1] if own else None},
        "drift_ms": {q: percentile(drift, p) for q, p in (("p50", 0.5), ("p99", 0.99))}
        | {"max": drift[-1] if drift else None},
    }


def _wait_first(b: Bench, children: dict[str, list[Child]], timeout: float) -> None:
    """Until the receiver has a delivery (beat leads, a worker consumes); fails on a dead process."""
    assert b.stack.receiver is not None
    deadline = time.monotonic() + timeout
    while b.stack.receiver.count() == 0:
        for c in children["beat"][:1] + children["worker"]:
            if not c.alive():
                raise RuntimeError(f"{c.name} exited with {c.proc.returncode}; see {c.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no delivery from the Celery peer within {timeout:.0f}s; see {b.stack.logs}")
        time.sleep(0.2)


def run_celery(b: Bench) -> dict[str, Any]:
    _require()
    stack = b.stack
    assert stack.receiver is not None and stack.redis is not None
    stack.reset()
    jobs, every = b.i("steady.jobs"), b.i("steady.every")
    every_ms = every * 1000
    warmup, measure, tail = b.p("celery.warmup"), b.p("celery.measure"), b.p("celery.tail")
    pool = "gevent" if b.i("celery.gevent") and _gevent() else "prefork"
    redis_url = stack.redis.url(DB)
    env = checkout_on_path(
        {
            **{k: v for k, v in os.environ.items() if not k.startswith(("CRONMAN_", "BENCH_CELERY_"))},
            "BENCH_CELERY_REDIS_URL": redis_url,
            "BENCH_CELERY_HTTP_POOL": str(b.i("celery.concurrency") if pool == "gevent" else 1),
            "BENCH_CELERY_PREFETCH": str(b.i("celery.prefetch")),
        }
    )
    from bench import celery_app

    ids = [f"steady-{i:06d}" for i in range(jobs)]
    t = time.monotonic()
    entries = [(j, payload_of(j), phase_for(j, every_ms)) for j in ids]
    first = celery_app.install_entries(redis_url, entries, b.receiver_url, every_ms, int(time.time() * 1000) + 2000)
    installed_s = round(time.monotonic() - t, 2)
    children = _start(b, env, pool)
    everything = children["beat"] + children["worker"]
    b.say(
        f"  celery: {jobs} RedBeat entries every {every}s stored in {installed_s}s; "
        f"{len(children['beat'])} beats, {len(children['worker'])} {pool} workers x {b.i('celery.concurrency')}"
    )
    try:
        _wait_first(b, children, 60 + jobs / 1000)
        started = time.time()
        t0 = math.ceil(max(started, first / 1000)) + warmup
        t1 = t0 + measure
        parts: dict[str, list[int]] = {c.name: [c.pid] for c in everything}
        parts["redis"] = [stack.redis.child.pid] if stack.redis.child else []
        parts["receiver"] = [stack.receiver.pid]
        time.sleep(max(0.0, t0 - 0.5 - time.time()))
        stack.receiver.reset()
        time.sleep(max(0.0, t0 - time.time()))
        meter = CpuMeter(parts).start()
        time.sleep(max(0.0, t1 - time.time()))
        cpu = meter.stop()
        time.sleep(max(0.0, t1 + tail - time.time()))
        alive = {c.name: c.alive() for c in everything}
    finally:
        killed = _stop(everything)
    arrivals = stack.receiver.snapshot()
    template = JobTemplate.of(
        {"schedule": {"type": "interval", "every_seconds": every}, "target": {"type": "http", "url": b.receiver_url}}
    )
    fig = analyse(dict.fromkeys(ids, template.schedule), arrivals, t0, t1)
    peer = sum(v for k, v in cpu["cores_used"].items() if k.startswith("celery-"))
    fires = fig.fires_per_s
    out = fig.as_dict()
    out.update(_own_figures(arrivals, set(ids), t0, t1))
    out.update(
        name="celery+redbeat",
        versions=_versions(),
        jobs=jobs,
        every_seconds=every,
        pool=pool,
        workers=b.i("celery.workers"),
        concurrency=b.i("celery.concurrency"),
        prefetch_multiplier=b.i("celery.prefetch"),
        beats=len(children["beat"]),
        beat_max_loop_interval_s=1,
        entries_stored_s=installed_s,
        warmup_s=warmup,
        cpu=cpu,
        cpu_us_per_fire=round(peer / fires * 1e6, 1) if fires else None,
        redis_cpu_us_per_fire=round(cpu["cores_used"].get("redis", 0.0) / fires * 1e6, 1) if fires else None,
        alive_at_end=alive,
        killed_after_sigterm=killed,
    )
    b.say(f"  celery: {fires:.0f} fires/s, lag p99 {fig.lag_ms['p99']} ms, {fig.missed} missed, {fig.doubled} doubled")
    return out
