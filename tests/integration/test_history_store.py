"""The schema: migrations match the models, day partitions are created ahead and dropped past
retention, and a history row for a day with no partition is still recorded. No row, whatever it
holds, stops the others."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import text

from cronman.model.timeutil import parse_iso
from cronman.store.migrate import check, run_maintenance
from cronman.store.partitions import existing_partitions, partition_name
from scheduler_node.history import HistoryRow, HistoryWriter
from scheduler_node.store import Attempts, PgNodeStore
from tests.integration.conftest import count


def test_models_and_migrations_agree(database_url: str) -> None:
    check(database_url)  # raises when a model changed without a migration


def test_partitions_exist_for_today_and_the_coming_days(db) -> None:  # type: ignore[no-untyped-def]
    today = datetime.now(UTC).date()
    # what nodes do every hour (the suite's template ran it when the suite started, maybe yesterday)
    run_maintenance(db, today, 45, 7)
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


async def _write(db, rows: list[HistoryRow], **kw: Any) -> HistoryWriter:  # type: ignore[no-untyped-def]
    executor = ThreadPoolExecutor(1)
    writer = HistoryWriter(PgNodeStore(db, executor).write_history, executor, flush_seconds=0.05, max_rows=1000, **kw)
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


def test_a_success_of_the_same_attempt_is_what_the_row_keeps(db) -> None:  # type: ignore[no-untyped-def]
    """A node paused past its lease delivers attempt 1 after all, while the node that took the
    execution over failed its own attempt 1: history must say the execution succeeded."""
    import asyncio

    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    failed = _row(when, node="n2", fired=parse_iso(when) + 40)._replace(
        status="failed", http_status=None, error="timed out"
    )
    asyncio.run(_write(db, [failed]))
    asyncio.run(_write(db, [_row(when, node="n1")]))  # the paused node's answer came back 200
    # the failure written again (a survivor recovering n2's rows) does not undo the success; it
    # counts once more as another delivery, since the row no longer holds n2's
    asyncio.run(_write(db, [failed]))
    with db.connect() as conn:
        rows = conn.execute(
            text("SELECT status, node, http_status, error, duplicates FROM scheduled_jobs WHERE job_id = 'job-x'")
        ).all()
    assert [tuple(r) for r in rows] == [("succeeded", "n1", 200, None, 2)]


def test_an_end_of_the_same_attempt_replaces_a_failure_to_be_retried(db) -> None:  # type: ignore[no-untyped-def]
    """The job deleted while a node was paused past its lease: the node that took the execution
    over cancelled it, and the paused node's failure of the same attempt (to be retried, a retry it
    then lost) was written first. History must say the execution ended; a failure written after
    the end does not undo it, and a skip does not replace a failure (an execution ended only by a
    skip is told apart by takeovers, below)."""
    import asyncio

    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    failed = _row(when, attempt=2, node="n1", fired=parse_iso(when) + 40)._replace(
        status="failed", http_status=500, error="HTTP 500"
    )
    cancelled = _row(when, attempt=2, node="n2")._replace(
        status="cancelled", fired_ms=None, http_status=None, error="the job was deleted"
    )

    def status() -> list[tuple[Any, ...]]:
        with db.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    text("SELECT status, node, error FROM scheduled_jobs WHERE job_id = 'job-x' AND attempt = 2")
                ).all()
            ]

    asyncio.run(_write(db, [failed]))
    asyncio.run(_write(db, [cancelled]))
    assert status() == [("cancelled", "n2", "the job was deleted")]
    asyncio.run(_write(db, [failed]))  # written again (a survivor recovering n1's rows)
    assert status() == [("cancelled", "n2", "the job was deleted")]

    with db.connect() as conn, conn.begin():
        conn.execute(text("DELETE FROM scheduled_jobs WHERE job_id = 'job-x'"))
    asyncio.run(_write(db, [failed]))
    asyncio.run(_write(db, [failed._replace(node="n2", status="permanently_failed", error="HTTP 503")]))
    assert status() == [("permanently_failed", "n2", "HTTP 503")]

    with db.connect() as conn, conn.begin():
        conn.execute(text("DELETE FROM scheduled_jobs WHERE job_id = 'job-x'"))
    asyncio.run(_write(db, [failed]))
    asyncio.run(_write(db, [cancelled._replace(status="skipped", error="overlap")]))
    assert status() == [("failed", "n1", "HTTP 500")]

    # both in one batch (a survivor writing a dead node's failure with its own end): the same
    with db.connect() as conn, conn.begin():
        conn.execute(text("DELETE FROM scheduled_jobs WHERE job_id = 'job-x'"))
    asyncio.run(_write(db, [failed, cancelled]))
    assert status() == [("cancelled", "n2", "the job was deleted")]


def test_history_tells_an_execution_ended_by_a_skip_from_one_that_ran(db) -> None:  # type: ignore[no-untyped-def]
    """A takeover asks history whether an execution ended: one ended only by a misfire plan's skip
    (counting as missed what a node had claimed just before the cluster stopped) is told apart, so a
    retry the claim store holds goes on; a skip the claim's holder decided is an end."""
    import asyncio

    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    skipped = _row(when)._replace(status="skipped", fired_ms=None, http_status=None, error="misfire: ...")
    asyncio.run(_write(db, [skipped]))
    store = PgNodeStore(db, ThreadPoolExecutor(1))
    ident = ("job-x", parse_iso(when), 0, "schedule")
    assert asyncio.run(store.attempts([ident]))[ident] == Attempts(1, True, True)
    asyncio.run(_write(db, [_row(when, attempt=2)]))
    assert asyncio.run(store.attempts([ident]))[ident] == Attempts(2, True, False)

    # A skip the claim's holder decided (an overlap, a calendar) ends it like a success: a node that
    # takes the claim over after Redis lost its data does not deliver it (seed 8204482).
    overlap = _row(when)._replace(
        event_index=1,
        execution_id=str(uuid.uuid4()),
        status="skipped",
        fired_ms=None,
        http_status=None,
        error="overlap: the previous execution of this job was still in flight",
    )
    asyncio.run(_write(db, [overlap]))
    ident = ("job-x", parse_iso(when), 1, "schedule")
    assert asyncio.run(store.attempts([ident]))[ident] == Attempts(1, True, False)


