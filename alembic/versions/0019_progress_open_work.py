"""How far back a node's open work goes: ``node_progress.open_from``, the earliest scheduled time
of the occurrences it held or had parked (claimed, not yet ended) when it saved its progress. A
loss of Redis's data loses their claims; when their node is gone by then, nobody holds them in
memory, and the nodes claim again from there, checked against history (scheduler_node.recovery).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "node_progress",
        sa.Column(
            "open_from",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="the earliest scheduled time of the occurrences it held or had parked, not yet ended",
        ),
    )


def downgrade() -> None:
    op.drop_column("node_progress", "open_from")
