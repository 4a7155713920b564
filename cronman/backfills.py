"""Backfills: a job's occurrences in a past range, delivered again as executions of their own.

What is delivered is fixed when the backfill is asked for: the job's schedule and the calendars it
names are kept with it (its *timing document*), so the count given to the user and the occurrences
a node hands out agree whatever happens to the job afterwards. Each execution carries the trigger
``backfill:<id>``, so its execution id is stable per backfill and occurrence, its history rows are
its own, and receivers get a ``Cronman-Backfill-Id`` header (an SQS message attribute).

Pure: the request model, the timing document and the count (clock passed in).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from cronman.calendars import Calendar, calendar_from_stored, calendar_to_dict, timing_with
from cronman.errors import InvalidInput
from cronman.schedule import Timing, timing_from_dict
from cronman.spec import invalid_input
from cronman.timeutil import to_ms

MAX_OCCURRENCES = 100_000  # executions one backfill may deliver
MAX_RATE = 1000.0
MAX_RUNNING_PER_JOB = 10
BACKFILL_ID_PATTERN = r"^bf-[0-9a-f]{20}$"


class BackfillSpec(BaseModel):
    """A backfill as asked for (POST /v1/jobs/{id}/backfill)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    from_: AwareDatetime = Field(alias="from", description="The first instant of the range (ISO-8601 with an offset).")
    to: AwareDatetime = Field(description="The last instant of the range, inclusive; not in the future.")
    max_per_second: float = Field(
        10.0,
        gt=0,
        le=MAX_RATE,
        allow_inf_nan=False,
        description="Executions handed out per second, across the whole cluster (retries come on top).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> BackfillSpec:
        if self.to < self.from_:
            raise PydanticCustomError("invalid_value", "to must not be before from", {"field": "to"})
        return self


def parse_backfill(body: str | bytes) -> BackfillSpec:
    try:
        return BackfillSpec.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_input(exc) from None


def check_range(spec: BackfillSpec, now_ms: int, retention_days: int) -> tuple[int, int]:
    """The range as epoch ms: in the past, and within the history's retention (older history
    partitions are dropped, so the backfill's rows would be)."""
    lo, hi = to_ms(spec.from_), to_ms(spec.to)
    if hi > now_ms:
        raise InvalidInput("to must not be in the future: a backfill delivers past occurrences", field="to")
    oldest = now_ms - retention_days * 86_400_000
    if lo < oldest:
        raise InvalidInput(f"from must lie within the history's retention ({retention_days} days back)", field="from")
    return lo, hi


def new_backfill_id() -> str:
    return f"bf-{secrets.token_hex(10)}"


def timing_document(schedule: dict[str, Any], names: Sequence[str], found: Mapping[str, Calendar]) -> dict[str, Any]:
    """What a backfill keeps to compute its occurrences: the schedule and the calendars named."""
    return {"schedule": schedule, "calendars": [[n, calendar_to_dict(found[n])] for n in names if n in found]}


def timing_of(document: dict[str, Any] | str, job_id: str, namespace: str) -> Timing:
    doc = json.loads(document) if isinstance(document, str) else document
    # (written by timing_document from calendars the API validated: read without validating each
    # entry again, and whatever calendar_max_entries was then)
    found = {name: calendar_from_stored(cal) for name, cal in doc.get("calendars", [])}
    return timing_with(timing_from_dict(doc["schedule"], job_id, namespace), list(found), found)


def occurrences(timing: Timing, from_ms: int, to_ms: int, limit: int) -> list[int]:
    """The occurrences in [from, to], oldest first, at most ``limit`` (one more says "too many")."""
    out: list[int] = []
    t = timing.next_after(from_ms - 1)
    while t is not None and t <= to_ms and len(out) < limit:
        out.append(t)
        nxt = timing.next_after(t)
        t = nxt if nxt is None or nxt > t else None
    return out


def count(timing: Timing, from_ms: int, to_ms: int, events: int) -> int:
    """How many executions a backfill delivers; InvalidInput when none or more than allowed."""
    found = len(occurrences(timing, from_ms, to_ms, MAX_OCCURRENCES // events + 1)) * events
    if found == 0:
        raise InvalidInput("the job has no occurrence in that range", field="from", code="no_occurrences")
    if found > MAX_OCCURRENCES:
        raise InvalidInput(
            f"the range holds more than {MAX_OCCURRENCES} executions; backfill a shorter range",
            field="to",
            code="too_large",
        )
    return found
