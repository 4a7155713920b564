"""Day partitions of the execution history: created ahead, dropped (never bulk-deleted) past retention."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Connection, Engine, text

from cronman.store.db import PARTITION_PREFIX

_NAME_RE = re.compile(rf"^{PARTITION_PREFIX}(\d{{8}})$")
_LOCK_KEY = 0x63726F6E  # advisory lock serialising partition DDL across processes


def partition_name(day: date) -> str:
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def day_of_ms(ms: int) -> date:
    return datetime.fromtimestamp(ms // 1000, UTC).date()


def existing_partitions(conn: Connection) -> dict[date, str]:
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'scheduled_jobs'"
        )
    ).scalars()
    out: dict[date, str] = {}
    for name in rows:
        m = _NAME_RE.match(name)
        if m:
            out[datetime.strptime(m.group(1), "%Y%m%d").date()] = name
    return out


def ensure_partitions(conn: Connection, days: Iterable[date]) -> list[str]:
    """Create the partitions for ``days`` that do not exist yet; return the names created."""
    wanted = sorted(set(days))
    if not wanted:
        return []
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    have = existing_partitions(conn)
    created: list[str] = []
    for day in wanted:
        if day in have:
            continue
        lo = datetime.combine(day, time(0), UTC)
        hi = lo + timedelta(days=1)
        name = partition_name(day)
        conn.execute(
            text(
                f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF scheduled_jobs '
                f"FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')"
            )
        )
        created.append(name)
    return created


def drop_expired(conn: Connection, today: date, retention_days: int) -> list[str]:
    """Drop whole partitions whose day is older than the retention."""
    cutoff = today - timedelta(days=retention_days)
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    dropped: list[str] = []
    for day, name in sorted(existing_partitions(conn).items()):
        if day < cutoff:
            conn.execute(text(f'DROP TABLE IF EXISTS "{name}"'))
            dropped.append(name)
    return dropped


@dataclass
class MaintenanceReport:
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    tombstones_purged: int = 0
    triggers_purged: int = 0
    events_purged: int = 0
    commands_purged: int = 0
    backfills_purged: int = 0
    notifications_purged: int = 0
    summaries_purged: int = 0
    async_runs_purged: int = 0
    upstreams_purged: int = 0
    deadline_misses_purged: int = 0
    dependencies_purged: int = 0
    waits_purged: int = 0
    last_successes_purged: int = 0
    secrets_purged: int = 0


def maintain(
    conn: Connection, today: date, retention_days: int, ahead_days: int, notification_days: int = 7
) -> MaintenanceReport:
    """Create partitions from yesterday to ``ahead_days`` ahead, drop expired ones, purge old
    tombstones and triggers, job events, queued commands, finished backfills, asynchronous work's
    rows, executions' upstreams and deadline misses older than the retention, and notifications
    sent or abandoned more than ``notification_days`` ago."""
    report = MaintenanceReport()
    report.created = ensure_partitions(conn, (today + timedelta(days=d) for d in range(-1, ahead_days + 1)))
    report.dropped = drop_expired(conn, today, retention_days)
    # Nodes learn of a delete within seconds; a day-old tombstone has done its work.
    report.tombstones_purged = conn.execute(
        text("DELETE FROM jobs WHERE deleted_at < now() - interval '1 day'")
    ).rowcount
    report.triggers_purged = conn.execute(
        text("DELETE FROM job_triggers WHERE requested_at < now() - interval '1 day'")
    ).rowcount
    # Who-did-what and queued-command records are kept as long as the execution history.
    cutoff = {"days": retention_days}
    report.events_purged = conn.execute(
        text("DELETE FROM job_events WHERE at < now() - make_interval(days => :days)"), cutoff
    ).rowcount
    report.commands_purged = conn.execute(
        text("DELETE FROM commands WHERE received_at < now() - make_interval(days => :days)"), cutoff
    ).rowcount
    # A finished backfill's history is gone with its partitions by then.
    report.backfills_purged = conn.execute(
        text("DELETE FROM backfills WHERE state <> 'running' AND updated_at < now() - make_interval(days => :days)"),
        cutoff,
    ).rowcount
    report.notifications_purged, report.summaries_purged = purge_notifications(conn, notification_days)
    # Signing secrets past a namespace's two newest never sign again (a rotation deletes them too;
    # this is for those kept before it did).
    report.secrets_purged = conn.execute(
        text(
            "DELETE FROM signing_secrets WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER "
            "(PARTITION BY namespace ORDER BY created_at DESC, id DESC) AS newer FROM signing_secrets) s "
            "WHERE s.newer > 2)"
        )
    ).rowcount
    purge_dependencies_and_async(conn, retention_days, report)
    return report


def purge_dependencies_and_async(conn: Connection, retention_days: int, report: MaintenanceReport) -> None:
    """What goes with the execution history: asynchronous work's rows, the upstream executions an
    execution followed and the recorded deadline misses, older than the retention; and the
    dependency rows of jobs that are no longer live (deleted by the scheduler once completed, or
    whose id now lives in another namespace: every write through the API keeps them itself), with
    the waits and latest successes that no dependency needs any more."""
    cutoff = {"days": retention_days}
    report.async_runs_purged = conn.execute(
        text(
            "DELETE FROM async_runs WHERE coalesce(reported_at, deadline_at, started_at) "
            "< now() - make_interval(days => :days)"
        ),
        cutoff,
    ).rowcount
    report.upstreams_purged = conn.execute(
        text("DELETE FROM execution_upstreams WHERE created_at < now() - make_interval(days => :days)"), cutoff
    ).rowcount
    report.deadline_misses_purged = conn.execute(
        text(
            "DELETE FROM deadline_misses WHERE least(scheduled_for, recorded_at) < now() - make_interval(days => :days)"
        ),
        cutoff,
    ).rowcount
    report.dependencies_purged = conn.execute(
        text(
            "DELETE FROM job_dependencies d WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = d.downstream "
            "AND j.namespace = d.namespace AND j.deleted_at IS NULL)"
        )
    ).rowcount
    # Then what the nodes keep for dependencies no job has any more: an ``after`` job's wait once it
    # waits for nothing (deleted, or replaced by a job of another schedule; a job created again
    # under its id starts afresh, as a new job), and the latest success of a job no job depends
    # on (written only while one does: kept, a namespace that creates and deletes jobs grew them
    # without end). A job's write and its edges' are one transaction: a replaced job never shows
    # a moment without its edges.
    report.waits_purged = conn.execute(
        text(
            "DELETE FROM after_waits w WHERE NOT EXISTS (SELECT 1 FROM job_dependencies d "
            "WHERE d.namespace = w.namespace AND d.downstream = w.downstream AND d.kind = 'after')"
        )
    ).rowcount
    report.last_successes_purged = conn.execute(
        text(
            "DELETE FROM job_last_success s WHERE NOT EXISTS (SELECT 1 FROM job_dependencies d "
            "WHERE d.namespace = s.namespace AND d.upstream = s.job_id)"
        )
    ).rowcount


def purge_notifications(conn: Connection, days: int) -> tuple[int, int]:
    """Notifications sent or abandoned, created more than ``days`` ago; and summaries with nothing
    counted whose last notification is older than any rule's interval (a day: one without its row
    sends as one with it would), or whose rule is gone."""
    outbox = conn.execute(
        text(
            "DELETE FROM notification_outbox WHERE created_at < now() - make_interval(days => :days) "
            "AND (sent_at IS NOT NULL OR given_up_at IS NOT NULL)"
        ),
        {"days": days},
    ).rowcount
    summaries = conn.execute(
        text(
            "DELETE FROM notification_state s WHERE (s.pending = 0 AND s.last_sent_at < now() - interval '1 day') "
            "OR NOT EXISTS (SELECT 1 FROM notification_rules r WHERE r.namespace = s.namespace AND r.name = s.rule)"
        )
    ).rowcount
    return outbox, summaries


def run_maintenance(
    engine: Engine, today: date, retention_days: int, ahead_days: int, notification_days: int = 7
) -> MaintenanceReport:
    with engine.begin() as conn:
        return maintain(conn, today, retention_days, ahead_days, notification_days)
