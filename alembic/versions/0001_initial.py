"""jobs, job_triggers and the day-partitioned scheduled_jobs history

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("jobs_version_seq")))
    op.create_table(
        "jobs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), server_default="default", nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("schedule", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("target", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False, comment="JSON text, delivered verbatim"),
        sa.Column("retry", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("change_xid", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column(
            "deleted_at", sa.DateTime(timezone=True), nullable=True,
            comment="tombstone: nodes learn of deletes from it",
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_jobs_slot_live", "jobs", ["slot"], postgresql_where=sa.text("deleted_at IS NULL"))
    op.create_index("ix_jobs_change_xid", "jobs", ["change_xid"])
    op.create_index("ix_jobs_namespace_id", "jobs", ["namespace", "id"])

    op.create_table(
        "job_triggers",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=True),
        sa.Column("change_xid", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_triggers_change_xid", "job_triggers", ["change_xid"])

    op.create_table(
        "scheduled_jobs",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=False),
        sa.Column("event_index", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("execution_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("trigger", sa.Text(), server_default="schedule", nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lag_ms", sa.Integer(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duplicates", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("job_id", "scheduled_for", "event_index", "attempt", name="pk_scheduled_jobs"),
        postgresql_partition_by="RANGE (scheduled_for)",
    )


def downgrade() -> None:
    op.drop_table("scheduled_jobs")
    op.drop_index("ix_job_triggers_change_xid", table_name="job_triggers")
    op.drop_table("job_triggers")
    op.drop_index("ix_jobs_namespace_id", table_name="jobs")
    op.drop_index("ix_jobs_change_xid", table_name="jobs")
    op.drop_index("ix_jobs_slot_live", table_name="jobs")
    op.drop_table("jobs")
    op.execute(sa.schema.DropSequence(sa.Sequence("jobs_version_seq")))
