"""The jobs with a deadline, indexed: the watchdog's deadline pass reads them every pass, and a
deployment where no job has one pays one probe of an empty index.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_deadlines",
        "jobs",
        ["namespace"],
        postgresql_where=sa.text("options ? 'deadline_seconds' AND deleted_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_deadlines", table_name="jobs")
