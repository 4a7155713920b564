"""The notification dispatcher beside a noisy namespace (real PostgreSQL, real HTTP receivers, a
real black hole): namespaces take turns, a slow target holds only its own sends, the watchdog never
waits for a send, a storm is summarised within each rule's share of a minute, a rule retargeted or
deleted stops sending to its old target, and what was sent is purged after the retention.

Figures are printed (run with -s)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from cronman.dev.receiver import Receiver
from cronman.model.hashing import SLOTS
from cronman.settings import Settings
from cronman.store.migrate import run_maintenance
from cronman.store.store import make_engine
from scheduler_node.notify import FANOUT_PER_PASS
from scheduler_node.store import PgNodeStore, bitmap
from scheduler_node.watch import Watch, watch_senders
from tests.clients import job, send
from tests.helpers import NeverAnswers, wait_for


class Running:
    """A watch running on its own event loop in a thread, as an API worker runs it."""

    def __init__(self, settings: Settings) -> None:
        self.engine = make_engine(settings.database_url, pool_size=4, max_overflow=4)
        self.executor = ThreadPoolExecutor(max_workers=4)
        self.watch = Watch(settings, self.engine, self.executor, watch_senders(settings, self.executor), holder="t")
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[None] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.task = self.loop.create_task(self.watch.run())
        try:
            self.loop.run_until_complete(self.task)
        except asyncio.CancelledError:
            pass

    def stop(self) -> None:
        wait_for(lambda: self.task is not None, 5, "the watch to start")
        self.loop.call_soon_threadsafe(self.task.cancel)  # type: ignore[union-attr]
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.executor.shutdown()
        self.engine.dispose()


@pytest.fixture
def watch_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"watch_seconds": 0.5, "notification_timeout_seconds": 10})


@pytest.fixture
def running(watch_settings: Settings) -> Iterator[Callable[[], Running]]:
    made: list[Running] = []

    def start() -> Running:
        made.append(Running(watch_settings))
        return made[-1]

    yield start
    for r in made:
        r.stop()


def _events(db: Engine, rows: list[tuple[str, str, str]]) -> None:
    """Events as the nodes' history writers record them (namespace, job id, kind)."""
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_events (namespace, job_id, event, at, detail) "
                "SELECT ns, job, ev, now(), '{\"attempt\": 1}'::jsonb FROM unnest(:ns, :job, :ev) AS v(ns, job, ev)"
            ),
            {"ns": [r[0] for r in rows], "job": [r[1] for r in rows], "ev": [r[2] for r in rows]},
        )


def _jobs(client: FlaskClient, namespace: str, ids: list[str], **extra: Any) -> None:
    for i in range(0, len(ids), 1000):
        docs = [job(j, paused=True, **extra) for j in ids[i : i + 1000]]
        r = send(client, "post", f"/v1/jobs:batch?namespace={namespace}", {"jobs": docs})
        assert r.json["created"] == len(docs), r.json


def _rule(client: FlaskClient, namespace: str, name: str, url: str, **extra: Any) -> None:
    doc = {"events": ["execution.failed", "execution.late"], "target": {"type": "http", "url": url}, **extra}
    assert send(client, "put", f"/v1/notifications/{name}?namespace={namespace}", doc).status_code in (200, 201)


