"""Change notifications: what is published on the changes channel (cronman.redis.keys) after a change to
jobs, so that every scheduler node hears of it at once instead of at its next read of the change
feed (the feed stays the record; its poll is the safety net for a notification lost).

A message is either empty (read the feed now) or names jobs that just stopped firing: paused or
deleted, each with the version the change gave it. A node stops such a job at once, before its read
of the feed brings the change (scheduler_node.stops), unless it already has that version or a later
one (a notification that arrives after a later change, a resume, changes nothing). One change makes
one message, however many jobs it stops (a bulk pause, a batch).

The message is JSON, ``{"stop": [[job id, version, "paused" | "deleted"], ...]}``; a node that does
not understand a message only reads the feed, so nodes and the API may be upgraded in any order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stop:
    """A job that stopped firing at ``version`` (paused, or ``deleted``)."""

    job_id: str
    version: int
    deleted: bool = False

    @property
    def reason(self) -> str:
        return "the job was deleted" if self.deleted else "the job was paused"


def encode(stops: Iterable[Stop]) -> bytes:
    """The message for ``stops`` (empty: only a wake-up)."""
    items = [[s.job_id, s.version, "deleted" if s.deleted else "paused"] for s in stops]
    return json.dumps({"stop": items}, separators=(",", ":")).encode() if items else b""


def decode(message: bytes | str | None) -> list[Stop]:
    """The stops a message names; none for a wake-up, or for anything else (never raises)."""
    if not message:
        return []
    try:
        items = json.loads(message)["stop"]
        return [
            Stop(job_id, version, kind == "deleted")
            for job_id, version, kind in items
            if isinstance(job_id, str) and type(version) is int and kind in ("paused", "deleted")
        ]
    except (ValueError, TypeError, KeyError):
        return []
