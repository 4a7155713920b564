"""failed executions indexed by namespace and time: the dashboard's "failing" jobs and failures
across jobs read one namespace's failures, not the newest of everyone's

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Partial, like ix_scheduled_jobs_failed, and created on the partitioned parent (so on every
    # partition). Building it reads the history once; nodes hold their history buffer meanwhile.
    op.create_index(
        "ix_scheduled_jobs_failed_ns",
        "scheduled_jobs",
        ["namespace", "scheduled_for"],
        postgresql_where=sa.text("status IN ('failed', 'permanently_failed')"),
    )


def downgrade() -> None:
    op.drop_index("ix_scheduled_jobs_failed_ns", table_name="scheduled_jobs")
