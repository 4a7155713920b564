"""The schema (SQLAlchemy Core). Alembic migrations are the only way it changes in a database;
``alembic check`` in the tests keeps this file and the migrations in step."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = MetaData()

jobs_version_seq = Sequence("jobs_version_seq", metadata=metadata)
# A job id (re)created after a delete gets a new incarnation; its history belongs to it alone.
jobs_incarnation_seq = Sequence("jobs_incarnation_seq", metadata=metadata)
# Every write of a calendar stamps it with the next number: nodes read the (namespace, name,
# version) of every calendar and load again only those whose version moved.
calendars_version_seq = Sequence("calendars_version_seq", metadata=metadata)

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
    Column(
        "options",
        JSONB,
        nullable=False,
        server_default=text("'{}'::jsonb"),
        comment="delivery and scheduling options (fan-out, throttle, misfire, overlap, dead letter)",
    ),
    Column(
        "incarnation",
        BigInteger,
        nullable=False,
        server_default=text("nextval('jobs_incarnation_seq'::regclass)"),
        comment="a new number each time the id is (re)created; history belongs to one incarnation",
    ),
    Column(
        "labels",
        JSONB,
        nullable=False,
        server_default=text("'{}'::jsonb"),
        comment="key/value labels for selecting jobs (cronman.labels)",
    ),
    Column("paused_reason", JSONB, comment="why and since when a paused job is paused"),
    Index("ix_jobs_slot_live", "slot", postgresql_where=text("deleted_at IS NULL")),
    # Label selectors (containment @> and key existence ?: the default jsonb_ops answers both) and
    # ?q= (a substring of the id or the name: pg_trgm).
    Index("ix_jobs_labels", "labels", postgresql_using="gin"),
    Index("ix_jobs_id_trgm", "id", postgresql_using="gin", postgresql_ops={"id": "gin_trgm_ops"}),
    Index("ix_jobs_name_trgm", "name", postgresql_using="gin", postgresql_ops={"name": "gin_trgm_ops"}),
    # The change feed by owned slots (migration 0007): one index search, the slot tested in the index.
    Index("ix_jobs_change_xid_slot", "change_xid", "slot"),
    Index("ix_jobs_namespace_id", "namespace", "id"),
    # The few jobs that name calendars: which jobs use a calendar about to be deleted.
    Index("ix_jobs_calendars", "namespace", postgresql_where=text("options ? 'calendars' AND deleted_at IS NULL")),
    # The few jobs with a deadline (migration 0018): the watchdog's deadline pass reads them each pass.
    Index(
        "ix_jobs_deadlines", "namespace", postgresql_where=text("options ? 'deadline_seconds' AND deleted_at IS NULL")
    ),
)

# Each namespace's live jobs, kept by statement triggers on jobs (migration 0016):
# the jobs quota is checked by key, not by counting.
namespace_usage = Table(
    "namespace_usage",
    metadata,
    Column("namespace", Text, primary_key=True),
    Column("jobs", BigInteger, nullable=False, server_default="0"),
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
    # "trigger": fire once now; "redeliver": send an existing execution again (same execution id)
    Column("kind", Text, nullable=False, server_default="trigger"),
    Column("scheduled_for", DateTime(timezone=True)),
    Column("event_index", Integer),
    Column("attempt", Integer),
    Column("execution_id", UUID(as_uuid=False)),
    Column("trigger", Text, comment="the redelivered execution's own trigger"),
    Column("incarnation", BigInteger),
    Column("namespace", Text),
    Index("ix_job_triggers_change_xid", "change_xid"),
    Index("ix_job_triggers_requested_at", "requested_at"),
)

# Execution history, one row per attempt, range-partitioned by day on scheduled_for
# (partitions scheduled_jobs_YYYYMMDD, see cronman.store.partitions). The primary key is the
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
    Column("lag_ms", BigInteger),
    Column("http_status", Integer),
    Column("error", Text),
    Column("duplicates", Integer, nullable=False, server_default="0"),
    Column("throttle_wait_ms", BigInteger),
    Column("dead_lettered", Boolean),
    Column("incarnation", BigInteger),
    Column("namespace", Text),
    Column("response", Text, comment="the start of the receiver's answer (opt-in)"),
    # A row that stands for several occurrences of the job (a span of days a calendar excludes,
    # recorded skipped; occurrences the watchdog found late): how many, and the last of them.
    Column("occurrences", Integer, comment="occurrences the row stands for (summary rows; else null: one)"),
    Column("last_scheduled_for", DateTime(timezone=True), comment="the last occurrence a summary row stands for"),
    # trigger too: a manual trigger or a backfill at an occurrence's instant is an execution of its own
    PrimaryKeyConstraint("job_id", "scheduled_for", "event_index", "attempt", "trigger", name="pk_scheduled_jobs"),
    # Failures across jobs, newest first, and the jobs whose latest execution failed (the dashboard).
    Index(
        "ix_scheduled_jobs_failed",
        "scheduled_for",
        postgresql_where=text("status IN ('failed', 'permanently_failed')"),
    ),
    # The same, one namespace at a time (a namespace's failures are not pushed out by another's).
    Index(
        "ix_scheduled_jobs_failed_ns",
        "namespace",
        "scheduled_for",
        postgresql_where=text("status IN ('failed', 'permanently_failed')"),
    ),
    postgresql_partition_by="RANGE (scheduled_for)",
)

# API keys, each bound to one namespace. Only a SHA-256 of the key is kept; ``prefix`` is the
# key's non-secret start, for display and for naming a key to revoke.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("prefix", Text, nullable=False),
    Column("key_hash", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True)),
    Column("description", Text),
    UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    Index("ix_api_keys_prefix", "prefix"),
)

# A named limit on deliveries in flight (and optionally per second), shared by every job of the
# namespace that names it, across the whole cluster.
throttle_policies = Table(
    "throttle_policies",
    metadata,
    Column("namespace", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("max_in_flight", Integer, nullable=False),
    Column("max_per_second", Float),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# HMAC secrets for Cronman-Signature, per namespace; the newest signs, the previous one also signs
# for a day after a rotation so receivers can switch over.
signing_secrets = Table(
    "signing_secrets",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("secret", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_signing_secrets_namespace", "namespace", "created_at"),
)

# Who did what to a job (create, update, pause, resume, trigger, redeliver, delete).
job_events = Table(
    "job_events",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", Text, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("action", Text, nullable=False),
    Column("actor", Text),
    Column("detail", JSONB),
    Index("ix_job_events_job_id", "job_id", "id"),
)

# Create/update/delete commands received through the command queue, and what became of them.
commands = Table(
    "commands",
    metadata,
    Column("id", Text, primary_key=True),
    Column("namespace", Text),
    Column("action", Text, nullable=False),
    Column("job_id", Text),
    Column("status", Text, nullable=False),
    Column("error", Text),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("applied_at", DateTime(timezone=True)),
)

# Small cluster-wide facts; "fired_through" is the last time any node was running, which tells
# a node starting after a full outage which occurrences nobody fired (misfires).
scheduler_state = Table(
    "scheduler_state",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", DateTime(timezone=True), nullable=False),
)

PARTITION_PREFIX = "scheduled_jobs_"


# How far each node (incarnation) fired the slots it owned (a bitmap of slots). A slot taken over
# resumes from the furthest point any of its owners reached, so a cascade of failures misses nothing.
node_progress = Table(
    "node_progress",
    metadata,
    Column("node_id", Text, nullable=False),
    Column("incarnation", Text, nullable=False),
    Column("fired_through", DateTime(timezone=True), nullable=False),
    Column("slots", LargeBinary, nullable=False, comment="bitmap of the slots fired through that time"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The Redis data the claims were made in: when it is lost, fired_through is lowered to what
    # the loss leaves standing, and firing_through (never lowered) still says the cluster fired.
    Column("epoch", Text),
    Column("firing_through", DateTime(timezone=True)),
    # The earliest scheduled time of the occurrences it held or had parked, not yet ended: a loss
    # of Redis's data after it is gone is claimed again from no later than there.
    Column(
        "open_from",
        DateTime(timezone=True),
        comment="the earliest scheduled time of the occurrences it held or had parked, not yet ended",
    ),
    PrimaryKeyConstraint("node_id", "incarnation"),
)

# Redis data lost (by its epoch token): progress claimed in it speaks for occurrences up to `since`.
lost_epochs = Table(
    "lost_epochs",
    metadata,
    Column("epoch", Text, primary_key=True),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("noticed_by", Text),
    Column("noticed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Times when no scheduler was running at all: only occurrences due then are misfires.
cluster_outages = Table(
    "cluster_outages",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("until", DateTime(timezone=True), nullable=False),
    Column("recorded_by", Text),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_cluster_outages_until", "until"),
)


# Each job's health, kept up to date by the nodes' history writers as final outcomes are written
# (and by the watchdog for late occurrences), so that a page of jobs reads it by key.
job_health = Table(
    "job_health",
    metadata,
    Column("job_id", Text, primary_key=True),
    Column("incarnation", BigInteger, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("last_success_at", DateTime(timezone=True)),
    Column("last_failure_at", DateTime(timezone=True)),
    Column("consecutive_failures", Integer, nullable=False, server_default="0"),
    Column("failures_toward_pause", Integer, nullable=False, server_default="0"),
    Column("last_lag_ms", BigInteger),
    Column("last_delivered_for", DateTime(timezone=True), comment="the latest occurrence an attempt was made for"),
    Column("late_since", DateTime(timezone=True), comment="the first occurrence of a late spell"),
    Column("last_late_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # room on each page for a row's next version: every delivery updates its job's row (HOT updates)
    postgresql_with={"fillfactor": 70},
)

# Notifications: the rules of a namespace, the events writers record for them, one summary per
# (rule, job, event kind), and the outbox of notifications to send (at least once).
notification_rules = Table(
    "notification_rules",
    metadata,
    Column("namespace", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("events", ARRAY(Text), nullable=False),
    Column("selector", Text, nullable=False, server_default=""),
    Column("target", JSONB, nullable=False),
    Column("min_interval_seconds", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

notification_events = Table(
    "notification_events",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("detail", JSONB),
    # the dispatcher takes each namespace's events in turn (and finds the namespaces that have some)
    Index("ix_notification_events_namespace", "namespace", "id"),
)

notification_state = Table(
    "notification_state",
    metadata,
    Column("namespace", Text, primary_key=True),
    Column("rule", Text, primary_key=True),
    Column("job_id", Text, primary_key=True),
    Column("event", Text, primary_key=True),
    Column("last_sent_at", DateTime(timezone=True)),
    Column("pending", Integer, nullable=False, server_default="0"),
    Column("pending_first_at", DateTime(timezone=True)),
    Column("pending_detail", JSONB),
    Index("ix_notification_state_pending", "namespace", "last_sent_at", postgresql_where=text("pending > 0")),
)

notification_outbox = Table(
    "notification_outbox",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("event_id", UUID(as_uuid=False), nullable=False),
    Column("namespace", Text, nullable=False),
    Column("rule", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("body", Text, nullable=False, comment="the JSON sent, the same bytes on every attempt"),
    Column("target", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("sent_at", DateTime(timezone=True)),
    Column("given_up_at", DateTime(timezone=True)),
    Column("last_error", Text),
    UniqueConstraint("event_id", name="uq_notification_outbox_event_id"),
    Index(
        "ix_notification_outbox_due",
        "namespace",
        "next_attempt_at",
        postgresql_where=text("sent_at IS NULL AND given_up_at IS NULL"),
    ),
    Index("ix_notification_outbox_created", "created_at"),  # the purge of sent and abandoned ones
)


# Business calendars (cronman.model.calendars): the days a namespace's jobs that name them do not fire.
calendars = Table(
    "calendars",
    metadata,
    Column("namespace", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("document", JSONB, nullable=False, comment="timezone and exclude, as cronman.calendars writes them"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column(
        "version",
        BigInteger,
        nullable=False,
        server_default=text("nextval('calendars_version_seq'::regclass)"),
        comment="the next number of calendars_version_seq at each write",
    ),
)

# Backfills: a job's occurrences in a past range delivered again, as executions of their own (trigger
# "backfill:<id>"), at a bounded rate. One owner of the job's slot drives a running backfill at a time
# (``driver`` holds a lease until ``lease_until``, in database time) and records how far it got.
backfills = Table(
    "backfills",
    metadata,
    Column("id", Text, primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("incarnation", BigInteger, nullable=False),
    Column("from_at", DateTime(timezone=True), nullable=False),
    Column("to_at", DateTime(timezone=True), nullable=False),
    Column("max_per_second", Float, nullable=False),
    Column("events", Integer, nullable=False, server_default="1", comment="executions per occurrence"),
    Column("timing", JSONB, nullable=False, comment="the schedule and calendars when it was asked for"),
    Column("total", Integer, nullable=False, comment="executions in all"),
    Column("state", Text, nullable=False, comment="running, dispatched (all handed out) or cancelled"),
    Column("cursor_at", DateTime(timezone=True), comment="every occurrence up to here is claimed"),
    Column("dispatched", Integer, nullable=False, server_default="0", comment="executions handed out"),
    Column("driver", Text),
    Column("lease_until", DateTime(timezone=True)),
    Column("reason", Text),
    Column("created_by", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column(
        "change_xid",
        BigInteger,
        nullable=False,
        server_default="0",
        comment="the transaction that last created, cancelled or finished handing it out: the nodes' feed",
    ),
    Index("ix_backfills_active", "state", postgresql_where=text("state <> 'dispatched'")),
    Index("ix_backfills_change_xid", "change_xid"),
    Index("ix_backfills_job", "job_id", "created_at"),
)

# Work that finishes later (completion.mode callback): one row per execution, the attempt sent
# last; nodes write it before each attempt, the API's :complete and :heartbeat update it.
async_runs = Table(
    "async_runs",
    metadata,
    Column("execution_id", UUID(as_uuid=False), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("event_index", Integer, nullable=False),
    Column("trigger", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("status", Text, nullable=False),  # running, succeeded, failed (reported), timed_out
    Column("token_hash", LargeBinary, nullable=False),  # sha256 of the attempt's completion token
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("deadline_at", DateTime(timezone=True), nullable=False),  # no end by then: the attempt failed
    Column("timeout_at", DateTime(timezone=True), nullable=False),  # heartbeats never move it past this
    Column("heartbeat_ms", BigInteger),
    Column("last_heartbeat_at", DateTime(timezone=True)),
    Column("reported_at", DateTime(timezone=True)),
    Column("output", Text),
    Column("reported_by", Text),
    Index("ix_async_runs_job", "namespace", "job_id", "started_at"),
    Index("ix_async_runs_running", "deadline_at", postgresql_where=text("status = 'running'")),
)

# Jobs that wait for other jobs: an edge per (upstream, downstream) of a namespace, kept by the API
# with the downstream job ("after": its schedule; "require": its requirement).
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("namespace", Text, nullable=False),
    Column("upstream", Text, nullable=False),
    Column("downstream", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("within_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("namespace", "upstream", "downstream"),
    Index("ix_job_dependencies_downstream", "namespace", "downstream"),
)

# An "after" job's upstreams' successes since it last ran: {upstream: [execution id, succeeded ms]}.
after_waits = Table(
    "after_waits",
    metadata,
    Column("namespace", Text, nullable=False),
    Column("downstream", Text, nullable=False),
    Column("pending", JSONB, nullable=False, server_default="{}"),
    # the upstream executions counted already: {upstream: [execution id, ...]} (each counts once)
    Column("applied", JSONB, nullable=False, server_default="{}"),
    Column("last_fired_ms", BigInteger),
    PrimaryKeyConstraint("namespace", "downstream"),
)

# The upstream executions an execution followed; for an "after" execution an upstream's failure
# ended, why it is skipped.
execution_upstreams = Table(
    "execution_upstreams",
    metadata,
    Column("execution_id", UUID(as_uuid=False), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("upstream_jobs", ARRAY(Text), nullable=False),
    Column("upstream_ids", ARRAY(Text), nullable=False),
    Column("skip_reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_execution_upstreams_job", "namespace", "job_id", "created_at"),
)

# The latest success of each job another job depends on.
job_last_success = Table(
    "job_last_success",
    metadata,
    Column("namespace", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("execution_id", UUID(as_uuid=False), nullable=False),
    Column("succeeded_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("namespace", "job_id"),
)

# Occurrences that missed their job's deadline_seconds, once each.
deadline_misses = Table(
    "deadline_misses",
    metadata,
    Column("namespace", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("execution_id", UUID(as_uuid=False), nullable=False),
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("deadline_at", DateTime(timezone=True), nullable=False),
    Column("status", Text, comment="what history said of it when the deadline passed"),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("execution_id"),
    Index("ix_deadline_misses_job", "namespace", "job_id", "scheduled_for"),
)
