"""One way to connect to Redis, whatever its topology: a single server, a Redis Cluster, or a
master managed by Sentinel (``CRONMAN_REDIS_MODE``).

- ``standalone``: ``CRONMAN_REDIS_URL`` is one URL (``redis://`` or ``rediss://`` for TLS).
- ``cluster``: ``CRONMAN_REDIS_URL`` is one or more comma-separated seed URLs; the client
  discovers the rest. Credentials and TLS options come from the first URL. No database number.
- ``sentinel``: ``CRONMAN_REDIS_SENTINELS`` (``host:port,...``) and
  ``CRONMAN_REDIS_SENTINEL_MASTER`` name the master; ``CRONMAN_REDIS_URL`` carries the master's
  scheme, credentials, database and TLS options (its host is not used), and
  ``CRONMAN_REDIS_SENTINEL_PASSWORD`` the sentinels' own password. The sentinels are spoken to
  with TLS when the URL is ``rediss://``.

``CRONMAN_REDIS_PASSWORD``, when set, is the data nodes' password in every mode, instead of any in
the URL (so it can come from a Secret of its own).

Every client gets socket and connect timeouts, and retries a command that met a connection error
or a timeout a few times with jittered exponential backoff: long enough to ride over a dropped
connection or a topology refresh, short enough that a caller's loop is not stalled by a failover
in progress (it retries on its next round).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import urlsplit

import hiredis
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.retry
import redis.sentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import SSLConnection, parse_url

from cronman.errors import ConfigError

if TYPE_CHECKING:
    from cronman.settings import Settings

SyncRedis: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"

DEFAULT_SENTINEL_PORT = 26379
RETRIES = 4
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 1.0
_RETRY_ON = (redis.ConnectionError, redis.TimeoutError)


def _pack_command(self: Any, *args: Any) -> list[bytes]:
    """A command in the Redis protocol, packed by hiredis (in C). redis-py's synchronous
    connections pack this way already; its asyncio connections pack every argument in Python,
    which was an eighth of a node's time on the firing path (a script call carries several
    arguments per execution). Same bytes, about eight times faster."""
    first = args[0]
    if isinstance(first, str | bytes) and (" " in first if isinstance(first, str) else b" " in first):
        args = (*first.split(), *args[1:])  # "CONFIG GET": words of the command sent apart
    try:
        return [hiredis.pack_command(args)]
    except TypeError as exc:  # None, say: what redis-py's own packer says of it
        raise redis.DataError(f"invalid argument in a Redis command: {exc}") from exc


def _pack_commands(self: Any, commands: Any) -> list[bytes]:
    return [b"".join(_pack_command(self, *cmd)[0] for cmd in commands)]


redis.asyncio.connection.AbstractConnection.pack_command = _pack_command  # type: ignore[method-assign]
redis.asyncio.connection.AbstractConnection.pack_commands = _pack_commands  # type: ignore[method-assign]


class RedisMode(StrEnum):
    STANDALONE = "standalone"
    CLUSTER = "cluster"
    SENTINEL = "sentinel"


@dataclass(frozen=True, slots=True)
class RedisTopology:
    """Where Redis is and how to speak to it; built from the settings, no I/O."""

    mode: RedisMode
    # standalone: the server; cluster: the seeds; sentinel: the sentinels
    addresses: tuple[tuple[str, int], ...]
    # username, password, db, ssl and ssl_* options, and any other URL query options
    options: Mapping[str, Any] = field(default_factory=dict)
    master: str | None = None
    sentinel_password: str | None = None

    def describe(self) -> str:
        """For logs and errors: no credentials."""
        where = ",".join(f"{h}:{p}" for h, p in self.addresses)
        tls = " tls" if self.options.get("ssl") else ""
        master = f" master={self.master}" if self.master else ""
        return f"redis {self.mode.value}{tls} {where}{master}"


def shown(url: str) -> str:
    """A Redis URL as errors may show it: no credentials, no query (it may hold a password)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "<unreadable URL>"
    netloc = ("***@" if "@" in parts.netloc else "") + parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{netloc}{parts.path}" + ("?***" if parts.query else "")


