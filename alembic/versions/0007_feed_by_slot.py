"""the change feed read by owned slots: jobs indexed by (change_xid, slot)

Revision ID: 0007
Revises: 0008
Create Date: 2026-12-09
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0008"  # chain: 0006 -> 0010 -> 0009 -> 0008 -> 0007
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A node polls `change_xid >= cursor AND slot = ANY(owned slots)`. With the slot in the index
    # after the transaction id, one index search finds the changed rows and tests their slot there:
    # only the node's own rows are read from the table (at 50 nodes, a fiftieth of what changed).
    # The index serves `change_xid >= cursor` alone just as well, so it replaces the old one.
    # Building it holds writes to jobs (not reads, not history) for about a second per million jobs.
    op.create_index("ix_jobs_change_xid_slot", "jobs", ["change_xid", "slot"])
    op.drop_index("ix_jobs_change_xid", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_change_xid", "jobs", ["change_xid"])
    op.drop_index("ix_jobs_change_xid_slot", table_name="jobs")
