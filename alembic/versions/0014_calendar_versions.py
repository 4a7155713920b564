"""calendars carry a version, moved by every write, so that the nodes load again only the
calendars that changed instead of every document on each change

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("calendars_version_seq")))
    # (existing rows take a number each from the default)
    op.add_column(
        "calendars",
        sa.Column(
            "version",
            sa.BigInteger(),
            server_default=sa.text("nextval('calendars_version_seq'::regclass)"),
            nullable=False,
            comment="the next number of calendars_version_seq at each write",
        ),
    )


def downgrade() -> None:
    op.drop_column("calendars", "version")
    op.execute(sa.schema.DropSequence(sa.Sequence("calendars_version_seq")))