def test_rows_not_written_yet_say_what_history_will_say(db) -> None:  # type: ignore[no-untyped-def]
    """A takeover's check of history also reads the node's own rows not written yet (PostgreSQL
    away, or the batch on its way): folded as the database folds them once written, for every
    sequence of outcomes of two attempts."""
    import asyncio
    import itertools

    from scheduler_node.verify import fold

    statuses = ["failed", "succeeded", "permanently_failed", "skipped", "cancelled"]
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = parse_iso(when)
    job = f"fold-{uuid.uuid4().hex[:8]}"
    cases: list[list[HistoryRow]] = []
    for n, (a, b) in enumerate(itertools.product(statuses, [None, *statuses])):
        for same_attempt in (False, True):
            ms = base + 1000 * (2 * n + same_attempt)
            row = _row(when)._replace(job_id=job, scheduled_ms=ms, execution_id=str(uuid.uuid4()), status=a)
            rows = [row] if b is None else [row, row._replace(attempt=1 if same_attempt else 2, status=b)]
            cases.append(rows)
    folded: dict[tuple[str, int, int, str], Attempts] = {}
    fold(folded, [r for rows in cases for r in rows])
    asyncio.run(_write(db, [r for rows in cases for r in rows]))
    store = PgNodeStore(db, ThreadPoolExecutor(1))
    idents = [(job, rows[0].scheduled_ms, 0, "schedule") for rows in cases]
    assert asyncio.run(store.attempts(idents)) == {i: folded[i] for i in idents}


def test_a_row_postgresql_cannot_store_as_given_is_cleaned_not_lost(db) -> None:  # type: ignore[no-untyped-def]
    """A receiver's error text with NUL bytes and lone surrogates, a lag past int4 (a redelivery of
    an execution weeks old): each row is stored, and the rows beside it too."""
    import asyncio

    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = _row(when)
    bad_text = base._replace(attempt=2, status="failed", error="HTTP 500: \x00\x00oops\ud800 " + "x" * 5000)
    huge_lag = base._replace(attempt=3, lag_ms=40 * 86_400_000, throttle_wait_ms=3 * 2**31)
    asyncio.run(_write(db, [base, bad_text, huge_lag]))
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT attempt, error, lag_ms, throttle_wait_ms FROM scheduled_jobs WHERE job_id = 'job-x' ORDER BY 2"
            )
        ).all()
    by_attempt = {r[0]: r for r in rows}
    assert set(by_attempt) == {1, 2, 3}
    assert "\x00" not in by_attempt[2][1] and by_attempt[2][1].startswith("HTTP 500: \\0\\0oops")
    assert len(by_attempt[2][1]) <= 1000
    assert by_attempt[3][2] == 40 * 86_400_000 and by_attempt[3][3] == 3 * 2**31


