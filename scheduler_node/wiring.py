"""The production parts of a node: Redis for claims, membership, throttles and change
notifications; PostgreSQL for jobs, history and progress; a sender of each target kind; the command
queue consumer and partition upkeep as extra loops.

Redis is whatever ``CRONMAN_REDIS_MODE`` names (cronman.redis.redisconn): a single server, a Redis
Cluster or a Sentinel-managed primary. Every key carries a hash tag (cronman.redis.keys), so each script
call runs on one shard; on a cluster the claims are batched per tag (``sharded``). PostgreSQL may be
a libpq host list with ``target_session_attrs=read-write``: after a failover the pool reconnects to
whichever host accepts writes, without a restart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from sqlalchemy import Engine

from cronman.errors import ConfigError
from cronman.model.changes import Stop
from cronman.model.changes import encode as encode_changes
from cronman.redis.keys import LAYOUT_VERSION, Keys
from cronman.redis.redisconn import RedisMode, async_client
from cronman.store.partitions import run_maintenance
from cronman.store.store import make_engine
from scheduler_node.claims import RedisClaims
from scheduler_node.membership import RedisMembership
from scheduler_node.node import NodeParts, make_executor
from scheduler_node.senders import make_senders
from scheduler_node.store import PgNodeStore
from scheduler_node.throttle import ThrottleGate

if TYPE_CHECKING:
    from scheduler_node.node import Node
    from scheduler_node.watch import Watch

log = logging.getLogger("cronman.node")


async def production_parts(node: Node) -> NodeParts:
    s = node.s
    keys = Keys(s.redis_prefix)
    client = async_client(s, timeout=5.0)
    sharded = RedisMode(s.redis_mode) is RedisMode.CLUSTER
    await _check_layout(client, keys)
    engine = make_engine(s.database_url, pool_size=4, max_overflow=4)
    executor = make_executor()
    store = PgNodeStore(engine, executor)
    claims = RedisClaims(client, keys, node.holder, int(s.done_ttl_seconds * 1000), sharded=sharded)
    senders = make_senders(s, executor, connections_per_host=s.http_connections_per_host)
    throttle = ThrottleGate(client, keys, node.lease_ms)
    membership = RedisMembership(client, keys, node.node_id, s.heartbeat_ttl_seconds)
    store.on_paused = _pause_announcer(node, client, keys)

    loops: list[Callable[[], Coroutine[Any, Any, None]]] = [lambda: _maintenance(node, client, keys, engine, executor)]
    if s.watch_enabled:  # the watchdog and notifications, led by one process at a time
        loops.append(_watch(node, engine, executor).run)
    if s.command_queue_url:  # job commands arriving through SQS (scheduler_node.commands)
        from scheduler_node.commands import CommandConsumer

        consumer = CommandConsumer(s, engine, executor, lambda message: client.publish(keys.changes_channel, message))
        loops.append(consumer.run)

    async def notifications(changed: Callable[[bytes], None]) -> None:
        await _follow_changes(client, keys, sharded, changed)

    async def close() -> None:
        await client.aclose()
        executor.shutdown(wait=False, cancel_futures=True)
        engine.dispose()

    return NodeParts(
        claims=claims,
        membership=membership,
        store=store,
        senders=senders,
        executor=executor,
        throttle=throttle,
        notifications=notifications,
        extra_loops=loops,
        close=close,
    )


async def _follow_changes(client: Any, keys: Keys, sharded: bool, changed: Callable[[bytes], None]) -> None:
    """Redis pub/sub tells of changes at once (cronman.model.changes); polling alone bounds the delay."""
    failures = 0
    while True:
        pubsub = None
        try:
            pubsub = await _subscriber(client, sharded, failures)
            await pubsub.subscribe(keys.changes_channel)
            changed(b"")  # whatever was published while unsubscribed
            while True:
                msg = await pubsub.get_message(timeout=1.0)
                if msg is not None:
                    data = msg.get("data")
                    changed(data if isinstance(data, bytes) else b"")
        except (RedisError, OSError) as exc:
            failures += 1
            log.debug("change notifications unavailable: %s", exc)
            await asyncio.sleep(1.0)
        finally:
            try:
                if pubsub is not None:
                    await pubsub.aclose()
            except (RedisError, OSError):
                pass


async def _maintenance(node: Node, client: Any, keys: Keys, engine: Engine, executor: Executor) -> None:
    """Partition upkeep, run by one node at a time under a Redis lease."""
    s = node.s
    await asyncio.sleep(1.0)
    while True:
        try:
            lease = int(s.maintain_interval_seconds * 900)
            if await client.set(keys.maintenance_lock, node.holder, nx=True, px=lease):
                today = datetime.now(UTC).date()
                report = await asyncio.get_running_loop().run_in_executor(
                    executor,
                    run_maintenance,
                    engine,
                    today,
                    s.history_retention_days,
                    s.partitions_ahead_days,
                    s.notification_retention_days,
                )
                log.info(
                    "maintenance done",
                    extra={"partitions_created": report.created, "partitions_dropped": report.dropped},
                )
        except Exception as exc:  # noqa: BLE001 - try again next time
            log.warning("maintenance failed: %s", exc)
        await asyncio.sleep(s.maintain_interval_seconds)


def _pause_announcer(node: Node, client: Any, keys: Keys) -> Callable[[list[Stop]], None]:
    """What the store calls, in the history writer's thread, with the jobs its history write paused
    (auto-pause) once it has committed: stopped here at once, and told to the other nodes (the
    slot's other owner among them)."""
    loop = asyncio.get_running_loop()
    publishing: set[asyncio.Task[None]] = set()

    async def publish(message: bytes) -> None:
        try:
            await client.publish(keys.changes_channel, message)
        except (RedisError, OSError) as exc:  # the other nodes read the feed anyway
            log.warning("could not publish a change notification: %s", exc)

    def auto_paused(stops: list[Stop]) -> None:
        node.stops_heard(stops)
        task = loop.create_task(publish(encode_changes(stops)))
        publishing.add(task)
        task.add_done_callback(publishing.discard)

    def paused_by_write(stops: list[Stop]) -> None:  # (in the history writer's thread)
        try:
            loop.call_soon_threadsafe(auto_paused, stops)
        except RuntimeError:  # the loop has closed: the node has stopped
            pass

    return paused_by_write


def _watch(node: Node, engine: Engine, executor: Executor) -> Watch:
    """The watchdog for late occurrences and the notification dispatcher, counted in the node's metrics."""
    from scheduler_node.watch import Watch, watch_senders

    m = node.metrics
    return Watch(
        node.s,
        engine,
        executor,
        watch_senders(node.s, executor),
        holder=node.holder,
        on_late=m.occurrences_late.inc,
        on_deadline_missed=m.deadlines_missed.inc,
        on_sent=lambda result: m.notifications.labels(result).inc(),
    )


async def _subscriber(client: Any, sharded: bool, failures: int) -> Any:
    """A pub/sub connection. On a Redis Cluster a PUBLISH reaches every node, replicas included, so
    any node will do: after each failure the next one in the client's list is tried, which gets
    past a dead primary before the client's view of the cluster is refreshed."""
    if not sharded:
        return client.pubsub(ignore_subscribe_messages=True)
    await client.initialize()
    nodes = client.get_nodes()
    return client.pubsub(node=nodes[failures % len(nodes)], ignore_subscribe_messages=True)


async def _check_layout(client: Any, keys: Keys) -> None:
    """Refuse to run beside nodes of another key layout (they would not see each other's claims)."""
    try:
        await client.set(keys.layout, LAYOUT_VERSION, nx=True)
        found = await client.get(keys.layout)
    except (RedisError, OSError) as exc:
        log.warning("could not check the Redis key layout: %s", exc)
        return
    found = found.decode() if isinstance(found, bytes) else found
    if found != LAYOUT_VERSION:
        raise ConfigError(
            f"Redis at this prefix holds key layout {found!r}, this node uses {LAYOUT_VERSION!r}: stop every node "
            "of the other version first (docs/operations.md, upgrades)"
        )
