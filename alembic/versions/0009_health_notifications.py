"""job health, auto-pause reasons, notifications (rules, events, summaries, outbox), captured responses

Revision ID: 0009
Revises: 0010
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from alembic import op

revision = "0009"
down_revision = "0010"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("paused_reason", JSONB(), nullable=True, comment="why and since when a paused job is paused"),
    )
    # Added to the partitioned parent, the column reaches every partition (no rewrite: it is nullable).
    op.add_column(
        "scheduled_jobs",
        sa.Column("response", sa.Text(), nullable=True, comment="the start of the receiver's answer (opt-in)"),
    )
    op.create_table(
        "job_health",
        sa.Column("job_id", sa.Text(), primary_key=True),
        sa.Column("incarnation", sa.BigInteger(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("last_success_at", _TS),
        sa.Column("last_failure_at", _TS),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("failures_toward_pause", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_lag_ms", sa.BigInteger()),
        sa.Column("last_delivered_for", _TS, comment="the latest occurrence an attempt was made for"),
        sa.Column("late_since", _TS, comment="the first occurrence of a late spell"),
        sa.Column("last_late_at", _TS),
        sa.Column("updated_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "notification_rules",
        sa.Column("namespace", sa.Text(), primary_key=True),
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("events", ARRAY(sa.Text()), nullable=False),
        sa.Column("selector", sa.Text(), nullable=False, server_default=""),
        sa.Column("target", JSONB(), nullable=False),
        sa.Column("min_interval_seconds", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "notification_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("detail", JSONB()),
    )
    op.create_table(
        "notification_state",
        sa.Column("namespace", sa.Text(), primary_key=True),
        sa.Column("rule", sa.Text(), primary_key=True),
        sa.Column("job_id", sa.Text(), primary_key=True),
        sa.Column("event", sa.Text(), primary_key=True),
        sa.Column("last_sent_at", _TS),
        sa.Column("pending", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("pending_first_at", _TS),
        sa.Column("pending_detail", JSONB()),
    )
    op.create_index(
        "ix_notification_state_pending",
        "notification_state",
        ["last_sent_at"],
        postgresql_where=sa.text("pending > 0"),
    )
    op.create_table(
        "notification_outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("event_id", UUID(as_uuid=False), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False, comment="the JSON sent, the same bytes on every attempt"),
        sa.Column("target", JSONB(), nullable=False),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.Column("next_attempt_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("sent_at", _TS),
        sa.Column("given_up_at", _TS),
        sa.Column("last_error", sa.Text()),
        sa.UniqueConstraint("event_id", name="uq_notification_outbox_event_id"),
    )
    op.create_index(
        "ix_notification_outbox_due",
        "notification_outbox",
        ["next_attempt_at"],
        postgresql_where=sa.text("sent_at IS NULL AND given_up_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_notification_outbox_due", table_name="notification_outbox")
    op.drop_table("notification_outbox")
    op.drop_index("ix_notification_state_pending", table_name="notification_state")
    op.drop_table("notification_state")
    op.drop_table("notification_events")
    op.drop_table("notification_rules")
    op.drop_table("job_health")
    op.drop_column("scheduled_jobs", "response")
    op.drop_column("jobs", "paused_reason")
