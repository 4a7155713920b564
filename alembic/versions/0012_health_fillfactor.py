"""job_health pages keep room for a row's next version (fillfactor 70): every delivery updates its
job's row, and an update that fits on the row's page is a HOT update (no new index entry, no
index lookups left to clean up). Measured with history writes of 1,000 rows: 15 % of the updates
were HOT at the default fillfactor, 93 % at 70, and the health upsert took about a third less of
PostgreSQL's time per row. Existing pages take the setting when rewritten (VACUUM FULL job_health).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE job_health SET (fillfactor = 70)")


def downgrade() -> None:
    op.execute("ALTER TABLE job_health RESET (fillfactor)")
