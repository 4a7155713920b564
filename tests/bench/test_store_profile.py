"""The bench's account of where PostgreSQL and Redis spend their time (``cronman bench --profile``):
a real PostgreSQL with pg_stat_statements preloaded, as the bench starts it, and the suite's Redis."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import redis

from bench.storeprofile import StoreMeter, enable_statements, write_report
from cronman.dev.embedded import EmbeddedPostgres


def test_the_window_s_statements_and_commands_are_counted_per_delivery(
    workdir: Path, tmp_path: Path, redis_server_url: str
) -> None:
    pg = EmbeddedPostgres(
        workdir / "store-profile-pg",
        durable=False,
        log=workdir / "store-profile-pg.log",
        settings={"shared_preload_libraries": "pg_stat_statements"},
    )
    url = pg.url("postgres")
    pg.start()
    try:
        enable_statements(url)
        conn = psycopg2.connect(url)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CREATE TABLE before_the_window (n int)")  # not counted: the meter resets
        meter = StoreMeter(url, redis_server_url).start()
        cur.execute("CREATE TABLE t (n int)")
        for i in range(50):
            cur.execute("INSERT INTO t VALUES (%s)", (i,))
        client = redis.Redis.from_url(redis_server_url)
        for i in range(30):
            client.set(f"store-profile-test:{i}", "x")
        client.close()
        meter.stop()
        conn.close()
        report = meter.report(deliveries=10)
    finally:
        pg.stop()

    statements = {s["statement"]: s for s in report["postgres_statements"]}
    insert = statements["INSERT INTO t VALUES ($1)"]
    assert insert["calls"] == 50 and insert["rows"] == 50
    assert not any("before_the_window" in s for s in statements)
    assert abs(sum(s["share"] for s in report["postgres_statements"]) - 1) < 0.05
    commands = {c["command"]: c for c in report["redis_commands"]}
    assert commands["set"]["calls"] == 30 and commands["set"]["calls_per_delivery"] == 3.0

    write_report(report, tmp_path / "stores.txt")
    text = (tmp_path / "stores.txt").read_text()
    assert "INSERT INTO t VALUES ($1)" in text and "set" in text