def test_a_noisy_namespace_and_a_black_holed_target_delay_no_one_else(
    client: FlaskClient, db: Engine, database_url: str, running: Callable[[], Running]
) -> None:
    """Namespace noisy: 20 rules to a target that never answers, 200 jobs failing every second
    (10,000 events waiting at the start). Namespace quiet: one rule to a receiver. Namespace late:
    a 1-second job no node fires. Before: each pass took 2,000 events oldest first across all
    namespaces and waited for its 500 sends together, the black hole's 10 s timeout each pass, with
    the watchdog in the same loop: quiet's notification and late's late rows waited behind them."""
    noisy = [f"n{i:03d}" for i in range(200)]
    _jobs(client, "noisy", noisy)
    _jobs(client, "quiet", ["q0", "q1", "q2"])
    late_job = job("l1", schedule={"type": "interval", "every_seconds": 1}, late_after_seconds=5)
    assert send(client, "post", "/v1/jobs?namespace=late", late_job).status_code == 201
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("UPDATE jobs SET updated_at = now() - interval '10 minutes'")
    hole = NeverAnswers()
    with Receiver() as alerts:
        for i in range(20):
            _rule(client, "noisy", f"r{i}", hole.url, min_interval_seconds=0)
        _rule(client, "quiet", "oncall", f"{alerts.url}/alerts")
        _events(db, [("noisy", j, "execution.failed") for _ in range(50) for j in noisy])
        now = int(time.time() * 1000)  # no node has fired for two minutes
        asyncio.run(
            PgNodeStore(db, ThreadPoolExecutor(1)).save_progress(
                "node-x", "node-x-1", now - 120_000, bitmap(range(SLOTS), SLOTS), None
            )
        )
        stop = threading.Event()

        def storm() -> None:  # every noisy job fails every second
            while not stop.wait(1.0):
                _events(db, [("noisy", j, "execution.failed") for j in noisy])

        storming = threading.Thread(target=storm, daemon=True)
        storming.start()
        r = running()
        try:
            wait_for(lambda: hole.most_at_once >= 4, 20, "the black hole to hold sends")
            time.sleep(2)
            lags = []
            for n in range(3):  # one of quiet's jobs fails; its notification arrives
                sent_at = time.time()
                _events(db, [("quiet", f"q{n}", "execution.failed")])
                got = wait_for(lambda n=n: len(alerts.snapshot()) > n and alerts.snapshot()[n], 15, "quiet's alert")
                lags.append(got.at - sent_at)
                time.sleep(1.5)
            with db.connect() as conn:
                newest_late = conn.execute(
                    text(
                        "SELECT max(coalesce(last_scheduled_for, scheduled_for)) FROM scheduled_jobs "
                        "WHERE job_id = 'l1' AND status = 'late'"
                    )
                ).scalar_one()
                outbox = dict(
                    conn.execute(text("SELECT namespace, count(*) FROM notification_outbox GROUP BY 1")).all()
                )
            late_behind = time.time() - newest_late.timestamp()
        finally:
            stop.set()
            storming.join(5)
            hole.close()
    print(
        "\nnoisy neighbour:",
        json.dumps(
            {
                "quiet_alert_lag_s": [round(x, 2) for x in lags],
                "late_rows_behind_now_s": round(late_behind, 1),
                "black_hole_connections_at_most": hole.most_at_once,
                "outbox_rows": outbox,
                "summaries_touched_last_pass": getattr(getattr(r.watch, "summariser", None), "touched", None),
            }
        ),
    )
    assert max(lags) < 3.0, lags
    assert late_behind < 5 + 3.0, late_behind  # late_after_seconds, and a pass or two
    assert hole.most_at_once <= 4  # the black hole holds its target's share, no more
    # a rule sends at most 60 a minute, whatever the jobs: 20 rules, a minute at most
    assert outbox.get("noisy", 0) <= 20 * 60


def test_a_rule_sends_its_share_of_a_minute_and_counts_the_rest(
    client: FlaskClient, db: Engine, watch_settings: Settings
) -> None:
    """A job failing every second with min_interval_seconds 0 and 200 jobs at once: one
    notification per event before; now at most CRONMAN_NOTIFICATION_RULE_PER_MINUTE a minute for
    the rule, and every event counted in one notification or a summary waiting."""
    ids = [f"j{i:03d}" for i in range(200)]
    _jobs(client, "storm", ids)
    with Receiver() as alerts:
        _rule(client, "storm", "all", f"{alerts.url}/a", min_interval_seconds=0)
        _events(db, [("storm", j, "execution.failed") for _ in range(3) for j in ids])
        engine = make_engine(watch_settings.database_url, pool_size=2)
        executor = ThreadPoolExecutor(2)
        s = watch_settings.model_copy(
            update={"notification_rule_per_minute": 30, "notification_target_concurrency": 64}
        )
        watch = Watch(s, engine, executor, watch_senders(s, executor), holder="t")

        async def passes() -> None:
            await watch.senders.start()
            for _ in range(3):
                await watch.pass_once()
                _events(db, [("storm", ids[0], "execution.failed")])
            await watch.pass_once()
            await watch.senders.close()

        asyncio.run(passes())
        got = [json.loads(r.body) for r in alerts.snapshot()]
        with db.connect() as conn:
            waiting = conn.execute(text("SELECT coalesce(sum(pending), 0) FROM notification_state")).scalar_one()
        engine.dispose()
        executor.shutdown()
    assert len(got) == 30
    assert sum(n["count"] for n in got) + waiting == 3 * 200 + 3


