"""Validation of job definitions: every bad input names its field, with a code and a message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cronman.errors import InvalidInput
from cronman.model.spec import parse_job

BASE: dict[str, Any] = {
    "schedule": {"type": "interval", "every_seconds": 60},
    "target": {"type": "http", "url": "https://example.com/hook"},
}


def with_(**changes: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(BASE))
    doc.update(changes)
    return doc


def test_minimal_job_gets_defaults() -> None:
    job = parse_job(json.dumps(BASE))
    assert job.retry.max_attempts == 3
    assert job.target.method == "POST"  # type: ignore[union-attr]
    assert job.payload == {}
    assert job.paused is False


@pytest.mark.parametrize(
    ("doc", "code", "field"),
    [
        (with_(extra=1), "unknown_field", "extra"),
        (with_(schedule={"type": "cron", "expression": "61 * * * *"}), "invalid_cron", "schedule.expression"),
        (with_(schedule={"type": "cron", "expression": "0 7 * *"}), "invalid_cron", "schedule.expression"),
        (with_(schedule={"type": "cron", "expression": "0 0 30 2 *"}), "invalid_cron", "schedule.expression"),
        (
            with_(schedule={"type": "cron", "expression": "0 7 * * *", "timezone": "Mars/Base"}),
            "invalid_timezone",
            "schedule.timezone",
        ),
        (with_(schedule={"type": "cron", "expression": "0 7 * * *", "bogus": 1}), "unknown_field", "schedule.bogus"),
        (with_(schedule={"type": "weekly"}), "invalid_type", "schedule.type"),
        (with_(schedule={"every_seconds": 5}), "missing_field", "schedule.type"),
        (with_(schedule={"type": "interval", "every_seconds": 0}), "invalid_value", "schedule.every_seconds"),
        (with_(schedule={"type": "interval", "every_seconds": -5}), "invalid_value", "schedule.every_seconds"),
        (with_(schedule={"type": "interval", "every_seconds": "5"}), "invalid_value", "schedule.every_seconds"),
        (with_(schedule={"type": "interval", "every_seconds": 1.5}), "invalid_value", "schedule.every_seconds"),
        (
            with_(
                schedule={
                    "type": "interval",
                    "every_seconds": 5,
                    "start_at": "2026-01-02T00:00:00Z",
                    "end_at": "2026-01-01T00:00:00Z",
                }
            ),
            "invalid_bounds",
            "schedule.end_at",
        ),
        (with_(schedule={"type": "once", "at": "2026-01-01T00:00:00"}), "invalid_value", "schedule.at"),
        (with_(schedule={"type": "once", "at": "tomorrow"}), "invalid_value", "schedule.at"),
        (with_(schedule={"type": "once"}), "missing_field", "schedule.at"),
        (with_(target={"type": "http"}), "missing_field", "target.url"),
        (with_(target={"type": "http", "url": "ftp://example.com/x"}), "invalid_url", "target.url"),
        (with_(target={"type": "http", "url": "http:///nohost"}), "invalid_url", "target.url"),
        (with_(target={"type": "http", "url": "https://e.com", "method": "TRACE"}), "invalid_value", "target.method"),
        (
            with_(target={"type": "http", "url": "https://e.com", "timeout_seconds": 0}),
            "invalid_value",
            "target.timeout_seconds",
        ),
        (
            with_(target={"type": "http", "url": "https://e.com", "headers": {"Cronman-Job-Id": "x"}}),
            "invalid_header",
            "target.headers.Cronman-Job-Id",
        ),
        (
            with_(target={"type": "http", "url": "https://e.com", "headers": {"X-A": "a\r\nb"}}),
            "invalid_header",
            "target.headers.X-A",
        ),
        (with_(target={"type": "sqs"}), "missing_field", "target.queue_url"),
        (
            with_(target={"type": "sqs", "queue_url": "https://sqs.us-east-1.amazonaws.com/1/q.fifo"}),
            "missing_field",
            "target.message_group_id",
        ),
        (with_(target={"type": "smtp"}), "invalid_type", "target.type"),
        (with_(id="x" * 129), "invalid_value", "id"),
        (with_(id="has space"), "invalid_value", "id"),
        (with_(id=""), "invalid_value", "id"),
        (with_(retry={"max_attempts": 0}), "invalid_value", "retry.max_attempts"),
        (with_(retry={"backoff_seconds": -1}), "invalid_value", "retry.backoff_seconds"),
        (with_(paused="yes"), "invalid_value", "paused"),
        (with_(name="n" * 201), "invalid_value", "name"),
        (with_(payload={"big": "x" * 300_000}), "too_large", "payload"),
        ({"target": BASE["target"]}, "missing_field", "schedule"),
    ],
)
def test_bad_input_names_the_field(doc: dict[str, Any], code: str, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_job(json.dumps(doc))
    err = info.value
    assert (err.code, err.field) == (code, field), err.message
    assert err.status == 400 and err.message


def test_six_field_cron_has_leading_seconds() -> None:
    job = parse_job(json.dumps(with_(schedule={"type": "cron", "expression": "30 0 7 * * *"})))
    assert job.schedule.expression == "30 0 7 * * *"  # type: ignore[union-attr]
