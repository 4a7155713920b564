"""Quotas per namespace and fair shares of what namespaces have in common.

- ``namespace_usage``: each namespace's live jobs, kept by statement triggers on ``jobs`` (one
  row per namespace per statement, whatever the rows it wrote), so a create checks the jobs quota
  by key instead of counting a million rows.
- ``backfills.change_xid``: the transaction that last created, cancelled or finished handing out a
  backfill; nodes read what changed since their last look, as they read jobs, instead of every
  running backfill and its timing document every second.
- notifications taken namespace by namespace: the events, the summaries waiting and the outbox's
  due notifications indexed by namespace first; the outbox by age, for its purge.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# One function for the three triggers (a trigger with transition tables has one event): each
# statement adds, per namespace, its live rows after minus its live rows before.
_COUNT_JOBS = """
CREATE FUNCTION cronman_count_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO namespace_usage AS u (namespace, jobs)
        SELECT namespace, count(*) FROM new_rows WHERE deleted_at IS NULL GROUP BY namespace ORDER BY namespace
        ON CONFLICT (namespace) DO UPDATE SET jobs = u.jobs + excluded.jobs;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO namespace_usage AS u (namespace, jobs)
        SELECT namespace, sum(d) FROM (
            SELECT namespace, 1 AS d FROM new_rows WHERE deleted_at IS NULL
            UNION ALL SELECT namespace, -1 FROM old_rows WHERE deleted_at IS NULL
        ) c GROUP BY namespace HAVING sum(d) <> 0 ORDER BY namespace
        ON CONFLICT (namespace) DO UPDATE SET jobs = u.jobs + excluded.jobs;
    ELSE
        INSERT INTO namespace_usage AS u (namespace, jobs)
        SELECT namespace, -count(*) FROM old_rows WHERE deleted_at IS NULL GROUP BY namespace ORDER BY namespace
        ON CONFLICT (namespace) DO UPDATE SET jobs = u.jobs + excluded.jobs;
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "namespace_usage",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("jobs", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("namespace"),
    )
    # writes to jobs wait until the migration commits: the count below misses none
    op.execute("LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE")
    op.execute(_COUNT_JOBS)
    op.execute(
        "CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION cronman_count_jobs()"
    )
    op.execute(
        "CREATE TRIGGER jobs_count_update AFTER UPDATE ON jobs REFERENCING OLD TABLE AS old_rows "
        "NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION cronman_count_jobs()"
    )
    op.execute(
        "CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION cronman_count_jobs()"
    )
    op.execute(
        "INSERT INTO namespace_usage (namespace, jobs) "
        "SELECT namespace, count(*) FROM jobs WHERE deleted_at IS NULL GROUP BY namespace"
    )
    op.add_column(
        "backfills",
        sa.Column(
            "change_xid",
            sa.BigInteger(),
            server_default="0",
            nullable=False,
            comment="the transaction that last created, cancelled or finished handing it out: the nodes' feed",
        ),
    )
    op.create_index("ix_backfills_change_xid", "backfills", ["change_xid"])
    op.create_index("ix_notification_events_namespace", "notification_events", ["namespace", "id"])
    op.drop_index("ix_notification_state_pending", table_name="notification_state")
    op.create_index(
        "ix_notification_state_pending",
        "notification_state",
        ["namespace", "last_sent_at"],
        postgresql_where=sa.text("pending > 0"),
    )
    op.drop_index("ix_notification_outbox_due", table_name="notification_outbox")
    op.create_index(
        "ix_notification_outbox_due",
        "notification_outbox",
        ["namespace", "next_attempt_at"],
        postgresql_where=sa.text("sent_at IS NULL AND given_up_at IS NULL"),
    )
    op.create_index("ix_notification_outbox_created", "notification_outbox", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_notification_outbox_created", table_name="notification_outbox")
    op.drop_index("ix_notification_outbox_due", table_name="notification_outbox")
    op.create_index(
        "ix_notification_outbox_due",
        "notification_outbox",
        ["next_attempt_at"],
        postgresql_where=sa.text("sent_at IS NULL AND given_up_at IS NULL"),
    )
    op.drop_index("ix_notification_state_pending", table_name="notification_state")
    op.create_index(
        "ix_notification_state_pending", "notification_state", ["last_sent_at"], postgresql_where=sa.text("pending > 0")
    )
    op.drop_index("ix_notification_events_namespace", table_name="notification_events")
    op.drop_index("ix_backfills_change_xid", table_name="backfills")
    op.drop_column("backfills", "change_xid")
    op.execute("DROP TRIGGER jobs_count_delete ON jobs")
    op.execute("DROP TRIGGER jobs_count_update ON jobs")
    op.execute("DROP TRIGGER jobs_count_insert ON jobs")
    op.execute("DROP FUNCTION cronman_count_jobs()")
    op.drop_table("namespace_usage")
