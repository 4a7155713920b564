"""history's key includes the trigger: a manual trigger (or a backfill) at the very instant of a
scheduled occurrence is an execution of its own, not a second delivery of that occurrence

Revision ID: 0010
Revises: 0006
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("pk_scheduled_jobs", "scheduled_jobs", type_="primary")
    op.create_primary_key(
        "pk_scheduled_jobs", "scheduled_jobs", ["job_id", "scheduled_for", "event_index", "attempt", "trigger"]
    )


def downgrade() -> None:
    op.drop_constraint("pk_scheduled_jobs", "scheduled_jobs", type_="primary")
    op.create_primary_key("pk_scheduled_jobs", "scheduled_jobs", ["job_id", "scheduled_for", "event_index", "attempt"])