def test_a_pass_touches_a_bounded_number_of_summaries(
    client: FlaskClient, db: Engine, watch_settings: Settings
) -> None:
    """100 rules (the quota) matching 2,000 jobs with 20,000 events waiting: before, a pass built
    2,000 events x 100 rules in memory in one transaction; now a pass touches at most
    FANOUT_PER_PASS summaries, a namespace's turn at most 5,000 at a time."""
    ids = [f"m{i:04d}" for i in range(2000)]
    _jobs(client, "many", ids)
    for i in range(100):
        _rule(client, "many", f"r{i:03d}", "https://hooks.example.com/x", min_interval_seconds=60)
    _events(db, [("many", j, "execution.failed") for _ in range(10) for j in ids])
    engine = make_engine(watch_settings.database_url, pool_size=2)
    watch = Watch(watch_settings, engine, ThreadPoolExecutor(1), watch_senders(watch_settings, None), holder="t")  # type: ignore[arg-type]
    tracemalloc.start()
    try:
        queued, more = watch.summariser.pass_once(int(time.time() * 1000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        engine.dispose()
    print(f"\none pass: {watch.summariser.touched} summaries, {queued} queued, peak {peak / 2**20:.1f} MB")
    assert watch.summariser.touched <= FANOUT_PER_PASS and more
    assert peak < 64 * 2**20


def test_retargeting_or_deleting_a_rule_stops_its_queued_sends(
    client: FlaskClient, db: Engine, running: Callable[[], Running]
) -> None:
    _jobs(client, "ns", ["a", "b"])
    with Receiver(fail_first=10**9) as old, Receiver() as new:
        _rule(client, "ns", "r", f"{old.url}/x", min_interval_seconds=0)
        _rule(client, "ns", "gone", f"{old.url}/y", min_interval_seconds=0)
        _events(db, [("ns", "a", "execution.failed"), ("ns", "b", "execution.failed")])
        r = running()
        wait_for(lambda: {x.path for x in old.snapshot()} == {"/x", "/y"}, 15, "the first attempts")
        _rule(client, "ns", "r", f"{new.url}/x", min_interval_seconds=0)  # retargeted
        assert client.delete("/v1/notifications/gone?namespace=ns").status_code == 204
        wait_for(lambda: len(new.snapshot()) == 2, 15, "the retried sends at the new target")
        before = len(old.snapshot())
        time.sleep(3)  # (a failed attempt retries after 1 s, then 2 s)
        r.stop()
    assert len(old.snapshot()) == before  # nothing more to the old target, nor for the deleted rule
    with db.connect() as conn:
        left = conn.execute(text("SELECT rule, sent_at IS NOT NULL FROM notification_outbox ORDER BY rule")).all()
    assert [tuple(x) for x in left] == [("r", True), ("r", True)]


def test_notification_tables_are_purged(db: Engine, client: FlaskClient) -> None:
    _rule(client, "ns", "kept", "https://hooks.example.com/x")
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_outbox (event_id, namespace, rule, job_id, event, body, target, created_at, "
                "sent_at, given_up_at) SELECT gen_random_uuid(), 'ns', 'kept', 'j', 'execution.failed', '{}', '{}', "
                "now() - make_interval(days => d), CASE WHEN s = 'sent' THEN now() END, "
                "CASE WHEN s = 'given_up' THEN now() END "
                "FROM unnest(ARRAY[8, 8, 8, 1, 1], ARRAY['sent', 'given_up', 'waiting', 'sent', 'waiting']) AS v(d, s)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO notification_state (namespace, rule, job_id, event, last_sent_at, pending) VALUES "
                "('ns', 'kept', 'quiet-long', 'execution.failed', now() - interval '2 days', 0), "
                "('ns', 'kept', 'quiet-now', 'execution.failed', now() - interval '1 hour', 0), "
                "('ns', 'kept', 'counting', 'execution.failed', now() - interval '2 days', 3), "
                "('ns', 'deleted', 'x', 'execution.failed', now(), 2)"
            )
        )
    report = run_maintenance(db, datetime.now(UTC).date(), 45, 7, 7)
    assert (report.notifications_purged, report.summaries_purged) == (2, 2)
    with db.connect() as conn:
        kept = conn.execute(text("SELECT job_id FROM notification_state ORDER BY job_id")).scalars().all()
        outbox = conn.execute(text("SELECT count(*) FROM notification_outbox")).scalar_one()
    assert kept == ["counting", "quiet-now"] and outbox == 3
