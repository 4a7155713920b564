"""The schema (SQLAlchemy Core). Alembic migrations are the only way it changes in a database;
``alembic check`` in the tests keeps this file and the migrations in step."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    Table,
    Text,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

metadata = MetaData()

jobs_version_seq = Sequence("jobs_version_seq", metadata=metadata)

# Every change to a job stamps it with the next `version` and with the id of the writing
# transaction (`change_xid`). Nodes read the change feed by transaction id against the
# snapshot's xmin, which cannot skip a transaction that commits late.
jobs = Table(
    "jobs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("namespace", Text, nullable=False, server_default="default"),
    Column("name", Text),
    Column("schedule", JSONB, nullable=False),
    Column("target", JSONB, nullable=False),
    Column("payload", Text, nullable=False, comment="JSON text, delivered verbatim"),
    Column("retry", JSONB, nullable=False),
    Column("paused", Boolean, nullable=False, server_default=false()),
    Column("slot", Integer, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("change_xid", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("deleted_at", DateTime(timezone=True), comment="tombstone: nodes learn of deletes from it"),
    Index("ix_jobs_slot_live", "slot", postgresql_where=text("deleted_at IS NULL")),
    Index("ix_jobs_change_xid", "change_xid"),
    Index("ix_jobs_namespace_id", "namespace", "id"),
)

# Manual "fire once now" requests; nodes read them like the job change feed.
job_triggers = Table(
    "job_triggers",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", Text, nullable=False),
    Column("requested_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("requested_by", Text),
    Column("change_xid", BigInteger, nullable=False),
    Index("ix_job_triggers_change_xid", "change_xid"),
)

# Execution history, one row per attempt, range-partitioned by day on scheduled_for
# (partitions scheduled_jobs_YYYYMMDD, see cronman.partitions). The primary key is the
# database's own guard against a second row for one attempt.
scheduled_jobs = Table(
    "scheduled_jobs",
    metadata,
    Column("job_id", Text, nullable=False),
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("event_index", Integer, nullable=False, server_default="0"),
    Column("attempt", Integer, nullable=False),
    Column("execution_id", UUID(as_uuid=False), nullable=False),
    Column("trigger", Text, nullable=False, server_default="schedule"),
    Column("status", Text, nullable=False),
    Column("node", Text),
    Column("fired_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("lag_ms", Integer),
    Column("http_status", Integer),
    Column("error", Text),
    Column("duplicates", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("job_id", "scheduled_for", "event_index", "attempt", name="pk_scheduled_jobs"),
    postgresql_partition_by="RANGE (scheduled_for)",
)

PARTITION_PREFIX = "scheduled_jobs_"
