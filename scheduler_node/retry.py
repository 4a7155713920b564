"""What an attempt's outcome makes of its execution: succeeded, failed for good, or failed with a
retry after a delay. Pure: the caller records the row, parks the retry or dead-letters the
execution after this decision."""

from __future__ import annotations

import random
from typing import NamedTuple

from cronman.model.execution import Status, backoff_ms
from scheduler_node.jobs import Retry


class Decision(NamedTuple):
    status: Status  # SUCCEEDED, PERMANENTLY_FAILED, or FAILED (retried after ``delay_ms``)
    delay_ms: int  # before the next attempt (0 unless retried)
    error: str | None  # the outcome's error, with why there is no retry when the age rules it out


def decide(
    ok: bool,
    error: str | None,
    attempt: int,
    retry: Retry,
    scheduled_ms: int,
    finished_ms: int,
    rng: random.Random,
    aged_on_purpose: bool = False,
) -> Decision:
    """``aged_on_purpose``: the execution is old by design (a backfill's), so its age does not
    stop its retries. The random draw is made only when a retry is possible (the jitter)."""
    if ok:
        return Decision(Status.SUCCEEDED, 0, error)
    if attempt >= retry.max_attempts:
        return Decision(Status.PERMANENTLY_FAILED, 0, error)
    fraction = rng.uniform(0.5, 1.0) if retry.jitter else 1.0
    delay = backoff_ms(attempt, retry.backoff_seconds, retry.max_backoff_seconds, fraction)
    if retry.max_age_ms is not None and not aged_on_purpose and finished_ms + delay - scheduled_ms > retry.max_age_ms:
        return Decision(Status.PERMANENTLY_FAILED, delay, f"{error} (no retry: older than max_event_age_seconds)")
    return Decision(Status.FAILED, delay, error)
