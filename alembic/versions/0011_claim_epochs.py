"""progress knows which Redis data it was claimed in: a loss of that data lowers the marks that
spoke for its claims, and how far the cluster was firing is kept apart from them

Revision ID: 0011
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0011"
down_revision = "0007"  # chain: 0006 -> 0010 -> 0009 -> 0008 -> 0007 -> 0011
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the epoch token of the Redis data the progress was claimed in (none: written before this)
    op.add_column("node_progress", sa.Column("epoch", sa.Text(), nullable=True))
    # how far the node fired, never lowered: the cluster was firing then (outages are judged by it)
    op.add_column("node_progress", sa.Column("firing_through", sa.DateTime(timezone=True), nullable=True))
    # Redis data lost: progress claimed in that epoch speaks for occurrences only up to `since`
    op.create_table(
        "lost_epochs",
        sa.Column("epoch", sa.Text(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("noticed_by", sa.Text(), nullable=True),
        sa.Column("noticed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("epoch"),
    )


def downgrade() -> None:
    op.drop_table("lost_epochs")
    op.drop_column("node_progress", "firing_through")
    op.drop_column("node_progress", "epoch")
