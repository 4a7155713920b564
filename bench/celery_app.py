"""The Celery peer's processes: Celery beat with RedBeat (schedules in Redis, one beat at a time
under RedBeat's lock) feeding Celery workers whose task makes the HTTP call, the way a Python team
deploys "many schedules, replicated, recorded". The bench starts them (:mod:`bench.celery_peer`):

    celery -A bench.celery_app beat -S bench.celery_app:LedgerScheduler
    celery -A bench.celery_app worker -P gevent -c 100

Broker and schedules share one Redis database, given in ``BENCH_CELERY_REDIS_URL``.

Each job is one RedBeat entry with Celery's interval schedule (``schedule(run_every=...)``, the
idiom for "every N seconds"), its first run put on the job's phase (the same instants cronman's
steady set uses). Celery's interval counts from the previous run: after a send, the next is due
``every`` after that send, so each job's instants drift by beat's lateness. RedBeat's ``rrule``
schedule would keep a fixed grid, but dateutil walks it from its start on every look (0.4 ms at
30 s old, 7 ms at ten minutes, for a SECONDLY rule): no operator would run it at this scale.

The one change to the peer: :class:`LedgerScheduler` tells each task the instant beat sent it for
(its previous run plus the interval), as the APScheduler peer's executor passes the run time; the
task maps that instant to the job's grid (:func:`scheduled_for`) and sends it as
``Cronman-Scheduled-For``, so that the ledger judges missed, doubled and lag as it does cronman's.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from celery import Celery
from redbeat import RedBeatScheduler

from cronman.model.timeutil import iso

REDIS_URL = os.environ.get("BENCH_CELERY_REDIS_URL", "redis://127.0.0.1:6379/1")
TASK = "cronman_bench.deliver"
KEY_PREFIX = "redbeat:"
# Requests a worker process may have open at once (its pool's size for gevent).
HTTP_POOL = int(os.environ.get("BENCH_CELERY_HTTP_POOL", "100"))

app = Celery("cronman_bench_peer", broker=REDIS_URL)
app.conf.update(
    redbeat_redis_url=REDIS_URL,
    redbeat_key_prefix=KEY_PREFIX,
    # Beat looks again at least once a second (seconds-level schedules; changes picked up within a
    # second). RedBeat's lock is extended once a tick, and a tick sends everything due: at 15,000
    # jobs a second one outlasted the default lock (5 loop intervals), the standby took over while
    # the leader was still sending, and the leader died on its next extend. 30 s: a standby takes
    # over within 30 s of the leader's death.
    beat_max_loop_interval=1,
    redbeat_lock_timeout=30,
    timezone="UTC",
    enable_utc=True,
    # Fire-and-forget webhook calls: no result backend, no events, acknowledged when received
    # (Celery's default; late acks redeliver on a worker's death, at the price of doubles).
    task_ignore_result=True,
    task_acks_late=False,
    worker_send_task_events=False,
    task_send_sent_event=False,
    # Short tasks: prefetch enough that the workers never wait on the broker's round trip.
    worker_prefetch_multiplier=int(os.environ.get("BENCH_CELERY_PREFETCH", "4")),
    worker_disable_rate_limits=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


def scheduled_for(due_ms: int, phase_ms: int, every_ms: int) -> int:
    """The instant of the job's grid (``phase + k * every``) at or before ``due_ms``: the
    occurrence a send that beat made for ``due_ms`` delivers."""
    return due_ms - (due_ms - phase_ms) % every_ms


_session: requests.Session | None = None


def _http() -> requests.Session:
    global _session
    if _session is None:
        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=HTTP_POOL)
        session.mount("http://", adapter)
        _session = session
    return _session


@app.task(name=TASK, ignore_result=True)
def deliver(job_id: str, url: str, payload: str, phase_ms: int, every_ms: int, due_ms: int = 0) -> int:
    """POST the job's payload with a delivery's headers; the execution id carries beat's due
    instant (the peer has no execution id of its own), so the bench can tell drift from lateness."""
    scheduled = scheduled_for(due_ms, phase_ms, every_ms)
    headers = {
        "Cronman-Job-Id": job_id,
        "Cronman-Execution-Id": f"due-{due_ms}",
        "Cronman-Scheduled-For": iso(scheduled),
        "Cronman-Attempt": "1",
        "Cronman-Event-Index": "0",
        "Content-Type": "application/json",
    }
    response = _http().post(url, data=payload.encode(), headers=headers, timeout=10)
    response.raise_for_status()
    return response.status_code


class LedgerScheduler(RedBeatScheduler):  # type: ignore[misc]
    """RedBeat's scheduler, telling each task the instant it was due (see the module's docstring)."""

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        due = entry.last_run_at + entry.schedule.run_every
        entry.kwargs = {**(entry.kwargs or {}), "due_ms": int(due.timestamp() * 1000)}
        return super().apply_async(entry, producer=producer, advance=advance, **kwargs)


def install_entries(
    redis_url: str, jobs: list[tuple[str, str, int]], url: str, every_ms: int, first_after_ms: int
) -> int:
    """Store in ``redis_url`` one RedBeat entry per (job id, payload, phase ms), what
    ``RedBeatSchedulerEntry.save`` writes (its definition, its meta, its place in the schedule), a
    thousand a round trip. Each job's first run is the first instant of its grid after
    ``first_after_ms``. Returns the earliest first instant (ms)."""
    import json

    from celery.schedules import schedule
    from redbeat.decoder import RedBeatJSONEncoder
    from redbeat.schedulers import RedBeatSchedulerEntry, get_redis

    app.conf.broker_url = app.conf.redbeat_redis_url = redis_url
    for cached in ("redbeat_conf", "redbeat_redis"):  # (RedBeat keeps both on the app once made)
        if hasattr(app, cached):
            delattr(app, cached)
    client = get_redis(app)
    every = schedule(run_every=timedelta(milliseconds=every_ms), app=app)
    earliest = None
    for start in range(0, len(jobs), 1000):
        with client.pipeline(transaction=False) as pipe:
            for job_id, payload, phase in jobs[start : start + 1000]:
                first = scheduled_for(first_after_ms, phase, every_ms) + every_ms
                earliest = first if earliest is None else min(earliest, first)
                entry = RedBeatSchedulerEntry(
                    job_id, TASK, every, args=[job_id, url, payload, phase, every_ms], kwargs={}, app=app
                )
                entry.last_run_at = datetime.fromtimestamp((first - every_ms) / 1000, UTC)
                definition = {
                    "name": entry.name,
                    "task": entry.task,
                    "args": entry.args,
                    "kwargs": entry.kwargs,
                    "options": entry.options,
                    "schedule": entry.schedule,
                    "enabled": entry.enabled,
                }
                meta = {"last_run_at": entry.last_run_at}
                pipe.hset(entry.key, "definition", json.dumps(definition, cls=RedBeatJSONEncoder))
                pipe.hset(entry.key, "meta", json.dumps(meta, cls=RedBeatJSONEncoder))
                pipe.zadd(app.redbeat_conf.schedule_key, {entry.key: first / 1000})
            pipe.execute()
    return int(earliest or first_after_ms)
