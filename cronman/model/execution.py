"""Executions: stable ids, statuses and retry backoff (pure functions)."""

from __future__ import annotations

import enum
import hashlib
import uuid

_NAMESPACE = uuid.UUID("5f0c6f1e-9a43-4c53-9a39-6f1f3c2d7a10")
_NS_BYTES = _NAMESPACE.bytes
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}  # RFC 4122 variant bits


class Status(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PERMANENTLY_FAILED = "permanently_failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"  # no attempt: the job was deleted or paused first


class Trigger(enum.StrEnum):
    SCHEDULE = "schedule"
    MANUAL = "manual"
    AFTER = "after"  # an ``after`` job's execution, once its upstreams succeeded


# The status an execution of asynchronous work has between its acceptance and its reported end
# (not a history row's: its row is written when the work ends).
RUNNING = "running"
# A skip an upstream caused starts with this (a skipped execution of a job that waits for others):
# it is passed on to the job's own downstreams.
UPSTREAM_REASON = "upstream "
COMPLETION_TOKEN_HEADER = "Cronman-Completion-Token"
UPSTREAMS_HEADER = "Cronman-Upstream-Execution-Ids"


BACKFILL = "backfill:"  # a backfill's executions carry the trigger "backfill:<backfill id>"


def backfill_trigger(backfill_id: str) -> str:
    return BACKFILL + backfill_id


def backfill_of(trigger: str) -> str | None:
    """The backfill id of an execution's trigger, or None when it is not a backfill's."""
    return trigger[len(BACKFILL) :] if trigger.startswith(BACKFILL) else None


def execution_id(job_id: str, scheduled_ms: int, event_index: int = 0, trigger: str = Trigger.SCHEDULE) -> str:
    """The id of one occurrence: the same on every node, attempt, takeover and redelivery.

    A UUID version 5 of (job id, scheduled time, event index, trigger), computed directly (it is on
    the firing path): the same value as ``uuid.uuid5``."""
    h = hashlib.sha1(_NS_BYTES + f"{job_id}\x00{scheduled_ms}\x00{event_index}\x00{trigger}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


def backoff_ms(attempt: int, base_seconds: float, max_seconds: float, fraction: float = 1.0) -> int:
    """Delay before attempt ``attempt + 1`` after attempt ``attempt`` (1-based) failed: doubling,
    capped, then scaled by ``fraction`` (a random number in [0.5, 1] spreads retries out)."""
    delay = base_seconds * (2 ** min(max(attempt - 1, 0), 40))
    return int(min(delay, max_seconds) * 1000 * fraction)
