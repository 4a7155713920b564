"""The production parts of a node: Redis for claims, membership, throttles and change
notifications; PostgreSQL for jobs, history and progress; HTTP and SQS senders; the command
queue consumer and partition upkeep as extra loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cronman.errors import ConfigError
from cronman.keys import LAYOUT_VERSION, Keys
from cronman.partitions import run_maintenance
from cronman.store import make_engine
from scheduler_node.claims import RedisClaims
from scheduler_node.membership import RedisMembership
from scheduler_node.node import NodeParts, make_executor
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender
from scheduler_node.senders.sqs import SqsSender
from scheduler_node.store import PgNodeStore
from scheduler_node.throttle import ThrottleGate

if TYPE_CHECKING:
    from scheduler_node.node import Node

log = logging.getLogger("cronman.node")


def _queue_refusal(settings: Any) -> Callable[[str, str], str | None]:
    """Queues a job may not target: cronman's own (commands and their dead letters) always, and
    what the deployment's allow-list leaves out."""
    try:
        from cronman.queues import queue_refusal
    except ImportError:  # pragma: no cover - older core
        own = {u.rstrip("/") for u in (settings.command_queue_url, settings.command_dlq_url) if u}
        return lambda url, ns: "cronman's own queue" if url.rstrip("/") in own else None
    return lambda url, ns: queue_refusal(url, ns, settings)


async def production_parts(node: Node) -> NodeParts:
    s = node.s
    keys = Keys(s.redis_prefix)
    client = aioredis.from_url(s.redis_url, socket_timeout=5, socket_connect_timeout=5)
    await _check_layout(client, keys)
    engine = make_engine(s.database_url, pool_size=4, max_overflow=4)
    executor = make_executor()
    store = PgNodeStore(engine, executor)
    claims = RedisClaims(client, keys, node.holder, int(s.done_ttl_seconds * 1000))
    senders = Senders(
        [
            HttpSender(s.max_in_flight, dev_mode=s.dev_mode, allowlist=s.callback_allowlist),
            SqsSender(s.sqs_endpoint_url, s.sqs_region, executor, _queue_refusal(s)),
        ]
    )
    throttle = ThrottleGate(client, keys, node.lease_ms)
    membership = RedisMembership(client, keys, node.node_id, s.heartbeat_ttl_seconds)

    async def notifications(changed: Callable[[], None]) -> None:
        """Redis pub/sub wakes the change feed at once; polling alone bounds the delay."""
        while True:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(keys.changes_channel)
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None:
                        changed()
            except (RedisError, OSError) as exc:
                log.debug("change notifications unavailable: %s", exc)
                await asyncio.sleep(1.0)
            finally:
                try:
                    await pubsub.aclose()
                except (RedisError, OSError):
                    pass

    async def maintenance() -> None:
        """Partition upkeep, run by one node at a time under a Redis lease."""
        await asyncio.sleep(1.0)
        while True:
            try:
                lease = int(s.maintain_interval_seconds * 900)
                if await client.set(keys.maintenance_lock, node.holder, nx=True, px=lease):
                    today = datetime.now(UTC).date()
                    report = await asyncio.get_running_loop().run_in_executor(
                        executor, run_maintenance, engine, today, s.history_retention_days, s.partitions_ahead_days
                    )
                    log.info(
                        "maintenance done",
                        extra={"partitions_created": report.created, "partitions_dropped": report.dropped},
                    )
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("maintenance failed: %s", exc)
            await asyncio.sleep(s.maintain_interval_seconds)

    loops = [maintenance]
    if s.watch_enabled:  # the watchdog and notifications, led by one process at a time
        from scheduler_node.watch import Watch, watch_senders

        m = node.metrics
        watch = Watch(
            s,
            engine,
            executor,
            watch_senders(s, executor),
            holder=node.holder,
            on_late=m.occurrences_late.inc,
            on_sent=lambda result: m.notifications.labels(result).inc(),
        )
        loops.append(watch.run)
    if s.command_queue_url:  # job commands arriving through SQS (scheduler_node.commands)
        from scheduler_node.commands import CommandConsumer

        consumer = CommandConsumer(s, engine, executor, lambda: client.publish(keys.changes_channel, b""))
        loops.append(consumer.run)

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