def _url_options(url: str) -> tuple[dict[str, Any], tuple[str, int] | None]:
    try:
        parsed = parse_url(url.strip())
    except ValueError as exc:
        raise ConfigError(f"CRONMAN_REDIS_URL: {exc}", field="redis_url") from None
    if parsed.get("connection_class") is not None and parsed["connection_class"] is not SSLConnection:
        raise ConfigError("CRONMAN_REDIS_URL: only redis:// and rediss:// URLs are supported", field="redis_url")
    ssl = parsed.pop("connection_class", None) is SSLConnection
    host, port = parsed.pop("host", None), parsed.pop("port", None)
    options = {**parsed, "ssl": ssl}
    return options, ((host, int(port or 6379)) if host else None)


def _address(entry: str, default_port: int, what: str) -> tuple[str, int]:
    entry = entry.strip()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = entry.partition(":")
    if not host or (port and not port.isdigit()):
        raise ConfigError(f"{what}: {entry!r} is not host:port")
    return host, int(port) if port else default_port


def topology(settings: Settings) -> RedisTopology:
    """Read the Redis settings; raises :class:`ConfigError` naming the setting that is wrong."""
    mode = RedisMode(settings.redis_mode)
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    urls = [u for u in settings.redis_url.split(",") if u.strip()]
    if not urls:
        raise ConfigError("CRONMAN_REDIS_URL is empty", field="redis_url")
    options, first = _url_options(urls[0])
    if password:
        options["password"] = password
    if mode is RedisMode.STANDALONE:
        if len(urls) > 1:
            raise ConfigError(
                "CRONMAN_REDIS_URL holds several URLs; set CRONMAN_REDIS_MODE=cluster for a Redis Cluster",
                field="redis_url",
            )
        if first is None:
            raise ConfigError("CRONMAN_REDIS_URL names no host", field="redis_url")
        return RedisTopology(mode, (first,), options)
    if mode is RedisMode.CLUSTER:
        seeds: list[tuple[str, int]] = []
        for n, url in enumerate(urls, 1):
            more, address = _url_options(url)
            if more["ssl"] != options["ssl"]:
                raise ConfigError("CRONMAN_REDIS_URL: the seeds mix redis:// and rediss://", field="redis_url")
            if address is None:
                raise ConfigError(f"CRONMAN_REDIS_URL: seed {n} ({shown(url)}) names no host", field="redis_url")
            seeds.append(address)
        if options.pop("db", 0):
            raise ConfigError("CRONMAN_REDIS_URL: a Redis Cluster has only database 0", field="redis_url")
        return RedisTopology(mode, tuple(seeds), options)
    sentinels = tuple(
        _address(e, DEFAULT_SENTINEL_PORT, "CRONMAN_REDIS_SENTINELS")
        for e in settings.redis_sentinels.split(",")
        if e.strip()
    )
    if not sentinels:
        raise ConfigError("CRONMAN_REDIS_SENTINELS names no sentinel (host:port,...)", field="redis_sentinels")
    if not settings.redis_sentinel_master:
        raise ConfigError("CRONMAN_REDIS_SENTINEL_MASTER is empty", field="redis_sentinel_master")
    sentinel_password = settings.redis_sentinel_password
    return RedisTopology(
        mode,
        sentinels,
        options,
        master=settings.redis_sentinel_master,
        sentinel_password=sentinel_password.get_secret_value() if sentinel_password else None,
    )


# ---- clients ----


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(cap=BACKOFF_CAP_SECONDS, base=BACKOFF_BASE_SECONDS)


def _connection_kwargs(t: RedisTopology, timeout: float, connect_timeout: float | None) -> dict[str, Any]:
    """Timeouts first, so that a query option in the URL (``?socket_timeout=``) wins, as in redis-py."""
    conn = {
        "socket_timeout": timeout,
        "socket_connect_timeout": connect_timeout if connect_timeout is not None else timeout,
        "socket_keepalive": True,
        **t.options,
    }
    if not conn.get("ssl"):  # plain connections refuse ssl_* arguments
        conn = {k: v for k, v in conn.items() if not k.startswith("ssl")}
    return conn


