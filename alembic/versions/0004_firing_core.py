"""the firing core: job incarnations, history wide enough for every value, per-node firing
progress and whole-cluster outages (misfires per slot), trigger look-up by time

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A job id re-created after a delete is a new incarnation: its history starts empty.
    op.execute(sa.schema.CreateSequence(sa.Sequence("jobs_incarnation_seq")))
    op.add_column(
        "jobs",
        sa.Column(
            "incarnation",
            sa.BigInteger(),
            server_default=sa.text("nextval('jobs_incarnation_seq'::regclass)"),
            nullable=False,
            comment="a new number each time the id is (re)created; history belongs to one incarnation",
        ),
    )
    op.add_column("scheduled_jobs", sa.Column("incarnation", sa.BigInteger(), nullable=True))
    op.add_column("scheduled_jobs", sa.Column("namespace", sa.Text(), nullable=True))
    op.alter_column("scheduled_jobs", "lag_ms", type_=sa.BigInteger(), existing_nullable=True)
    op.alter_column("scheduled_jobs", "throttle_wait_ms", type_=sa.BigInteger(), existing_nullable=True)
    op.add_column("job_triggers", sa.Column("incarnation", sa.BigInteger(), nullable=True))
    op.add_column("job_triggers", sa.Column("namespace", sa.Text(), nullable=True))
    op.create_index("ix_job_triggers_requested_at", "job_triggers", ["requested_at"])

    # How far each node (incarnation) has fired the slots it owned: a slot taken over resumes from
    # the furthest point any of its owners reached, so a cascade of failures misses nothing.
    op.create_table(
        "node_progress",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("incarnation", sa.Text(), nullable=False),
        sa.Column("fired_through", sa.DateTime(timezone=True), nullable=False),
        sa.Column("slots", sa.LargeBinary(), nullable=False, comment="bitmap of the slots fired through that time"),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("node_id", "incarnation"),
    )
    # Times when no scheduler was running at all: only occurrences due then are misfires.
    op.create_table(
        "cluster_outages",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_by", sa.Text(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_cluster_outages_until", "cluster_outages", ["until"])


def downgrade() -> None:
    op.drop_index("ix_cluster_outages_until", table_name="cluster_outages")
    op.drop_table("cluster_outages")
    op.drop_table("node_progress")
    op.drop_index("ix_job_triggers_requested_at", table_name="job_triggers")
    op.drop_column("job_triggers", "namespace")
    op.drop_column("job_triggers", "incarnation")
    op.alter_column("scheduled_jobs", "throttle_wait_ms", type_=sa.Integer(), existing_nullable=True)
    op.alter_column("scheduled_jobs", "lag_ms", type_=sa.Integer(), existing_nullable=True)
    op.drop_column("scheduled_jobs", "namespace")
    op.drop_column("scheduled_jobs", "incarnation")
    op.drop_column("jobs", "incarnation")
    op.execute(sa.schema.DropSequence(sa.Sequence("jobs_incarnation_seq")))
