"""The API description of calendars and backfills (part of /openapi.json, see api.openapi)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from cronman.model.backfills import BACKFILL_ID_PATTERN, MAX_OCCURRENCES, BackfillSpec
from cronman.model.calendars import MAX_ENTRIES
from cronman.model.spec import CALENDAR_NAME_PATTERN

_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_DATE_TIME: JsonDict = {"format": "date-time"}


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CalendarRange(_Doc):
    from_: str = Field(alias="from", pattern=_DATE, description="The first excluded date (YYYY-MM-DD).")
    to: str = Field(pattern=_DATE, description="The last excluded date, inclusive.")


class CalendarExclude(_Doc):
    dates: list[str] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES,
        json_schema_extra={"items": {"type": "string", "pattern": _DATE}},
        description="Single dates, YYYY-MM-DD.",
    )
    ranges: list[CalendarRange] = Field(default_factory=list, max_length=MAX_ENTRIES)
    annual: list[str] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES,
        json_schema_extra={"items": {"type": "string", "pattern": r"^[0-9]{2}-[0-9]{2}$"}},
        description="Dates every year, MM-DD (02-29 only in leap years).",
    )
    weekdays: list[str] = Field(
        default_factory=list,
        max_length=7,
        json_schema_extra={"items": {"type": "string", "pattern": r"^[A-Za-z]{3}$"}},
        description="mon, tue, wed, thu, fri, sat, sun (any case; shown in lower case).",
    )


class CalendarSpec(_Doc):
    """A calendar as written (PUT body): the local dates it excludes, in its time zone. At most
    10,000 dates, ranges and annual dates together and 256 KiB by default (the namespace's quotas
    calendar_max_entries and calendar_max_bytes: 413 quota_exceeded)."""

    timezone: str = Field("UTC", max_length=64, description="IANA time zone the dates are read in.")
    exclude: CalendarExclude = Field(default_factory=CalendarExclude)


class Calendar(_Doc):
    name: str
    namespace: str
    timezone: str
    exclude: CalendarExclude = Field(description="As written, ranges merged, entries sorted.")
    created_at: str = Field(json_schema_extra=_DATE_TIME)
    updated_at: str = Field(json_schema_extra=_DATE_TIME)


class CalendarList(_Doc):
    calendars: list[Calendar]


class Backfill(_Doc):
    id: str
    job_id: str
    namespace: str
    state: Literal["running", "completed", "cancelled"] = Field(
        description="running: executions still to hand out or to finish; completed: every one finished."
    )
    from_: str = Field(alias="from", json_schema_extra=_DATE_TIME)
    to: str = Field(json_schema_extra=_DATE_TIME)
    max_per_second: float
    total: int = Field(
        description="Executions in all: the occurrences in the range (on days the job's calendars "
        "allowed when it was asked for) times events_per_trigger."
    )
    dispatched: int = Field(description="Executions handed out (claimed) so far.")
    delivered: int = Field(description="Executions that succeeded.")
    failed: int = Field(description="Executions that failed for good (permanently_failed).")
    skipped: int = Field(description="Executions skipped or cancelled.")
    pending: int = Field(description="Handed out and not finished yet (in flight, or waiting to retry).")
    driver: str | None = Field(description="The node handing its executions out now.")
    reason: str | None
    created_by: str | None
    created_at: str = Field(json_schema_extra=_DATE_TIME)
    updated_at: str = Field(json_schema_extra=_DATE_TIME)


class BackfillList(_Doc):
    backfills: list[Backfill]


SCHEDULE_MODELS: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
    (CalendarSpec, "validation"),
    (Calendar, "serialization"),
    (CalendarList, "serialization"),
    (BackfillSpec, "validation"),
    (Backfill, "serialization"),
    (BackfillList, "serialization"),
]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(schema: dict[str, Any], example: Any) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema, "example": example}}}


_CALENDAR_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": CALENDAR_NAME_PATTERN, "maxLength": 64},
}
_BACKFILL_ID = {
    "name": "backfill_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": BACKFILL_ID_PATTERN},
}
_EXAMPLE_CALENDAR = {
    "timezone": "Europe/Berlin",
    "exclude": {
        "dates": ["2026-12-25"],
        "ranges": [{"from": "2026-12-24", "to": "2026-12-31"}],
        "annual": ["01-01"],
        "weekdays": ["sat", "sun"],
    },
}


def schedule_paths(
    namespace: dict[str, Any], job_id: dict[str, Any], errors: dict[str, Any], write_errors: dict[str, Any]
) -> dict[str, Any]:
    """The paths of calendars and backfills, with the parameters and errors api.openapi uses."""
    auth = {k: v for k, v in errors.items() if k in ("401", "403")}
    conflict = _json(_ref("Error"), "Conflict")
    return {
        "/v1/calendars": {
            "get": {
                "summary": "List calendars",
                "operationId": "listCalendars",
                "parameters": [namespace],
                "responses": {"200": _json(_ref("CalendarList"), "Calendars"), "400": errors["400"], **auth},
            },
        },
        "/v1/calendars/{name}": {
            "parameters": [_CALENDAR_NAME],
            "put": {
                "summary": "Create or replace a calendar",
                "description": "Jobs of the namespace name it in calendars: occurrences on days it excludes are "
                "not delivered; each span of excluded days is recorded as one skipped row, with the calendar's "
                "name and how many occurrences it held. A namespace keeps at most calendars_per_namespace "
                "calendars (100 by default: 409 quota_exceeded); a calendar larger than calendar_max_entries or "
                "calendar_max_bytes is a 413 quota_exceeded, refused before it is parsed.",
                "operationId": "putCalendar",
                "parameters": [namespace],
                "requestBody": _body(_ref("CalendarSpec"), _EXAMPLE_CALENDAR),
                "responses": {
                    "200": _json(_ref("Calendar"), "Replaced"),
                    "201": _json(_ref("Calendar"), "Created"),
                    **write_errors,
                },
            },
            "get": {
                "summary": "Get a calendar",
                "operationId": "getCalendar",
                "parameters": [namespace],
                "responses": {"200": _json(_ref("Calendar"), "The calendar"), **errors},
            },
            "delete": {
                "summary": "Delete a calendar no live job names (409 names the jobs that do)",
                "operationId": "deleteCalendar",
                "parameters": [namespace],
                "responses": {"204": {"description": "Deleted"}, **errors, "409": conflict},
            },
        },
        "/v1/jobs/{job_id}/backfill": {
            "post": {
                "summary": "Deliver the job's occurrences in a past range again",
                "description": "Each occurrence in [from, to] (on days the job's calendars allow) is delivered as "
                "an execution of its own: trigger backfill:<id>, an execution id of its own, a Cronman-Backfill-Id "
                f"header or SQS attribute, retried by the job's retry policy; at most max_per_second across the "
                f"cluster; at most CRONMAN_BACKFILL_MAX_EXECUTIONS executions (default {MAX_OCCURRENCES}: 400 "
                "too_large); per namespace, running backfills and their max_per_second together are bounded by "
                "quotas (409 quota_exceeded). A paused job's backfill waits until it resumes.",
                "operationId": "backfillJob",
                "parameters": [job_id],
                "requestBody": _body(
                    _ref("BackfillSpec"),
                    {"from": "2026-12-01T00:00:00Z", "to": "2026-12-01T06:00:00Z", "max_per_second": 10},
                ),
                "responses": {"202": _json(_ref("Backfill"), "Accepted"), **write_errors},
            },
        },
        "/v1/jobs/{job_id}/backfills": {
            "get": {
                "summary": "The job's backfills, newest first",
                "operationId": "listJobBackfills",
                "parameters": [
                    job_id,
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                ],
                "responses": {"200": _json(_ref("BackfillList"), "Backfills"), **errors},
            },
        },
        "/v1/backfills/{backfill_id}": {
            "parameters": [_BACKFILL_ID],
            "get": {
                "summary": "A backfill and its progress",
                "operationId": "getBackfill",
                "responses": {"200": _json(_ref("Backfill"), "The backfill"), **errors},
            },
            "delete": {
                "summary": "Cancel a backfill",
                "description": "Nothing more is handed out; executions waiting to retry are cancelled. Cancelling a "
                "cancelled backfill changes nothing; a completed one is a 409.",
                "operationId": "cancelBackfill",
                "responses": {"200": _json(_ref("Backfill"), "Cancelled"), **errors, "409": conflict},
            },
        },
    }
