"""Cron schedules as written: one expression or several (``expressions``), and jitter bounded by
the schedule's spacing."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from cronman.errors import InvalidInput
from cronman.model.schedule import cron_spacing_seconds, next_times, timing_from_dict
from cronman.model.spec import parse_job
from cronman.model.timeutil import iso, to_ms


def _job(**schedule: Any) -> str:
    return json.dumps(
        {"schedule": {"type": "cron", **schedule}, "target": {"type": "http", "url": "https://example.com/h"}}
    )


def _refused(**schedule: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        parse_job(_job(**schedule))
    return info.value


def test_several_expressions_fire_at_the_earliest_of_each() -> None:
    job = parse_job(_job(expressions=["0 9 * * 1-5", "0  12 L * *"], timezone="Europe/Berlin"))
    stored = job.schedule.model_dump(mode="json", exclude_none=True)
    assert stored["expressions"] == ["0 9 * * 1-5", "0 12 L * *"] and "expression" not in stored
    after = to_ms(datetime(2026, 1, 29, tzinfo=UTC))
    times = [iso(t) for t in next_times(timing_from_dict(stored, "j", "default"), after, 4)]
    # Thu 29th 09:00, Fri 30th 09:00, Sat 31st 12:00 (last day), Mon 2 Feb 09:00 (CET = UTC+1)
    assert times == ["2026-01-29T08:00:00Z", "2026-01-30T08:00:00Z", "2026-01-31T11:00:00Z", "2026-02-02T08:00:00Z"]


@pytest.mark.parametrize(
    ("schedule", "code", "field"),
    [
        ({}, "missing_field", "schedule.expression"),
        ({"expression": "0 7 * * *", "expressions": ["0 8 * * *"]}, "invalid_value", "schedule.expression"),
        ({"expressions": []}, "invalid_value", "schedule.expressions"),
        ({"expressions": ["0 7 * * *"] * 11}, "invalid_value", "schedule.expressions"),
        ({"expressions": ["0 7 * * *", "61 * * * *"]}, "invalid_cron", "schedule.expressions.1"),
        ({"expressions": ["0 0 30 2 *"]}, "invalid_cron", "schedule.expressions.0"),
        ({"expressions": ["0 7 * * *", 5]}, "invalid_value", "schedule.expressions.1"),
        ({"expressions": ["x" * 201]}, "invalid_value", "schedule.expressions.0"),
        ({"expressions": ["0 7 * * *\x00"]}, "invalid_value", "schedule.expressions.0"),
    ],
)
def test_bad_expressions_name_the_field(schedule: dict[str, Any], code: str, field: str) -> None:
    err = _refused(**schedule)
    assert (err.code, err.field) == (code, field), err.message


@pytest.mark.parametrize(
    ("expressions", "spacing"),
    [
        (["* * * * * *"], 1),
        (["*/5 * * * *"], 300),
        (["0 * * * *"], 3600),
        (["0 7 * * *"], 86_400),
        (["0 7 * * *", "0 19 * * *"], 43_200),
        (["0 * * * *", "30 0 * * *"], 1800),
        (["0 23 * * *", "0 1 * * *"], 7200),  # across midnight
        (["@hourly", "@daily"], 3600),
    ],
)
def test_spacing(expressions: list[str], spacing: int) -> None:
    assert cron_spacing_seconds(tuple(expressions)) == spacing


def test_jitter_is_bounded_by_the_spacing() -> None:
    assert parse_job(_job(expression="*/5 * * * *", jitter_seconds=300)).schedule.jitter_seconds == 300
    err = _refused(expression="*/5 * * * *", jitter_seconds=301)
    assert (err.code, err.field) == ("invalid_value", "schedule.jitter_seconds") and "300 s" in err.message
    err = _refused(expression="* * * * * *", jitter_seconds=3600)
    assert err.field == "schedule.jitter_seconds" and "1 s" in err.message
    err = _refused(expressions=["0 * * * *", "30 0 * * *"], jitter_seconds=2000)
    assert err.field == "schedule.jitter_seconds" and "1800 s" in err.message
    assert parse_job(_job(expression="0 7 * * *", jitter_seconds=3600)).schedule.jitter_seconds == 3600


def test_a_jittered_every_second_schedule_stays_cheap_and_complete() -> None:
    """The bound's reason: with jitter up to the spacing, the next occurrence is found by looking at a
    few, and none is lost (an hour of jitter on every second would scan thousands and drop some)."""
    stored = parse_job(_job(expression="* * * * * *", jitter_seconds=1)).schedule.model_dump(
        mode="json", exclude_none=True
    )
    timing = timing_from_dict(stored, "j", "default")
    start = to_ms(datetime(2026, 3, 1, tzinfo=UTC))
    t0 = time.perf_counter()
    times = next_times(timing, start, 3600)
    took = time.perf_counter() - t0
    # one per second: each whole second's occurrence, moved by less than a second, in order
    seconds = [t // 1000 for t in times]
    assert seconds == list(range(seconds[0], seconds[0] + 3600)) and seconds[0] - start // 1000 in (0, 1)
    assert times == sorted(times) and took < 1.0


def test_the_api_description_documents_both() -> None:
    from api.openapi import openapi_document

    cron = openapi_document()["components"]["schemas"]["CronSchedule"]["properties"]
    assert cron["expressions"]["anyOf"][0]["maxItems"] == 10
    assert "Exactly one of expression and expressions" in cron["expression"]["description"]
    assert "shortest time between two times of day" in cron["jitter_seconds"]["description"]
