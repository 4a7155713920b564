"""Delivering a callback: HTTP through pooled keep-alive connections (scheduler_node.http), SQS ten
messages at a time with SendMessageBatch (boto3 runs in a small thread pool). Every delivery is a
future whose result is its outcome: failures are outcomes, never exceptions into the timer loop."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from cronman.netguard import CallbackPolicy, parse_allowlist
from scheduler_node.http import Outcome, Pool, Prepared, prepare
from scheduler_node.jobs import HttpCall, SqsSend

log = logging.getLogger("cronman.node.dispatch")

__all__ = ["Delivery", "Dispatcher", "HttpDispatcher", "Outcome", "SqsDispatcher"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one attempt sends: the payload verbatim and the execution metadata."""

    job_id: str
    execution_id: str
    scheduled_for: str  # ISO-8601 UTC
    attempt: int
    body: bytes
    event_index: int = 0
    signature: str | None = None  # Cronman-Signature, when the namespace has a signing secret
    extra: tuple[tuple[str, str], ...] = ()  # e.g. the failure, for a dead-letter message

    def metadata(self) -> dict[str, str]:
        meta = {
            "Cronman-Job-Id": self.job_id,
            "Cronman-Execution-Id": self.execution_id,
            "Cronman-Scheduled-For": self.scheduled_for,
            "Cronman-Attempt": str(self.attempt),
            "Cronman-Event-Index": str(self.event_index),
        }
        if self.signature:
            meta["Cronman-Signature"] = self.signature
        meta.update(self.extra)
        return meta


class HttpDispatcher:
    """Callbacks reach only the addresses :mod:`cronman.netguard` allows (``dev_mode``,
    ``allowlist``: the node's CRONMAN_DEV_MODE and CRONMAN_CALLBACK_ALLOWLIST). A refused address
    is a failed attempt with the reason as its error. Requests go through the lean pooled client
    of :mod:`scheduler_node.http`; the fixed part of each target's request is prepared once."""

    def __init__(self, max_connections: int, *, dev_mode: bool = False, allowlist: str = "") -> None:
        self._per_origin = max(1, min(max_connections, 1024))
        self._policy = CallbackPolicy(dev_mode, parse_allowlist(allowlist))
        self._pool: Pool | None = None
        self._prepared: dict[HttpCall, Prepared] = {}

    async def start(self) -> None:
        self._pool = Pool(self._policy, per_origin=self._per_origin)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def prune(self) -> None:
        if self._pool is not None:
            self._pool.prune()

    def submit(self, call: HttpCall, d: Delivery) -> asyncio.Future[Outcome]:
        assert self._pool is not None
        prepared = self._prepared.get(call)
        if prepared is None:
            if len(self._prepared) > 100_000:
                self._prepared.clear()
            prepared = self._prepared[call] = prepare(call.method, call.url, call.headers)
        head = "".join(f"{k}: {v}\r\n" for k, v in d.metadata().items()).encode("latin-1", "replace")
        return self._pool.request(prepared, head, d.body, call.timeout)

    async def send(self, call: HttpCall, d: Delivery) -> Outcome:
        return await self.submit(call, d)


class SqsDispatcher:
    """Groups deliveries per queue into SendMessageBatch calls of up to ten."""

    def __init__(self, endpoint_url: str | None, region: str, executor: Executor) -> None:
        self._endpoint_url = endpoint_url
        self._region = region
        self._executor = executor
        self._client: Any = None
        self._pending: dict[str, list[tuple[SqsSend, Delivery, asyncio.Future[Outcome]]]] = defaultdict(list)
        self._flush_scheduled = False
        self._tasks: set[asyncio.Future[None]] = set()

    def _sqs(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.session.Session().client(
                "sqs",
                endpoint_url=self._endpoint_url,
                region_name=self._region,
                config=Config(
                    connect_timeout=5,
                    read_timeout=10,
                    retries={"max_attempts": 2, "mode": "standard"},
                    max_pool_connections=20,
                ),
            )
        return self._client

    def submit(self, target: SqsSend, d: Delivery) -> asyncio.Future[Outcome]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        queue = self._pending[target.queue_url]
        queue.append((target, d, fut))
        if len(queue) >= 10:
            self._flush_queue(target.queue_url)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush_all)
        return fut

    async def send(self, target: SqsSend, d: Delivery) -> Outcome:
        return await self.submit(target, d)

    def _flush_all(self) -> None:
        self._flush_scheduled = False
        for queue_url in list(self._pending):
            self._flush_queue(queue_url)

    def _flush_queue(self, queue_url: str) -> None:
        items = self._pending.pop(queue_url, [])
        for i in range(0, len(items), 10):
            task = asyncio.ensure_future(self._send_batch(queue_url, items[i : i + 10]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_batch(self, queue_url: str, items: list[tuple[SqsSend, Delivery, asyncio.Future[Outcome]]]) -> None:
        entries = []
        for i, (target, d, _) in enumerate(items):
            entry: dict[str, Any] = {
                "Id": str(i),
                "MessageBody": d.body.decode(),
                "MessageAttributes": {k: {"DataType": "String", "StringValue": v} for k, v in d.metadata().items()},
            }
            if target.group_id:
                entry["MessageGroupId"] = target.group_id
                entry["MessageDeduplicationId"] = f"{d.execution_id}-{d.attempt}"
            entries.append(entry)
        loop = asyncio.get_running_loop()
        try:
            resp = await loop.run_in_executor(
                self._executor, lambda: self._sqs().send_message_batch(QueueUrl=queue_url, Entries=entries)
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a failed attempt
            error = f"{type(exc).__name__}: {exc}"[:500]
            for _, _, fut in items:
                if not fut.done():
                    fut.set_result(Outcome(False, None, error))
            return
        failed = {f["Id"]: f for f in resp.get("Failed", [])}
        for i, (_, _, fut) in enumerate(items):
            if fut.done():
                continue
            f = failed.get(str(i))
            if f is None:
                fut.set_result(Outcome(True))
            else:
                fut.set_result(Outcome(False, None, f"SQS {f.get('Code')}: {f.get('Message', '')}"[:500]))


class Dispatcher:
    def __init__(self, http: HttpDispatcher, sqs: SqsDispatcher) -> None:
        self.http = http
        self.sqs = sqs

    def submit(self, target: HttpCall | SqsSend, d: Delivery) -> asyncio.Future[Outcome]:
        """Start a delivery; the future's result is its outcome (never an exception)."""
        if isinstance(target, HttpCall):
            return self.http.submit(target, d)
        return self.sqs.submit(target, d)

    async def send(self, target: HttpCall | SqsSend, d: Delivery) -> Outcome:
        return await self.submit(target, d)
