"""The command queue consumer: job commands arriving on SQS (CRONMAN_COMMAND_QUEUE_URL), applied by
the scheduler nodes (see :mod:`cronman.store.commands` for the format and the rules).

Each pass long-polls for up to ten messages, authenticates each (its ``Cronman-Command-Key`` and
``Cronman-Command-Signature`` attributes: signed with the command token of a live API key, derived
from CRONMAN_COMMAND_SECRET; the command acts in that key's namespace), applies it in its own
transaction (recorded in the ``commands`` table, so a message delivered twice is applied once),
sends the ones that must be rejected to the dead-letter queue (CRONMAN_COMMAND_DLQ_URL) with the
reason in the ``Cronman-Error`` attribute, and deletes what it has dealt with. Without
CRONMAN_COMMAND_SECRET the queue is not read at all: its messages wait there until it is set. A
message that meets a fault that may pass (the database is down) is left on the queue, to come back
after its visibility timeout.
boto3 and the database are blocking: every call runs in the node's thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from sqlalchemy import Engine

from cronman.model.changes import Stop
from cronman.model.changes import encode as encode_changes
from cronman.settings import Settings
from cronman.store.commands import Outcome, run_command

log = logging.getLogger("cronman.node.commands")

WAIT_SECONDS = 5  # long poll; also bounds how long a stopping node waits for a poll in flight
MAX_MESSAGES = 10
ERROR_ATTRIBUTE = "Cronman-Error"
_MAX_ATTRIBUTE = 1000


class CommandConsumer:
    def __init__(
        self, settings: Settings, engine: Engine, executor: Executor, notify: Callable[[bytes], Awaitable[Any]]
    ) -> None:
        """``notify``: publishes a change notification (cronman.model.changes), after commands were
        applied, naming the jobs they paused or deleted so that every node stops them at once."""
        import boto3
        from botocore.config import Config

        if not settings.command_queue_url:
            raise ValueError("CRONMAN_COMMAND_QUEUE_URL is not set")
        self.settings = settings
        self.engine = engine
        self.executor = executor
        self.notify = notify
        self.queue_url = settings.command_queue_url
        self.dlq_url = settings.command_dlq_url
        self.client = boto3.session.Session().client(
            "sqs",
            endpoint_url=settings.sqs_endpoint_url,
            region_name=settings.sqs_region,
            config=Config(
                connect_timeout=5, read_timeout=WAIT_SECONDS + 10, retries={"max_attempts": 2, "mode": "standard"}
            ),
        )

    async def run(self) -> None:
        """Poll until cancelled; faults are logged and retried with a growing pause."""
        if not self.settings.command_secret:
            log.error(
                "CRONMAN_COMMAND_QUEUE_URL is set but CRONMAN_COMMAND_SECRET is not: no command can be "
                "authenticated, so the command queue is not read (its messages wait there)"
            )
            return
        failures = 0
        while True:
            try:
                await self.poll_once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - SQS or the database unreachable: try again
                failures += 1
                log.warning("command queue poll failed: %s", exc, extra={"failures": failures})
                await asyncio.sleep(min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue

    async def poll_once(self) -> int:
        """One receive and what follows (a change notification when commands were applied);
        returns how many commands were applied."""
        loop = asyncio.get_running_loop()
        messages = await loop.run_in_executor(self.executor, self._receive)
        if not messages:
            return 0
        applied, stops = await loop.run_in_executor(self.executor, self._handle, messages)
        if applied:
            try:
                await self.notify(encode_changes(stops))
            except Exception as exc:  # noqa: BLE001 - nodes poll for changes anyway
                log.debug("could not publish a change notification: %s", exc)
        return applied

    # -- in the thread pool ------------------------------------------------------------------
    def _receive(self) -> list[dict[str, Any]]:
        resp = self.client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=MAX_MESSAGES,
            WaitTimeSeconds=WAIT_SECONDS,
            MessageAttributeNames=["All"],
        )
        return list(resp.get("Messages", []))

    def _handle(self, messages: list[dict[str, Any]]) -> tuple[int, list[Stop]]:
        applied = 0
        stops: list[Stop] = []
        done: list[dict[str, str]] = []
        for m in messages:
            try:
                now_ms = int(time.time() * 1000)
                outcome = run_command(self.engine, self.settings, m.get("Body", ""), _attributes(m), now_ms)
                if outcome.dead_letter:
                    self._dead_letter(m, outcome)
            except Exception as exc:  # noqa: BLE001 - left on the queue; it comes back
                log.warning("could not apply a queued command: %s", exc, extra={"message_id": m.get("MessageId")})
                continue
            self._log(outcome, m)
            applied += outcome.status == "applied"
            stops.extend(outcome.stops)
            done.append({"Id": str(len(done)), "ReceiptHandle": m["ReceiptHandle"]})
        if done:
            resp = self.client.delete_message_batch(QueueUrl=self.queue_url, Entries=done)
            for f in resp.get("Failed", []):
                log.warning("could not delete a handled command message: %s", f.get("Message"))
        return applied, stops

    def _dead_letter(self, m: dict[str, Any], outcome: Outcome) -> None:
        if not self.dlq_url:
            log.warning(
                "rejected a queued command and no dead-letter queue is set (CRONMAN_COMMAND_DLQ_URL): dropping it",
                extra={"command_id": outcome.command_id, "error": outcome.error},
            )
            return
        reason = (outcome.error or "rejected")[:_MAX_ATTRIBUTE]
        extra = {}
        if self.dlq_url.endswith(".fifo"):
            extra = {"MessageGroupId": "cronman-commands", "MessageDeduplicationId": m["MessageId"]}
        self.client.send_message(
            QueueUrl=self.dlq_url,
            MessageBody=m.get("Body") or "(empty)",
            MessageAttributes={ERROR_ATTRIBUTE: {"DataType": "String", "StringValue": reason}},
            **extra,
        )

    @staticmethod
    def _log(outcome: Outcome, m: dict[str, Any]) -> None:
        fields = {"command_id": outcome.command_id, "message_id": m.get("MessageId"), "status": outcome.status}
        if outcome.status == "rejected":
            log.warning("queued command rejected: %s", outcome.error, extra=fields)
        else:
            log.info("queued command %s", outcome.status, extra=fields)


def _attributes(m: dict[str, Any]) -> dict[str, str]:
    """A message's string attributes (the signature travels in them)."""
    return {
        name: str(value["StringValue"])
        for name, value in (m.get("MessageAttributes") or {}).items()
        if isinstance(value, dict) and isinstance(value.get("StringValue"), str)
    }
