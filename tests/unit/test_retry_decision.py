"""The retry decision on its own: what an attempt's outcome makes of its execution."""

from __future__ import annotations

import random

from cronman.model.execution import Status
from scheduler_node.jobs import Retry
from scheduler_node.retry import decide

POLICY = Retry(max_attempts=3, backoff_seconds=2, max_backoff_seconds=60, jitter=False)


def test_a_success_ends_it_and_draws_nothing() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    assert decide(True, None, 1, POLICY, 0, 10, rng) == (Status.SUCCEEDED, 0, None)
    assert rng.getstate() == state


def test_a_failure_is_retried_after_a_doubling_backoff_until_the_last_attempt() -> None:
    rng = random.Random(1)
    assert decide(False, "HTTP 500", 1, POLICY, 0, 10, rng) == (Status.FAILED, 2000, "HTTP 500")
    assert decide(False, "HTTP 500", 2, POLICY, 0, 10, rng) == (Status.FAILED, 4000, "HTTP 500")
    assert decide(False, "HTTP 500", 3, POLICY, 0, 10, rng).status is Status.PERMANENTLY_FAILED


def test_jitter_draws_once_per_retry_and_keeps_the_delay_between_half_and_whole() -> None:
    policy = Retry(max_attempts=5, backoff_seconds=10, max_backoff_seconds=60, jitter=True)
    rng, twin = random.Random(7), random.Random(7)
    for attempt in range(1, 5):
        got = decide(False, "x", attempt, policy, 0, 0, rng)
        whole = min(10 * 2 ** (attempt - 1), 60) * 1000
        assert got.delay_ms == int(whole * twin.uniform(0.5, 1.0))
        assert whole // 2 <= got.delay_ms <= whole
    assert decide(False, "x", 5, policy, 0, 0, rng).status is Status.PERMANENTLY_FAILED
    assert rng.getstate() == twin.getstate(), "a decision with no retry drew a number"


def test_an_execution_too_old_for_its_next_attempt_fails_for_good_unless_old_on_purpose() -> None:
    policy = Retry(max_attempts=3, backoff_seconds=2, max_backoff_seconds=60, jitter=False, max_age_ms=5000)
    rng = random.Random(1)
    assert decide(False, "HTTP 503", 1, policy, 0, 2999, rng).status is Status.FAILED  # next at 4,999
    late = decide(False, "HTTP 503", 1, policy, 0, 3001, rng)
    assert late.status is Status.PERMANENTLY_FAILED
    assert late.error == "HTTP 503 (no retry: older than max_event_age_seconds)"
    assert decide(False, "HTTP 503", 1, policy, 0, 3001, rng, aged_on_purpose=True).status is Status.FAILED
