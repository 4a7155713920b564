"""Owned jobs kept compactly in memory: small slotted objects, with shared (interned) targets,
retry policies and cron rules, decoded straight from database rows without the API models."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cronman.schedule import Timing, timing_from_dict


@dataclass(frozen=True, slots=True)
class HttpCall:
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    timeout: float


@dataclass(frozen=True, slots=True)
class SqsSend:
    queue_url: str
    group_id: str | None


Target = HttpCall | SqsSend


@dataclass(frozen=True, slots=True)
class Retry:
    max_attempts: int
    backoff_seconds: float
    max_backoff_seconds: float


class OwnedJob:
    """One job this node owns. ``gen`` changes whenever its timer entries become stale."""

    __slots__ = ("id", "slot", "version", "schedule_text", "timing", "target", "payload", "retry", "paused", "gen")

    def __init__(
        self,
        id: str,
        slot: int,
        version: int,
        schedule_text: str,
        timing: Timing,
        target: Target,
        payload: bytes,
        retry: Retry,
        paused: bool,
    ) -> None:
        self.id = id
        self.slot = slot
        self.version = version
        self.schedule_text = schedule_text
        self.timing = timing
        self.target = target
        self.payload = payload
        self.retry = retry
        self.paused = paused
        self.gen = 0


# Columns the node reads, in order (see scheduler_node.feed).
JOB_COLUMNS = (
    "id, slot, version, schedule::text, target::text, payload, retry::text, paused, "
    "floor(extract(epoch from updated_at) * 1000)::bigint"
)


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    slot: int
    version: int
    schedule_text: str
    target_text: str
    payload: str
    retry_text: str
    paused: bool
    updated_ms: int
    deleted: bool = False


class Decoder:
    """Builds OwnedJobs, sharing equal targets and retry policies between jobs."""

    def __init__(self) -> None:
        self._targets: dict[str, Target] = {}
        self._retries: dict[str, Retry] = {}

    def target(self, text: str) -> Target:
        t = self._targets.get(text)
        if t is None:
            t = _target_from(json.loads(text))
            if len(self._targets) > 100_000:
                self._targets.clear()
            self._targets[text] = t
        return t

    def retry(self, text: str) -> Retry:
        r = self._retries.get(text)
        if r is None:
            d = json.loads(text)
            r = Retry(
                int(d.get("max_attempts", 1)),
                float(d.get("backoff_seconds", 1.0)),
                float(d.get("max_backoff_seconds", 60.0)),
            )
            self._retries[text] = r
        return r

    def job(self, row: JobRow) -> OwnedJob:
        timing = timing_from_dict(json.loads(row.schedule_text), row.id)
        return OwnedJob(
            row.id,
            row.slot,
            row.version,
            row.schedule_text,
            timing,
            self.target(row.target_text),
            row.payload.encode(),
            self.retry(row.retry_text),
            row.paused,
        )


def _target_from(d: dict[str, Any]) -> Target:
    if d["type"] == "http":
        headers = tuple(sorted((str(k), str(v)) for k, v in (d.get("headers") or {}).items()))
        return HttpCall(d.get("method", "POST"), d["url"], headers, float(d.get("timeout_seconds", 10.0)))
    if d["type"] == "sqs":
        return SqsSend(d["queue_url"], d.get("message_group_id"))
    raise ValueError(f"unknown target type {d['type']!r}")
