"""The schema: migrations match the models, day partitions are created ahead and dropped past
retention, and a history row for a day with no partition is still recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import text

from cronman.migrate import check
from cronman.partitions import existing_partitions, partition_name
from cronman.timeutil import parse_iso
from scheduler_node.history import HistoryRow, HistoryWriter
from tests.integration.conftest import count


def test_models_and_migrations_agree(database_url: str) -> None:
    check(database_url)  # raises when a model changed without a migration


def test_partitions_exist_for_today_and_the_coming_days(db) -> None:  # type: ignore[no-untyped-def]
    today = datetime.now(UTC).date()
    with db.connect() as conn:
        days = existing_partitions(conn)
    for d in range(0, 8):
        assert today + timedelta(days=d) in days, partition_name(today + timedelta(days=d))


def test_maintain_drops_expired_partitions(settings_env: dict[str, str], db) -> None:  # type: ignore[no-untyped-def]
    later = datetime.now(UTC).date() + timedelta(days=60)
    out = subprocess.run(
        [sys.executable, "-m", "cronman", "maintain", "--today", later.isoformat()],
        env=settings_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(out.stdout)
    today = datetime.now(UTC).date()
    assert partition_name(today) in report["partitions_dropped"]
    assert partition_name(later + timedelta(days=7)) in report["partitions_created"]
    with db.connect() as conn:
        days = existing_partitions(conn)
    assert min(days) >= later - timedelta(days=45)
    # the parent table was never bulk-deleted: dropping is per partition
    assert not any(d < later - timedelta(days=45) for d in days)


def _row(day: str, attempt: int = 1, node: str = "n1", fired: int | None = None) -> HistoryRow:
    ms = parse_iso(day)
    return HistoryRow(
        "job-x",
        ms,
        0,
        attempt,
        "5f0c6f1e-9a43-4c53-9a39-6f1f3c2d7a10",
        "schedule",
        "succeeded",
        node,
        fired or ms + 3,
        ms + 5,
        3,
        200,
        None,
    )


async def _write(db, rows: list[HistoryRow]) -> HistoryWriter:  # type: ignore[no-untyped-def]
    writer = HistoryWriter(db, ThreadPoolExecutor(1), flush_seconds=0.05, max_rows=1000)
    for r in rows:
        writer.add(r)
    assert await writer.flush()
    return writer


def test_a_day_with_no_partition_is_still_recorded(db) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    asyncio.run(_write(db, [_row("2031-05-17T10:00:00Z")]))
    assert count(db, "SELECT count(*) FROM scheduled_jobs_20310517") == 1
    with db.connect() as conn:
        assert date(2031, 5, 17) in existing_partitions(conn)


def test_the_database_key_counts_a_second_delivery(db) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    asyncio.run(_write(db, [_row(when, node="n1")]))
    asyncio.run(_write(db, [_row(when, node="n1")]))  # the same row again (a retried write): not a duplicate
    asyncio.run(_write(db, [_row(when, node="n2", fired=parse_iso(when) + 50)]))  # another node delivered it too
    with db.connect() as conn:
        rows = conn.execute(text("SELECT node, duplicates FROM scheduled_jobs WHERE job_id = 'job-x'")).all()
    assert [tuple(r) for r in rows] == [("n1", 1)]
