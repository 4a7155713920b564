"""SQS deliveries: grouped per queue into SendMessageBatch calls of up to ten; boto3 runs in the
node's small thread pool. A queue the deployment does not allow (cronman's own queues above all)
is a failed attempt, whatever the job says.

A FIFO queue's deduplication id is the execution id, the same for every attempt: when an attempt
counted as failed (a timeout, a lost answer) had in fact reached the queue, SQS drops the retry
that follows within its five-minute deduplication window. When the attempt truly failed, the queue
has nothing under that id and takes the retry. A retry later than five minutes after a message
that did arrive is a second message, which the receiver deduplicates on Cronman-Execution-Id."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from scheduler_node.parts import Delivery, Outcome, Sender
from scheduler_node.senders import SenderSetup, queue_guard, sender_for


@dataclass(frozen=True, slots=True)
class SqsSend:
    queue_url: str
    group_id: str | None
    timeout: float = 15.0
    kind: str = "sqs"


_Item = tuple[SqsSend, Delivery, asyncio.Future[Outcome]]


class SqsSender(Sender):
    kind = "sqs"

    def __init__(
        self,
        endpoint_url: str | None,
        region: str,
        executor: Executor,
        refusal: Callable[[str, str], str | None] = lambda queue_url, namespace: None,
    ) -> None:
        self._endpoint_url = endpoint_url
        self._region = region
        self._executor = executor
        self._refusal = refusal  # (queue url, namespace) -> why it is refused, or None
        self._client: Any = None
        self._pending: dict[str, list[_Item]] = defaultdict(list)
        self._flush_scheduled = False
        self._tasks: set[asyncio.Future[None]] = set()

    def decode(self, doc: dict[str, Any]) -> SqsSend:
        return SqsSend(doc["queue_url"], doc.get("message_group_id"))

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

    def submit(self, target: SqsSend, delivery: Delivery) -> asyncio.Future[Outcome]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        refused = self._refusal(target.queue_url, delivery.namespace)
        if refused:
            fut.set_result(Outcome(False, None, f"queue refused: {refused}"))
            return fut
        queue = self._pending[target.queue_url]
        queue.append((target, delivery, fut))
        if len(queue) >= 10:
            self._flush_queue(target.queue_url)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush_all)
        return fut

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

    async def _send_batch(self, queue_url: str, items: list[_Item]) -> None:
        entries = []
        for i, (target, d, _) in enumerate(items):
            entry: dict[str, Any] = {
                "Id": str(i),
                "MessageBody": d.body.decode("utf-8", "replace"),
                "MessageAttributes": {k: {"DataType": "String", "StringValue": v} for k, v in d.metadata().items()},
            }
            if target.group_id:
                entry["MessageGroupId"] = target.group_id
                entry["MessageDeduplicationId"] = d.execution_id
            entries.append(entry)
        loop = asyncio.get_running_loop()
        try:
            call = loop.run_in_executor(
                self._executor, lambda: self._sqs().send_message_batch(QueueUrl=queue_url, Entries=entries)
            )
            resp = await asyncio.wait_for(call, timeout=max(t.timeout for t, _, _ in items))
        except Exception as exc:  # noqa: BLE001 - every failure (botocore's many kinds) is a failed attempt
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


@sender_for(SqsSender.kind)
def make_sqs_sender(setup: SenderSetup) -> SqsSender:
    s = setup.settings
    return SqsSender(s.sqs_endpoint_url, s.sqs_region, setup.executor, queue_guard(s))
