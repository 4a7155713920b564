"""history rows that stand for several occurrences: a span of days a calendar excludes, recorded
skipped once, and the occurrences the watchdog found late over a stall, with how many and the
last of them

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable, without a default: a change of the catalogue only, however many rows the partitions hold
    op.add_column(
        "scheduled_jobs",
        sa.Column(
            "occurrences",
            sa.Integer(),
            nullable=True,
            comment="occurrences the row stands for (summary rows; else null: one)",
        ),
    )
    op.add_column(
        "scheduled_jobs",
        sa.Column(
            "last_scheduled_for",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="the last occurrence a summary row stands for",
        ),
    )


def downgrade() -> None:
    op.drop_column("scheduled_jobs", "last_scheduled_for")
    op.drop_column("scheduled_jobs", "occurrences")
