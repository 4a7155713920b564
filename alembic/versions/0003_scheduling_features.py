"""scheduling and delivery features: job options, throttle policies, signing secrets, job events,
queued commands, redelivery requests, the cluster's fired-through watermark

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column(
            "options", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False,
            comment="delivery and scheduling options (fan-out, throttle, misfire, overlap, dead letter)",
        ),
    )
    op.add_column("job_triggers", sa.Column("kind", sa.Text(), server_default="trigger", nullable=False))
    op.add_column("job_triggers", sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True))
    op.add_column("job_triggers", sa.Column("event_index", sa.Integer(), nullable=True))
    op.add_column("job_triggers", sa.Column("attempt", sa.Integer(), nullable=True))
    op.add_column("job_triggers", sa.Column("execution_id", postgresql.UUID(as_uuid=False), nullable=True))
    op.add_column(
        "job_triggers",
        sa.Column("trigger", sa.Text(), nullable=True, comment="the redelivered execution's own trigger"),
    )
    op.add_column("scheduled_jobs", sa.Column("throttle_wait_ms", sa.Integer(), nullable=True))
    op.add_column("scheduled_jobs", sa.Column("dead_lettered", sa.Boolean(), nullable=True))

    op.create_table(
        "throttle_policies",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("max_in_flight", sa.Integer(), nullable=False),
        sa.Column("max_per_second", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "name"),
    )
    op.create_table(
        "signing_secrets",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_signing_secrets_namespace", "signing_secrets", ["namespace", "created_at"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id", "id"])
    op.create_table(
        "commands",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "scheduler_state",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("scheduler_state")
    op.drop_table("commands")
    op.drop_index("ix_job_events_job_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("ix_signing_secrets_namespace", table_name="signing_secrets")
    op.drop_table("signing_secrets")
    op.drop_table("throttle_policies")
    op.drop_column("scheduled_jobs", "dead_lettered")
    op.drop_column("scheduled_jobs", "throttle_wait_ms")
    for col in ("trigger", "execution_id", "attempt", "event_index", "scheduled_for", "kind"):
        op.drop_column("job_triggers", col)
    op.drop_column("jobs", "options")