def _sentinel_kwargs(t: RedisTopology, conn: Mapping[str, Any], retry: Any) -> dict[str, Any]:
    """How to speak to the sentinels themselves: their password, the same timeouts and TLS, and one
    attempt each (an unanswered sentinel is skipped for the next; the master's client retries the
    whole discovery)."""
    keep = ("socket_timeout", "socket_connect_timeout", "socket_keepalive", "ssl")
    out = {k: v for k, v in conn.items() if k in keep or k.startswith("ssl_")}
    out["retry"] = retry
    if t.sentinel_password:
        out["password"] = t.sentinel_password
    return out


def async_client(
    settings: Settings,
    *,
    timeout: float = 5.0,
    connect_timeout: float | None = None,
    decode_responses: bool = False,
    retries: int = RETRIES,
) -> AsyncRedis:
    """A ``redis.asyncio`` client for the configured topology (connects on first use)."""
    t = topology(settings)
    conn = _connection_kwargs(t, timeout, connect_timeout)
    conn["decode_responses"] = decode_responses
    retry = redis.asyncio.retry.Retry(_backoff(), retries, supported_errors=_RETRY_ON)
    if t.mode is RedisMode.CLUSTER:
        nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in t.addresses]
        return redis.asyncio.cluster.RedisCluster(startup_nodes=nodes, retry=retry, **conn)
    if t.mode is RedisMode.SENTINEL:
        once = redis.asyncio.retry.Retry(_backoff(), 0)
        sentinel = redis.asyncio.sentinel.Sentinel(list(t.addresses), sentinel_kwargs=_sentinel_kwargs(t, conn, once))
        master = cast(str, t.master)
        return sentinel.master_for(master, retry=retry, retry_on_error=list(_RETRY_ON), **conn)
    host, port = t.addresses[0]
    return redis.asyncio.Redis(host=host, port=port, retry=retry, retry_on_error=list(_RETRY_ON), **conn)


def sync_client(
    settings: Settings,
    *,
    timeout: float = 2.0,
    connect_timeout: float | None = None,
    decode_responses: bool = False,
    retries: int = RETRIES,
) -> SyncRedis:
    """A blocking client for the configured topology (connects on first use)."""
    t = topology(settings)
    conn = _connection_kwargs(t, timeout, connect_timeout)
    conn["decode_responses"] = decode_responses
    retry = redis.retry.Retry(_backoff(), retries, supported_errors=_RETRY_ON)
    if t.mode is RedisMode.CLUSTER:
        nodes = [redis.cluster.ClusterNode(h, p) for h, p in t.addresses]

        def build() -> redis.cluster.RedisCluster:
            return redis.cluster.RedisCluster(startup_nodes=nodes, retry=retry, **conn)

        return cast(redis.cluster.RedisCluster, _LazyCluster(build, t.describe()))
    if t.mode is RedisMode.SENTINEL:
        once = redis.retry.Retry(_backoff(), 0)
        sentinel = redis.sentinel.Sentinel(list(t.addresses), sentinel_kwargs=_sentinel_kwargs(t, conn, once))
        master = cast(str, t.master)
        return sentinel.master_for(master, retry=retry, retry_on_error=list(_RETRY_ON), **conn)
    host, port = t.addresses[0]
    return redis.Redis(host=host, port=port, retry=retry, retry_on_error=list(_RETRY_ON), **conn)


class _LazyCluster:
    """A blocking RedisCluster built on first use. redis-py's discovers the cluster in its
    constructor; built eagerly, a process could not start while Redis is away, unlike with the
    standalone and Sentinel clients. A failed discovery raises ``redis.ConnectionError`` and is
    tried again on the next use."""

    def __init__(self, build: Callable[[], redis.cluster.RedisCluster], where: str) -> None:
        self._build = build
        self._where = where
        self._client: redis.cluster.RedisCluster | None = None
        self._lock = threading.Lock()

    def _get(self) -> redis.cluster.RedisCluster:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    try:
                        self._client = self._build()
                    except redis.exceptions.RedisClusterException as exc:
                        raise redis.ConnectionError(f"cannot discover the cluster ({self._where}): {exc}") from exc
                client = self._client
        return client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