def test_a_row_the_database_refuses_is_set_aside_and_the_others_are_written(db, caplog) -> None:  # type: ignore[no-untyped-def]
    """One poison row in a batch (here an execution id that is no UUID) neither blocks the rows
    before and after it nor the batches that follow; it is logged once and kept aside."""
    import asyncio

    when = parse_iso(datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    good = [_row_at(when + i, attempt=1) for i in range(10)]
    poison = _row_at(when + 5, attempt=2)._replace(execution_id="not-a-uuid")
    refused: list[int] = []

    async def run() -> HistoryWriter:
        writer = await _write(db, [*good[:5], poison, *good[5:]], on_poison=refused.append)
        writer.add(_row_at(when + 100, attempt=1))  # a later batch still goes through
        assert await writer.flush()
        return writer

    writer = asyncio.run(run())
    assert count(db, "SELECT count(*) FROM scheduled_jobs WHERE job_id = 'job-x'") == 11
    assert refused == [1] and writer.quarantined == 1
    assert sum("refused by the database" in r.getMessage() for r in caplog.records) == 1


def test_an_overflowing_buffer_logs_what_it_drops(caplog) -> None:  # type: ignore[no-untyped-def]
    dropped: list[int] = []
    writer = HistoryWriter(lambda rows: 0, None, flush_seconds=1, max_rows=1000, on_dropped=dropped.append)
    for i in range(1001):
        writer.add(_row_at(1_700_000_000_000 + i))
    assert len(writer) == 1000 and dropped == [1]
    [record] = [r for r in caplog.records if "history buffer full" in r.getMessage()]
    assert record.job_id == "job-x" and record.execution_id  # type: ignore[attr-defined]


def _row_at(ms: int, attempt: int = 1) -> HistoryRow:
    eid = str(uuid.uuid4())
    return HistoryRow("job-x", ms, 0, attempt, eid, "schedule", "succeeded", "n1", ms, ms + 1, 1, 200, None)


def test_health_rows_keep_room_for_their_next_version(db) -> None:  # type: ignore[no-untyped-def]
    """Every delivery updates its job's health row: its pages keep room for HOT updates."""
    with db.connect() as conn:
        options = conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'job_health'")).scalar()
    assert options is not None and "fillfactor=70" in options, options


def test_a_summary_row_keeps_the_most_it_has_counted(db) -> None:  # type: ignore[no-untyped-def]
    """A row standing for several occurrences (a skipped span, a stall found late) is written again
    as its count grows; written again with less (a pass of a new leader that counts from the
    start again, a row recovered from Redis), it keeps the most it has counted, and one row."""
    import asyncio

    first = parse_iso("2026-12-19T08:00:01Z")
    late = _row("2026-12-19T08:00:01Z", attempt=0, node="watchdog")._replace(
        status="late", fired_ms=None, finished_ms=None, lag_ms=None, http_status=None, error="late: ..."
    )
    for n in (25, 600, 40):
        asyncio.run(_write(db, [late._replace(occurrences=n, last_ms=first + (n - 1) * 1000)]))
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT occurrences, floor(extract(epoch from last_scheduled_for) * 1000)::bigint, duplicates "
                "FROM scheduled_jobs WHERE job_id = 'job-x'"
            )
        ).all()
    assert [tuple(r) for r in rows] == [(600, first + 599_000, 0)]


