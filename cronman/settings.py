"""One typed settings object, read once from ``CRONMAN_*`` environment variables.

Everything below the command line takes explicit arguments; only the entry points call
:func:`load_settings`.
"""

from __future__ import annotations

import socket
from functools import cached_property

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cronman.errors import ConfigError
from cronman.model.netguard import Allowlist, parse_allowlist
from cronman.model.proxies import Network, parse_networks
from cronman.model.queues import parse_queue_allowlist
from cronman.redis.redisconn import RedisMode, topology


def _default_node_id() -> str:
    return socket.gethostname()


class Settings(BaseSettings):
    # hide_input_in_errors: a validation error must not print the URLs and keys it was given.
    model_config = SettingsConfigDict(env_prefix="CRONMAN_", extra="ignore", frozen=True, hide_input_in_errors=True)

    # Stores
    database_url: str = "postgresql://postgres@127.0.0.1:5432/cronman"
    # The API's busiest statement (a create) prepared once per database session. Off behind a
    # pooler in transaction mode (PgBouncer's pool_mode=transaction), which moves sessions between
    # clients (cronman.store.prepared).
    database_prepared_statements: bool = True
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "cronman:"

    # Redis topology (cronman.redis.redisconn; docs/operations.md, "Redis"). cluster: redis_url holds
    # comma-separated seed URLs. sentinel: the sentinels and the master's name; redis_url then gives
    # the master's scheme (rediss:// for TLS), credentials and database, not its host.
    redis_mode: RedisMode = RedisMode.STANDALONE
    redis_sentinels: str = ""
    redis_sentinel_master: str = ""
    redis_sentinel_password: SecretStr | None = None
    # The data nodes' password in every mode, instead of any in redis_url.
    redis_password: SecretStr | None = None

    # SQS
    sqs_endpoint_url: str | None = None
    sqs_region: str = "us-east-1"
    # Job commands through a queue: the scheduler nodes apply commands from this SQS queue, and
    # send those they must reject to the dead-letter queue.
    command_queue_url: str | None = None
    command_dlq_url: str | None = None

    # API
    api_host: str = "0.0.0.0"
    api_port: int = Field(8080, ge=0, le=65535)
    api_workers: int = Field(2, ge=1, le=64)
    api_url: str | None = None
    dev_mode: bool = False

    # Security: the admin key (sees every namespace), the switch for running without keys, and the
    # callback addresses allowed despite the SSRF rules (comma-separated CIDRs and host names).
    api_key: SecretStr | None = None
    auth_disabled: bool = False
    callback_allowlist: str = ""

    # Dashboard (/ui/): how long a login lasts; failed logins allowed per key tried and client, and
    # per client whatever the key, in a window; whether the session cookie is marked Secure on plain
    # HTTP too (behind a TLS proxy that does not say so; over HTTPS it always is, and the answers
    # carry HSTS for hsts_seconds, 0: none).
    ui_session_seconds: int = Field(12 * 3600, ge=60, le=7 * 86400)
    ui_login_attempts: int = Field(10, ge=1, le=10_000)
    ui_login_client_attempts: int = Field(100, ge=1, le=100_000)
    ui_login_window_seconds: int = Field(300, ge=1, le=86400)
    ui_secure_cookie: bool = False
    hsts_seconds: int = Field(365 * 86400, ge=0, le=2 * 365 * 86400)
    # The proxies (comma-separated CIDRs) whose X-Forwarded-For and X-Forwarded-Proto are believed:
    # the client and the scheme of a request from one of them are what they report. Empty: none.
    trusted_proxies: str = ""

    # Scheduler node
    node_id: str = Field(default_factory=_default_node_id, min_length=1, max_length=200, pattern=r"^[^|/\s]+$")
    node_host: str = "0.0.0.0"
    node_port: int = Field(9090, ge=-1, le=65535)  # health and metrics; 0: any free port; -1: none
    # The timings of membership, leases and progress accept the ranges the simulation draws them
    # from (scheduler_node.sim.world.draw_timings reads these bounds), with the rules between them
    # checked below (_timings_agree). docs/operations.md, "Settings", says both.
    heartbeat_interval_seconds: float = Field(3.0, ge=0.5, le=10)
    heartbeat_ttl_seconds: float = Field(30.0, ge=3, le=60)
    membership_poll_seconds: float = Field(1.0, ge=0.1, le=1)
    lease_seconds: float = Field(5.0, ge=1, le=30)
    done_ttl_seconds: float = Field(60.0, gt=0)
    replication_factor: int = Field(2, ge=1, le=8)
    change_poll_seconds: float = Field(1.0, ge=0.1, le=5)
    load_grace_seconds: float = Field(10.0, ge=0, le=60)
    # Above 0: of a slot's two owners the higher-ranked leads (claims on time); the other holds
    # each occurrence back this long for evidence that the leader claimed it, then claims it itself
    # (scheduler_node.standby). 0 (the default): both claim every occurrence on time. Standings
    # are published (and read) this often; one unchanged for ten times that (at least 3 s) is stale.
    standby_grace_seconds: float = Field(0.0, ge=0)
    standby_publish_seconds: float = Field(0.1, gt=0, le=5)
    max_in_flight: int = Field(1000, ge=1)
    # Deliveries out at once to one receiver (scheme, host and port), each on a keep-alive
    # connection of its own: a burst beyond it waits in the node, in due order, rather than as
    # hundreds of connections in the receiver's accept queue (docs/operations.md).
    http_connections_per_host: int = Field(100, ge=1, le=1024)
    history_flush_seconds: float = Field(0.3, gt=0)
    # Timer passes are at least this far apart under load: each pass's round trips carry that many
    # more executions (at 4,000 fires/s, 0.05 took a sixth off the machine's CPU and added 12 ms to
    # the median lag; docs/performance.md). An occurrence due right after a pass waits for the next.
    timer_tick_seconds: float = Field(0.05, gt=0, le=1)
    history_buffer_max: int = Field(1_000_000, ge=1000)
    # A node keeps a job's payload in memory only while the job's next occurrence is at most this
    # far ahead (and payloads of up to 64 bytes always): the rest is read from PostgreSQL ahead of
    # its time, in batches (scheduler_node.payloads). A PostgreSQL outage shorter than this, less a
    # read-ahead pass (a twentieth of it, 2 to 30 s), does not delay an occurrence; 0 keeps every
    # payload in memory (docs/operations.md, "Settings").
    payload_horizon_seconds: float = Field(600.0, ge=0, le=86400)
    maintain_interval_seconds: float = Field(3600.0, gt=0)
    # The firing core: no namespace holds more than this share of max_in_flight while another
    # waits; how often a node records how far it fired; how long nothing may fire before the
    # first node back treats the gap as an outage of the whole cluster (misfire policies apply).
    namespace_inflight_share: float = Field(0.5, gt=0, le=1)
    progress_seconds: float = Field(2.0, ge=0.5, le=10)
    outage_after_seconds: float = Field(10.0, ge=3, le=600)
    # After Redis lost its data, the recent past is claimed again (checked against history). A node
    # gone before the loss that recorded progress at most this long before it, and less than the
    # recent past, may have made claims from further back that were lost before anyone took them
    # over: the nodes claim again from as far back as its record (longer: more history checks).
    loss_lookback_seconds: float = Field(60.0, gt=0)
    # A delivered row its writer has not recorded by then (it died) is written by a slot owner.
    history_recover_after_seconds: float = Field(30.0, gt=0)

    # Job health and notifications (scheduler_node.watch): whether this process takes part in the
    # watchdog for late occurrences and the notification dispatcher (one process of the API and
    # the nodes runs them at a time, under a PostgreSQL advisory lock), and how often they look.
    watch_enabled: bool = True
    watch_seconds: float = Field(2.0, gt=0, le=60)
    notification_timeout_seconds: float = Field(10.0, gt=0, le=60)
    # Quotas per namespace on calendars (docs/operations.md, "Quotas"): how many a namespace keeps,
    # and how large one may be (dates, ranges and annual dates together; bytes of its document).
    # Every node keeps every calendar: these bound what one namespace costs each node's memory.
    calendars_per_namespace: int = Field(100, ge=0, le=100_000)
    calendar_max_entries: int = Field(10_000, ge=1, le=100_000)
    calendar_max_bytes: int = Field(256 * 1024, ge=1024, le=16 * 1024 * 1024)
    # Notification dispatch (docs/operations.md, "Notifications"): each rule sends at most this
    # many notifications a minute (the rest wait, counted, and go out summarised); each target has
    # at most this many sends in flight, and one that fails or times out backs off alone; sent
    # and abandoned notifications (and quiet summaries) are purged after this many days.
    notification_rule_per_minute: int = Field(60, ge=1, le=100_000)
    notification_target_concurrency: int = Field(4, ge=1, le=64)
    notification_retention_days: int = Field(7, ge=1, le=3650)

    # Quotas per namespace (docs/security.md, "Quotas"): a request past one is refused with 409
    # quota_exceeded naming it, before any expensive work. Backfills: those running at once, the sum
    # of their max_per_second, the bounds of one backfill's max_per_second and of the executions
    # it may deliver; and the rate all backfills of the cluster share (fairly across namespaces).
    quota_jobs_per_namespace: int = Field(1_000_000, ge=1)
    quota_notification_rules_per_namespace: int = Field(100, ge=0, le=100_000)
    # throttle policies: every node reads every policy every few seconds and on every change
    quota_throttles_per_namespace: int = Field(100, ge=0, le=100_000)
    quota_backfills_per_namespace: int = Field(20, ge=0, le=100_000)
    quota_backfill_rate_per_namespace: float = Field(100.0, gt=0, le=1_000_000, allow_inf_nan=False)
    backfill_min_per_second: float = Field(0.1, gt=0, le=1000, allow_inf_nan=False)
    backfill_max_per_second: float = Field(1000.0, gt=0, le=1_000_000, allow_inf_nan=False)
    backfill_max_executions: int = Field(100_000, ge=1, le=10_000_000)
    backfill_cluster_rate: float = Field(1000.0, gt=0, le=1_000_000, allow_inf_nan=False)

    # Tracing: an OTLP/HTTP endpoint (http://collector:4318) nodes export delivery spans to.
    otlp_endpoint: str | None = None

    # History
    history_retention_days: int = Field(45, ge=1)
    partitions_ahead_days: int = Field(7, ge=1, le=60)

    # Logging. trace_jobs: a job id pattern (shell-style, e.g. "billing-*"); every step of the
    # executions of matching jobs (claim, send, close, hand over, take...) is logged, to follow a
    # job through the cluster. Empty (the default): none.
    log_level: str = "INFO"
    trace_jobs: str = Field("", max_length=200)

    # SQS targets and the command queue: the queues jobs may send to (comma-separated queue URL
    # prefixes or ARNs, `*` wildcards, `namespace=` for one namespace; empty: any queue but
    # cronman's own), and the secret the command tokens derive from (commands are signed with
    # them; the previous secret keeps verifying during a rotation).
    sqs_allowlist: str = ""
    command_secret: SecretStr | None = None
    command_secret_previous: SecretStr | None = None

    @field_validator("redis_prefix")
    @classmethod
    def _prefix_nonempty(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty")
        return v

    @field_validator("redis_password", "redis_sentinel_password")
    @classmethod
    def _empty_password_is_none(cls, v: SecretStr | None) -> SecretStr | None:
        return None if v is None or v.get_secret_value() == "" else v

    @model_validator(mode="after")
    def _timings_agree(self) -> Settings:
        """The rules between the timings (the simulation draws them so): a heartbeat outlives a
        missed beat, a node reads the live set at least once a beat, and nodes alive record
        progress often enough that a gap of outage_after_seconds means none was."""
        interval = self.heartbeat_interval_seconds
        if self.heartbeat_ttl_seconds < 2 * interval:
            raise ValueError(
                f"heartbeat_ttl_seconds ({self.heartbeat_ttl_seconds:g}) must be at least twice "
                f"heartbeat_interval_seconds ({interval:g})"
            )
        if self.membership_poll_seconds > interval:
            raise ValueError(
                f"membership_poll_seconds ({self.membership_poll_seconds:g}) must be at most "
                f"heartbeat_interval_seconds ({interval:g})"
            )
        beat = max(self.progress_seconds, interval)
        if self.outage_after_seconds < 2 * beat:
            raise ValueError(
                f"outage_after_seconds ({self.outage_after_seconds:g}) must be at least twice the longer of "
                f"progress_seconds ({self.progress_seconds:g}) and heartbeat_interval_seconds ({interval:g})"
            )
        return self

    @model_validator(mode="after")
    def _redis_topology_reads(self) -> Settings:
        try:
            topology(self)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return self

    @model_validator(mode="after")
    def _backfill_rates_ordered(self) -> Settings:
        if self.backfill_min_per_second > self.backfill_max_per_second:
            raise ValueError("CRONMAN_BACKFILL_MIN_PER_SECOND must not exceed CRONMAN_BACKFILL_MAX_PER_SECOND")
        return self

    @field_validator("api_key")
    @classmethod
    def _api_key_strong(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or v.get_secret_value() == "":
            return None  # an empty variable means no admin key
        if len(v.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (generate one with: openssl rand -base64 32)")
        return v

    @field_validator("callback_allowlist")
    @classmethod
    def _allowlist_parses(cls, v: str) -> str:
        parse_allowlist(v)  # raises ValueError naming the bad entry
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies_parse(cls, v: str) -> str:
        parse_networks(v)  # raises ValueError naming the bad entry
        return v

    @field_validator("sqs_allowlist")
    @classmethod
    def _sqs_allowlist_parses(cls, v: str) -> str:
        parse_queue_allowlist(v)  # raises ValueError naming the bad entry
        return v

    @field_validator("command_secret", "command_secret_previous")
    @classmethod
    def _command_secret_strong(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or v.get_secret_value() == "":
            return None
        if len(v.get_secret_value()) < 32:
            raise ValueError("must be at least 32 characters (generate one with: openssl rand -base64 32)")
        return v

    @cached_property
    def allowlist(self) -> Allowlist:
        return parse_allowlist(self.callback_allowlist)

    @cached_property
    def trusted_networks(self) -> tuple[Network, ...]:
        return parse_networks(self.trusted_proxies)


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus explicit overrides, which win)."""
    return Settings(**overrides)  # type: ignore[arg-type]
