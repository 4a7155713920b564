"""``cronman jobs list`` and ``cronman jobs get ID`` for jobs that wait for others, work that
finishes later and deadlines, against the real API on a real socket. History and health rows are
written as the nodes write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, text

from cronman.store.partitions import ensure_partitions
from tests.cli.conftest import job

HOURLY = {"type": "cron", "expression": "0 * * * *", "timezone": "UTC"}


def _create(cli: Any, tmp_path: Any, docs: list[dict[str, Any]]) -> None:
    import json

    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"jobs": docs}))
    r = cli("jobs", "create", "-f", str(path))
    assert r.rc == 0, r.err


def test_list_and_get_show_upstreams_downstreams_running_work_and_the_deadline(
    cli: Any, engine: Engine, tmp_path: Any
) -> None:
    _create(
        cli,
        tmp_path,
        [
            job("extract", schedule=HOURLY, deadline_seconds=900),
            job("audit", schedule=HOURLY),
            job("transform", schedule={"type": "after", "jobs": ["extract"], "within_seconds": 7200}),
            job("load", schedule=HOURLY, require={"jobs": ["transform", "audit"], "wait_seconds": 600}),
        ],
    )
    listed = {ln.split()[0]: ln for ln in cli("jobs", "list").out.splitlines()[1:]}
    assert "after extract" in listed["transform"]

    now = datetime.now(UTC)
    started = now - timedelta(minutes=7)
    with engine.begin() as conn:
        ensure_partitions(conn, [started.date()])
        # (runs and misses are shown of the job's current incarnation: since it was created)
        conn.execute(text("UPDATE jobs SET created_at = now() - interval '1 day'"))
        conn.execute(
            text(
                "INSERT INTO async_runs (execution_id, namespace, job_id, scheduled_for, event_index, trigger, "
                "attempt, status, token_hash, started_at, deadline_at, timeout_at) SELECT "
                "'11111111-1111-5111-8111-111111111111', namespace, id, :t, 0, 'schedule', 2, 'running', "
                "'\\x00'::bytea, :t, :t + interval '1 hour', :t + interval '1 hour' FROM jobs WHERE id = 'extract'"
            ),
            {"t": started},
        )
        conn.execute(
            text(
                "INSERT INTO deadline_misses (namespace, job_id, execution_id, scheduled_for, deadline_at, status) "
                "SELECT namespace, id, '22222222-2222-5222-8222-222222222222', :t, :t + interval '15 minutes', "
                "'failed' FROM jobs WHERE id = 'extract'"
            ),
            {"t": now - timedelta(minutes=20)},
        )
        conn.execute(
            text(
                "INSERT INTO job_health (job_id, incarnation, namespace, late_since) "
                "SELECT id, incarnation, namespace, :t FROM jobs WHERE id = 'extract'"
            ),
            {"t": now - timedelta(minutes=5)},
        )

    out = cli("jobs", "get", "extract").out.splitlines()
    assert out[1].split()[:2] == ["extract", "default"]
    assert ["downstream", "transform", "after"] in [ln.split() for ln in out]
    running = next(ln.split() for ln in out if ln.startswith("11111111-"))
    assert running[2:4] == ["2", "7m"]
    missed = next(ln.split() for ln in out if ln.startswith("22222222-"))
    assert missed[-1] == "failed"
    deadline = next(ln for ln in out if ln.startswith("deadline:"))
    assert deadline.startswith("deadline: 15m after each occurrence; health late since ")

    out = cli("jobs", "get", "transform").out.splitlines()
    assert ["upstream", "extract", "after", "(within", "2h)"] in [ln.split() for ln in out]
    assert ["downstream", "load", "require"] in [ln.split() for ln in out]
    assert not any(ln.startswith("deadline:") for ln in out)

    out = cli("jobs", "get", "load").out.splitlines()
    rows = [ln.split() for ln in out]
    assert ["upstream", "transform", "require", "(within", "1d,", "waits", "up", "to", "10m)"] in rows
    assert ["upstream", "audit", "require", "(within", "1d,", "waits", "up", "to", "10m)"] in rows

    plain = cli("jobs", "get", "audit").out.splitlines()
    assert plain[0].split()[0] == "ID" and ["downstream", "load", "require"] in [ln.split() for ln in plain]
