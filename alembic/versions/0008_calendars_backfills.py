"""business calendars and backfills

Revision ID: 0008
Revises: 0009
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0008"
down_revision = "0009"  # after history keyed by trigger (0010), which a backfill's rows rely on, and 0009
branch_labels = None
depends_on = None


def _now() -> sa.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "calendars",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "document",
            JSONB(),
            nullable=False,
            comment="timezone and exclude, as cronman.calendars writes them",
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("namespace", "name"),
    )
    op.create_index(
        "ix_jobs_calendars",
        "jobs",
        ["namespace"],
        postgresql_where=sa.text("options ? 'calendars' AND deleted_at IS NULL"),
    )
    op.create_table(
        "backfills",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("incarnation", sa.BigInteger(), nullable=False),
        sa.Column("from_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("to_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("max_per_second", sa.Float(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False, server_default="1", comment="executions per occurrence"),
        sa.Column("timing", JSONB(), nullable=False, comment="the schedule and calendars when it was asked for"),
        sa.Column("total", sa.Integer(), nullable=False, comment="executions in all"),
        sa.Column("state", sa.Text(), nullable=False, comment="running, dispatched (all handed out) or cancelled"),
        sa.Column("cursor_at", sa.DateTime(timezone=True), comment="every occurrence up to here is claimed"),
        sa.Column("dispatched", sa.Integer(), nullable=False, server_default="0", comment="executions handed out"),
        sa.Column("driver", sa.Text()),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("reason", sa.Text()),
        sa.Column("created_by", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_backfills_active", "backfills", ["state"], postgresql_where=sa.text("state <> 'dispatched'"))
    op.create_index("ix_backfills_job", "backfills", ["job_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_backfills_job", table_name="backfills")
    op.drop_index("ix_backfills_active", table_name="backfills")
    op.drop_table("backfills")
    op.drop_index("ix_jobs_calendars", table_name="jobs")
    op.drop_table("calendars")
