"""Delivering a callback: HTTP through one keep-alive aiohttp session, SQS ten messages at a time
with SendMessageBatch (boto3 runs in a small thread pool). Failures become outcomes, never
exceptions into the timer loop."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import aiohttp

from cronman import __version__
from cronman.guarded_dns import GuardedResolver, literal_refusal
from cronman.netguard import CallbackPolicy, parse_allowlist
from scheduler_node.jobs import HttpCall, SqsSend

log = logging.getLogger("cronman.node.dispatch")

_MAX_BODY_READ = 64 * 1024
_USER_AGENT = f"cronman/{__version__}"


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    http_status: int | None = None
    error: str | None = None


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
    ``allowlist``: the node's CRONMAN_DEV_MODE and CRONMAN_CALLBACK_ALLOWLIST; by default the
    strict rules). A refused address is a failed attempt with the reason as its error."""

    def __init__(self, max_connections: int, *, dev_mode: bool = False, allowlist: str = "") -> None:
        self._max = max_connections
        self._policy = CallbackPolicy(dev_mode, parse_allowlist(allowlist))
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._max,
            limit_per_host=0,
            ttl_dns_cache=60,
            keepalive_timeout=30,
            enable_cleanup_closed=True,
            resolver=GuardedResolver(self._policy),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
            headers={"User-Agent": _USER_AGENT},
        )

    async def close(self) -> None:
        if self._session:
            await self._session.close()

    async def send(self, call: HttpCall, d: Delivery) -> Outcome:
        assert self._session is not None
        refused = literal_refusal(self._policy, call.url)
        if refused:
            return Outcome(False, None, refused[:500])
        headers = dict(call.headers)
        headers.update(d.metadata())
        headers["Content-Type"] = "application/json"
        try:
            async with self._session.request(
                call.method,
                call.url,
                data=d.body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=call.timeout),
                allow_redirects=False,
            ) as resp:
                body = await resp.content.read(_MAX_BODY_READ)
                if not resp.content.at_eof():
                    resp.close()  # do not drain a huge body; drop the connection instead
                if 200 <= resp.status < 300:
                    return Outcome(True, resp.status)
                snippet = body[:200].decode("utf-8", "replace").strip()
                return Outcome(False, resp.status, f"HTTP {resp.status}" + (f": {snippet}" if snippet else ""))
        except TimeoutError:
            return Outcome(False, None, f"timed out after {call.timeout:g}s")
        except aiohttp.ClientError as exc:
            return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])
        except (OSError, ValueError) as exc:
            return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])


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

    async def send(self, target: SqsSend, d: Delivery) -> Outcome:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        queue = self._pending[target.queue_url]
        queue.append((target, d, fut))
        if len(queue) >= 10:
            self._flush_queue(target.queue_url)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush_all)
        return await fut

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

    async def send(self, target: HttpCall | SqsSend, d: Delivery) -> Outcome:
        if isinstance(target, HttpCall):
            return await self.http.send(target, d)
        return await self.sqs.send(target, d)
