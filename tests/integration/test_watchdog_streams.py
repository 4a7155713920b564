"""The watchdog holds a batch of jobs and of late rows at a time, however many jobs are stalled.

Found with ``cronman bench --scenarios scale10m --param scale10m.jobs=1000000``: while three nodes
load a million jobs nothing fires, every slot's mark falls behind, and the node that leads the
watch read every job of the deployment into one list each pass (and every late row into another
before writing any): the first node started had 240-340 MB more resident memory than the others,
and a cluster-wide stall at ten million jobs would have asked one process for gigabytes.

Here 40,000 daily jobs were last changed, and last fired, half an hour ago, with real PostgreSQL:
a pass reads them all and records the few hundred occurrences due in that half hour. Before, the
pass's traced memory peaked at 25.8 MB and it kept an entry for each of the 40,000 jobs; now
2.5 MB, and entries for the jobs that had late occurrences.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg2
import pytest

from bench.loader import JobTemplate, copy_jobs
from cronman.model.hashing import SLOTS
from cronman.settings import Settings
from cronman.store.store import make_engine
from scheduler_node.store import PgNodeStore, bitmap
from scheduler_node.watch import Watch, watch_senders

JOBS = 40_000
EVERY_S = 86_400
AGO_MS = 30 * 60_000

Marked = Callable[[int], tuple[Watch, int]]


@pytest.fixture
def marked(settings: Settings, database_url: str) -> Iterator[Marked]:
    """``marked(lag_ms)``: every slot last fired ``lag_ms`` ago (by one node's saved progress);
    returns a watch on the database and the ``now`` of that mark."""
    engine = make_engine(database_url, pool_size=2, max_overflow=2)
    executor = ThreadPoolExecutor(max_workers=2)

    def mark(lag_ms: int) -> tuple[Watch, int]:
        now = int(time.time() * 1000)
        store = PgNodeStore(engine, executor)
        asyncio.run(store.save_progress("node-x", "node-x-1", now - lag_ms, bitmap(range(SLOTS), SLOTS), None))
        return Watch(settings, engine, executor, watch_senders(settings, executor), holder="test"), now

    try:
        yield mark
    finally:
        engine.dispose()
        executor.shutdown()


def test_a_stall_of_every_slot_is_watched_a_batch_at_a_time(database_url: str, marked: Marked) -> None:
    template = JobTemplate.of(
        {"schedule": {"type": "interval", "every_seconds": EVERY_S}, "target": {"type": "http", "url": "http://x"}}
    )
    ids = [f"watched-{i:06d}" for i in range(JOBS)]
    copy_jobs(database_url, ((i, template) for i in ids), JOBS)
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("UPDATE jobs SET updated_at = now() - interval '30 minutes'")
        # a value the API would refuse, stored anyway, counts as the default (it stops no pass)
        cur.execute(
            "UPDATE jobs SET options = coalesce(options, '{}') || '{\"late_after_seconds\": \"soon\"}' "
            "WHERE id IN ('watched-000001', 'watched-000002')"
        )
    watch, now = marked(AGO_MS)
    tracemalloc.start()
    try:
        fresh = asyncio.run(watch.record_late(now))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    again = asyncio.run(watch.record_late(now + 1000))

    # every occurrence due between the mark and a minute (late_after_seconds) before the first pass
    expected = 0
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM scheduled_jobs WHERE status = 'late' AND node = 'watchdog'")
        recorded = int(cur.fetchone()[0])  # type: ignore[index]
    for job_id in ids:
        timing = watch.decoder.timing(f'{{"type": "interval", "every_seconds": {EVERY_S}}}', job_id, "default")
        t = timing.next_after(now - AGO_MS)
        while t is not None and t <= now - 60_000:
            expected += 1
            t = timing.next_after(t)
    assert fresh + again == recorded == expected + again and recorded > JOBS / 100
    assert again < JOBS / 1000  # a second later: the occurrences of that second
    # a batch of jobs and of rows at a time (every job at once: 25.8 MB)
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MB"
    # where the next pass goes on from, for the jobs that had late occurrences only
    assert 0 < watch.watching <= recorded


def test_jobs_that_cannot_be_late_yet_are_not_read(database_url: str, marked: Marked) -> None:
    """Marks 30 s behind (nodes starting, say): only jobs whose late_after_seconds is shorter can
    have a late occurrence, and only they are read; the others (60 s, the default, or a stored
    value the API would refuse, which counts as the default) are left in the database."""
    template = JobTemplate.of(
        {"schedule": {"type": "interval", "every_seconds": 2}, "target": {"type": "http", "url": "http://x"}}
    )
    ids = [f"starting-{i:05d}" for i in range(5_000)]
    eager = ids[:10]
    copy_jobs(database_url, ((i, template) for i in ids), len(ids))
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("UPDATE jobs SET updated_at = now() - interval '10 minutes'")
        cur.execute(
            "UPDATE jobs SET options = coalesce(options, '{}') || '{\"late_after_seconds\": 5}' WHERE id = ANY(%s)",
            (eager,),
        )
        cur.execute(
            "UPDATE jobs SET options = coalesce(options, '{}') || '{\"late_after_seconds\": \"+5\"}' "
            "WHERE id = 'starting-00010'"
        )
    watch, now = marked(30_000)
    fresh = asyncio.run(watch.record_late(now))

    expected = 0
    for job_id in eager:
        timing = watch.decoder.timing('{"type": "interval", "every_seconds": 2}', job_id, "default")
        t = timing.next_after(now - 30_000)
        while t is not None and t <= now - 5_000:
            expected += 1
            t = timing.next_after(t)
    assert watch.jobs_read == len(eager)
    # one row a job for its stall, standing for its late occurrences (one row each, before)
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT job_id, occurrences FROM scheduled_jobs WHERE status = 'late' ORDER BY job_id")
        late = cur.fetchall()
    assert fresh == len(late) == len(eager) and [j for j, _ in late] == eager
    assert sum(n for _, n in late) == expected and expected >= 10 * 12
