"""Work that finishes later, jobs that wait for other jobs, and deadlines.

- ``async_runs``: one row per execution of a job whose work completes asynchronously
  (``completion.mode: callback``): the attempt sent last, its token's hash, its deadline (moved by
  heartbeats), and the end the work reported. Nodes write it before each attempt; the API's
  ``:complete`` and ``:heartbeat`` endpoints update it.
- ``job_dependencies``: which jobs each job waits for (``after`` schedules and ``require``), per
  namespace; kept by the API with the job (the cycle check, the dashboard, the history writers'
  fan-out).
- ``after_waits``: for each job with an ``after`` schedule, its upstreams' successes since it last
  ran (updated, and the job triggered, in the transaction that writes an upstream's history row).
- ``execution_upstreams``: the upstream executions an execution followed (and, for an ``after``
  execution an upstream's failure ended, the reason it is skipped).
- ``job_last_success``: the latest success of every job some job depends on (``require``).
- ``deadline_misses``: each occurrence that missed its job's ``deadline_seconds``, once.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "async_runs",
        sa.Column("execution_id", postgresql.UUID(as_uuid=False), primary_key=True),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("scheduled_for", _TS, nullable=False),
        sa.Column("event_index", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.LargeBinary(), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("deadline_at", _TS, nullable=False),
        sa.Column("timeout_at", _TS, nullable=False),
        sa.Column("heartbeat_ms", sa.BigInteger()),
        sa.Column("last_heartbeat_at", _TS),
        sa.Column("reported_at", _TS),
        sa.Column("output", sa.Text()),
        sa.Column("reported_by", sa.Text()),
    )
    op.create_index("ix_async_runs_job", "async_runs", ["namespace", "job_id", "started_at"])
    op.create_index(
        "ix_async_runs_running", "async_runs", ["deadline_at"], postgresql_where=sa.text("status = 'running'")
    )
    op.create_table(
        "job_dependencies",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("upstream", sa.Text(), nullable=False),
        sa.Column("downstream", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("within_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "upstream", "downstream"),
    )
    op.create_index("ix_job_dependencies_downstream", "job_dependencies", ["namespace", "downstream"])
    op.create_table(
        "after_waits",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("downstream", sa.Text(), nullable=False),
        sa.Column("pending", postgresql.JSONB(), nullable=False, server_default="{}"),
        sa.Column("applied", postgresql.JSONB(), nullable=False, server_default="{}"),
        sa.Column("last_fired_ms", sa.BigInteger()),
        sa.PrimaryKeyConstraint("namespace", "downstream"),
    )
    op.create_table(
        "execution_upstreams",
        sa.Column("execution_id", postgresql.UUID(as_uuid=False), primary_key=True),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("upstream_jobs", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("upstream_ids", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("skip_reason", sa.Text()),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_execution_upstreams_job", "execution_upstreams", ["namespace", "job_id", "created_at"])
    op.create_table(
        "job_last_success",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("execution_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("succeeded_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "job_id"),
    )
    op.create_table(
        "deadline_misses",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("execution_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("scheduled_for", _TS, nullable=False),
        sa.Column("deadline_at", _TS, nullable=False),
        sa.Column("status", sa.Text(), comment="what history said of it when the deadline passed"),
        sa.Column("recorded_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("execution_id"),
    )
    op.create_index("ix_deadline_misses_job", "deadline_misses", ["namespace", "job_id", "scheduled_for"])


def downgrade() -> None:
    for table in (
        "deadline_misses",
        "job_last_success",
        "execution_upstreams",
        "after_waits",
        "job_dependencies",
        "async_runs",
    ):
        op.drop_table(table)