def test_rows_written_by_copy_are_stored_as_inserted_rows_are(db) -> None:  # type: ignore[no-untyped-def]
    """A batch of new rows goes in by COPY; a batch with a row already there goes in by INSERT.
    The same values, through either, are stored alike: COPY's escaping of text (tabs, newlines,
    backslashes, a literal ``\\N``, characters beyond ASCII), its NULLs, numbers at their columns'
    bounds and times to the millisecond (the INSERT computes them in PostgreSQL from the
    milliseconds, an oracle for the text COPY is sent)."""
    from scheduler_node.store.history import History

    now = parse_iso(datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    texts = ["a\tb", "line\nnext\r\n", "back\\slash \\t \\\\", "\\N", "", "é — 日本 \u2028 🙂", "x" * 900, "NULL"]
    values = []
    for i, t in enumerate(texts):
        values.append(
            HistoryRow(
                f"{i:02d}",
                now + i * 7 + 1,
                i % 3,
                1 + i,
                str(uuid.uuid4()),
                "schedule" if i % 2 else "manual",
                "failed" if i % 2 else "succeeded",
                f"node\\{t[:20]}",
                now + 999 + i,
                None if i == 3 else 86_399_999_999,
                -5 if i == 2 else 2**62,
                None if i % 3 == 0 else 599,
                t or None,
                None if i % 2 else 2**40,
                [None, True, False][i % 3],
                None if i == 4 else 2**53 + i,
                None if i == 1 else f"ns\t{i}",
                t,
                None if i % 2 else 2**31 - 1,
                None if i % 2 else now + 10**9,
            )  # fmt: skip
        )
    history = History(db)
    copied: list[bool] = []
    copy = history._copy
    history._copy = lambda raw, rows: copied.append(copy(raw, rows)) or copied[-1]  # type: ignore[method-assign]
    history.write([r._replace(job_id=f"copy-{r.job_id}") for r in values])
    first = values[0]._replace(job_id="copy-00")  # already there: the batch goes by INSERT
    history.write([first, *(r._replace(job_id=f"insert-{r.job_id}") for r in values)])
    assert copied == [True, False]
    columns = (
        "event_index, attempt, execution_id::text, trigger, status, node, fired_at, finished_at, lag_ms, http_status, "
        "error, throttle_wait_ms, dead_lettered, incarnation, namespace, response, occurrences, last_scheduled_for, "
        "floor(extract(epoch from scheduled_for) * 1000)::bigint"
    )
    with db.connect() as conn:
        stored = {
            r[0]: tuple(r[1:])
            for r in conn.execute(
                text(
                    f"SELECT job_id, {columns} FROM scheduled_jobs WHERE job_id LIKE 'copy-%' OR job_id LIKE 'insert-%'"
                )
            )
        }
    assert len(stored) == 2 * len(values)
    for r in values:
        assert stored[f"copy-{r.job_id}"] == stored[f"insert-{r.job_id}"], r.job_id
        assert stored[f"copy-{r.job_id}"][-1] == r.scheduled_ms
        assert stored[f"copy-{r.job_id}"][10] == r.error and stored[f"copy-{r.job_id}"][15] == r.response


def test_a_success_after_failures_tells_of_the_recovery_once_with_the_count_before_it(db) -> None:  # type: ignore[no-untyped-def]
    """The count of failures in a row before a batch is read in the statement that updates it (the
    upsert's own snapshot): a success after three permanent failures is one ``job.recovered`` that
    says three; successes after it, none; a success of a new incarnation (the job recreated), none."""
    from scheduler_node.store.history import History

    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_rules (namespace, name, events, target, min_interval_seconds) "
                "VALUES ('default', 'r', ARRAY['job.recovered'], '{}'::jsonb, 0)"
            )
        )
    now = parse_iso(datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    history = History(db)

    def row(i: int, status: str, incarnation: int = 1, job: str = "rec") -> HistoryRow:
        return _row_at(now + i * 1000)._replace(job_id=job, status=status, incarnation=incarnation, namespace="default")

    history.write([row(i, "permanently_failed") for i in range(3)])
    history.write([row(3, "succeeded")])
    history.write([row(4, "succeeded"), row(5, "succeeded")])
    history.write([row(6, "permanently_failed", job="other")])
    history.write([row(7, "succeeded", incarnation=2, job="other")])
    with db.connect() as conn:
        events = conn.execute(
            text(
                "SELECT job_id, detail ->> 'consecutive_failures' FROM notification_events "
                "WHERE event = 'job.recovered'"
            )
        ).all()
        health = conn.execute(text("SELECT consecutive_failures FROM job_health WHERE job_id = 'rec'")).scalar()
    assert [tuple(e) for e in events] == [("rec", "3")]
    assert health == 0
