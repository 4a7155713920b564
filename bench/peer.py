"""The peer: APScheduler 3 firing the same job set as cronman's steady scenario (the same ids, the
same interval, the same phases) at the same ledger receiver, in its best configuration:
AsyncIOScheduler on uvloop when it is installed, one aiohttp session with keep-alive (100
connections), coalescing off, a generous misfire grace time and room for overlapping instances,
and its loggers at WARNING. It runs in its own process for a fixed time and then stops:

    python -m bench.peer --url http://127.0.0.1:PORT/hook --jobs 5000 --seconds 45

Every request carries the same metadata as a cronman delivery, including the occurrence's
scheduled time. APScheduler does not hand a job its scheduled time, so the executor below is
AsyncIOExecutor with one change: it passes each run time to the job function (otherwise it does
what ``run_coroutine_job`` does: the misfire check, the events and the logging calls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from bench import new_loop
from cronman import __version__
from cronman.model.execution import execution_id
from cronman.model.schedule import phase_for
from cronman.model.timeutil import iso, to_ms


def _executor_class() -> Any:
    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, JobExecutionEvent
    from apscheduler.executors.asyncio import AsyncIOExecutor

    class LedgerExecutor(AsyncIOExecutor):  # type: ignore[misc]
        """AsyncIOExecutor that hands each run time to the job function as ``scheduled_for``."""

        def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
            logger = self._logger

            async def run() -> list[Any]:
                events = []
                for run_time in run_times:
                    if job.misfire_grace_time is not None:
                        difference = datetime.now(UTC) - run_time
                        if difference > timedelta(seconds=job.misfire_grace_time):
                            events.append(JobExecutionEvent(EVENT_JOB_MISSED, job.id, job._jobstore_alias, run_time))
                            logger.warning('Run time of job "%s" was missed by %s', job, difference)
                            continue
                    logger.info('Running job "%s" (scheduled at %s)', job, run_time)
                    try:
                        retval = await job.func(*job.args, scheduled_for=run_time, **job.kwargs)
                    except Exception as exc:  # noqa: BLE001 - what APScheduler does
                        events.append(
                            JobExecutionEvent(
                                EVENT_JOB_ERROR,
                                job.id,
                                job._jobstore_alias,
                                run_time,
                                exception=exc,
                                traceback="".join(traceback.format_tb(exc.__traceback__)),
                            )
                        )
                        logger.exception('Job "%s" raised an exception', job)
                    else:
                        events.append(
                            JobExecutionEvent(EVENT_JOB_EXECUTED, job.id, job._jobstore_alias, run_time, retval=retval)
                        )
                        logger.info('Job "%s" executed successfully', job)
                return events

            def callback(f: asyncio.Future[list[Any]]) -> None:
                self._pending_futures.discard(f)
                try:
                    events = f.result()
                except BaseException:  # noqa: BLE001
                    self._run_job_error(job.id, *sys.exc_info()[1:])
                else:
                    self._run_job_success(job.id, events)

            f = self._eventloop.create_task(run())
            f.add_done_callback(callback)
            self._pending_futures.add(f)

    return LedgerExecutor


class Counters:
    sent = 0
    errors = 0


async def run_peer(
    url: str, jobs: int, prefix: str, every: int, seconds: float, concurrency: int, loop_kind: str
) -> dict[str, Any]:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, keepalive_timeout=30)
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
        headers={"User-Agent": f"cronman-bench-peer/{__version__}"},
    )
    timeout = aiohttp.ClientTimeout(total=10)
    counters = Counters()

    async def fire(job_id: str, body: bytes, scheduled_for: datetime | None = None) -> None:
        ms = to_ms(scheduled_for or datetime.now(UTC))
        headers = {
            "Cronman-Job-Id": job_id,
            "Cronman-Execution-Id": execution_id(job_id, ms),
            "Cronman-Scheduled-For": iso(ms),
            "Cronman-Attempt": "1",
            "Cronman-Event-Index": "0",
            "Content-Type": "application/json",
        }
        try:
            async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
                await resp.read()
                if resp.status == 200:
                    counters.sent += 1
                else:
                    counters.errors += 1
        except (aiohttp.ClientError, TimeoutError, OSError):
            counters.errors += 1

    scheduler = AsyncIOScheduler(
        event_loop=asyncio.get_running_loop(),
        executors={"default": _executor_class()()},
        job_defaults={"coalesce": False, "misfire_grace_time": 3600, "max_instances": 1000},
        timezone=UTC,
    )
    every_ms = every * 1000
    t_add = time.monotonic()
    for i in range(jobs):
        job_id = f"{prefix}{i:06d}"
        # cronman's phase for an interval job without start_at: the same instants on both sides
        start = datetime.fromtimestamp(phase_for(job_id, every_ms) / 1000, UTC)
        scheduler.add_job(
            fire,
            IntervalTrigger(seconds=every, start_date=start, timezone=UTC),
            args=[job_id, json.dumps({"bench": job_id}, separators=(",", ":")).encode()],
            id=job_id,
        )
    scheduler.start()
    started = time.time()
    add_seconds = time.monotonic() - t_add
    # the first line tells the bench when the schedule started; the last one what was sent
    print(json.dumps({"started_at": started, "add_seconds": round(add_seconds, 3), "loop": loop_kind}), flush=True)
    try:
        await asyncio.sleep(seconds)
    finally:
        scheduler.shutdown(wait=False)
        await session.close()
    return {
        "started_at": started,
        "add_seconds": round(add_seconds, 3),
        "sent": counters.sent,
        "errors": counters.errors,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peer")
    p.add_argument("--url", required=True)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--prefix", default="steady-")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    loop, loop_kind = new_loop(args.loop)
    try:
        result = loop.run_until_complete(
            run_peer(args.url, args.jobs, args.prefix, args.every, args.seconds, args.concurrency, loop_kind)
        )
    finally:
        loop.close()
    result["loop"] = loop_kind
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
