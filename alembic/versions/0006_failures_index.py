"""failed executions indexed by time, for the failures across jobs and the "failing" jobs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Partial: only failed rows, a small part of the history, so it costs little to keep. Created on
    # the partitioned parent, it is created on every partition, existing and future. Building it
    # reads the history once; nodes hold their history buffer meanwhile (scheduler_node.history).
    op.create_index(
        "ix_scheduled_jobs_failed",
        "scheduled_jobs",
        ["scheduled_for"],
        postgresql_where=sa.text("status IN ('failed', 'permanently_failed')"),
    )


def downgrade() -> None:
    op.drop_index("ix_scheduled_jobs_failed", table_name="scheduled_jobs")
