"""The OpenAPI 3.1 description of the API, built from the same models that validate requests."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel
from pydantic.json_schema import models_json_schema
from pydantic_core import PydanticUndefined

from api.batch import MAX_BATCH
from api.jobs import MAX_SEARCH
from api.openapi_executions import COMPLETION_TOKEN_SCHEME, EXECUTION_MODELS, execution_paths
from api.openapi_schedules import SCHEDULE_MODELS, schedule_paths
from cronman import __version__
from cronman.model.labels import MAX_SELECTOR
from cronman.model.namespaces import NAMESPACE_PATTERN
from cronman.model.spec import JOB_ID_PATTERN, THROTTLE_NAME_PATTERN, JobSpec, PlainStr, Target
from cronman.store.commands import COMMAND_ID_PATTERN
from cronman.store.health import HealthState
from cronman.store.notifications import EventKind, NotificationSpec
from cronman.store.throttles import ThrottlePolicySpec


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobHealth(_Out):
    """Computed by the system, kept up to date as outcomes are written."""

    state: HealthState = Field(
        description="paused; late: an occurrence nobody took up within late_after_seconds, and none attempted "
        "since; failing: the latest execution(s) ended permanently_failed; completed: nothing left to fire; ok."
    )
    last_success_at: str | None = Field(json_schema_extra={"format": "date-time"})
    last_failure_at: str | None = Field(
        json_schema_extra={"format": "date-time"}, description="The last failed attempt, retried or not."
    )
    consecutive_failures: int = Field(description="Executions in a row that ended permanently_failed.")
    last_lag_ms: int | None = Field(description="Fired time minus due time of the latest first attempt.")
    late_since: str | None = Field(
        json_schema_extra={"format": "date-time"}, description="While late: the first late occurrence's due time."
    )


class PausedReason(_Out):
    reason: Literal["paused", "consecutive_failures"] = Field(
        description="paused: by a user (the pause endpoint, or the definition); consecutive_failures: the job "
        "paused itself (failure_policy)."
    )
    message: str
    by: str | None = Field(description="Who paused it: a caller (admin, key:<prefix>) or scheduler.")
    since: str | None = Field(json_schema_extra={"format": "date-time"})
    consecutive_failures: int | None = None


def _as_shown(name: str, **changes: Any) -> Any:
    """A field of JobSpec as an answer shows it (``changes``: its FieldInfo attributes that differ)."""
    shown = copy.copy(JobSpec.model_fields[name])
    for attribute, value in changes.items():
        setattr(shown, attribute, value)
    return shown


class Job(JobSpec):
    """A job as the API returns it: the definition plus read-only fields."""

    # Every field of the definition is in an answer (an option with its default when the job does not
    # set it), but the name of a job that has none.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: str = _as_shown("id", default=PydanticUndefined)
    name: PlainStr | None = _as_shown("name", exclude_if=lambda name: name is None)
    namespace: str
    state: Literal["active", "paused", "completed"]
    health: JobHealth
    paused_reason: PausedReason | None = Field(description="Why and since when the job is paused; null if it is not.")
    created_at: str = Field(json_schema_extra={"format": "date-time"})
    updated_at: str = Field(json_schema_extra={"format": "date-time"})
    version: int
    next_fire_at: str | None = Field(json_schema_extra={"format": "date-time"})


class JobPatch(RootModel[dict[str, Any]]):
    """Fields of JobSpec to change, as a JSON merge patch (RFC 7396): a value replaces the stored
    one, an object is merged into the stored one (but payload, and a schedule or target whose type
    changes, are replaced whole), and null removes a field (back to its default). The result must
    be a valid JobSpec."""


class JobList(_Out):
    jobs: list[Job]
    next_cursor: str | None


class Execution(_Out):
    execution_id: str = Field(description="Stable for an occurrence: the same on every attempt and redelivery.")
    job_id: str
    scheduled_for: str = Field(json_schema_extra={"format": "date-time"})
    event_index: int
    attempt: int = Field(description="1-based")
    trigger: str = Field(
        description="schedule, manual (POST .../trigger) or backfill:<backfill id> (a backfill's execution).",
        examples=["schedule"],
    )
    status: Literal["succeeded", "failed", "permanently_failed", "skipped", "cancelled", "late", "running"] = Field(
        description="cancelled: no further attempt, the job was deleted or paused first; late: a row of attempt 0 "
        "the watchdog wrote for an occurrence nobody took up in time; running: work that completes later "
        "(completion), accepted by its receiver, whose end is not recorded yet (shown at the head of the first "
        "page, besides limit rows of history)."
    )
    node: str | None
    fired_at: str | None
    finished_at: str | None
    lag_ms: int | None
    http_status: int | None
    error: str | None
    duplicates: int = Field(description="Extra deliveries of this attempt detected (0 normally).")
    throttle_wait_ms: int | None = Field(description="How long the attempt waited for a throttle permit.")
    dead_lettered: bool | None = Field(
        description="Whether a permanently failed execution reached its dead-letter queue."
    )
    response: str | None = Field(
        description="The start of the receiver's answer, when the job sets capture_response_bytes (UTF-8, "
        "invalid bytes replaced, NUL written as \\0)."
    )
    occurrences: int | None = Field(
        None,
        description="On a row that stands for several occurrences: a span of days the job's calendars exclude "
        "(status skipped, one row for the span from scheduled_for on) or occurrences the watchdog found late "
        "(status late, one row for a stall): how many, from scheduled_for through last_scheduled_for. Null on "
        "a row of one occurrence.",
    )
    last_scheduled_for: str | None = Field(
        None,
        json_schema_extra={"format": "date-time"},
        description="The last occurrence a summary row stands for (null on a row of one occurrence).",
    )
    upstream_execution_ids: list[str] = Field(
        description="The upstream executions this one followed (a job with an after schedule or require; "
        "Cronman-Upstream-Execution-Ids of its delivery); empty for others."
    )
    started_at: str | None = Field(
        json_schema_extra={"format": "date-time"},
        description="A running execution: when its attempt was sent (null otherwise).",
    )
    deadline_at: str | None = Field(
        json_schema_extra={"format": "date-time"},
        description="A running execution: when the attempt fails unless its work reports (null otherwise).",
    )


class ExecutionList(_Out):
    executions: list[Execution]
    next_cursor: str | None


class NextTimes(_Out):
    next: list[str]


class Triggered(_Out):
    job_id: str
    execution_id: str
    scheduled_for: str


class ErrorDetail(_Out):
    code: str
    message: str
    field: str | None
    quota: str | None = Field(
        None,
        description="With code quota_exceeded: the quota the request would exceed, as its setting is named "
        "(CRONMAN_QUOTA_...; docs/security.md, Quotas).",
    )


class Error(_Out):
    error: ErrorDetail


class ClusterNode(_Out):
    id: str
    heartbeat_age_seconds: float
    overdue: bool = Field(
        description="Its heartbeat is older than two heartbeat intervals and 1 s: the other nodes route around it "
        "(it owns no slot) until it beats again or its heartbeat's TTL runs out."
    )
    slots_owned: int
    jobs_owned: int | None
    ready: bool
    started_at: str | None


class Cluster(_Out):
    replication_factor: int
    slots: int
    nodes: list[ClusterNode]


class JobBatch(BaseModel):
    """Jobs to create or replace, each by the rules of PUT /v1/jobs/{id} (an item without an id gets one)."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobSpec] = Field(max_length=MAX_BATCH)


class BatchItemResult(_Out):
    index: int = Field(description="The item's position in the request's jobs (0-based).")
    id: str | None = Field(description="The job's id (generated when the item had none); null if unknown.")
    status: Literal[200, 201, 400, 409] = Field(description="201 created, 200 replaced, 400 invalid, 409 id taken.")
    error: ErrorDetail | None


class BatchResult(_Out):
    results: list[BatchItemResult]
    created: int
    replaced: int
    failed: int


class Redelivered(_Out):
    job_id: str
    execution_id: str
    attempt: int = Field(description="The attempt number the redelivery will carry (Cronman-Attempt).")


class JobEvent(_Out):
    id: int
    job_id: str
    namespace: str
    at: str = Field(json_schema_extra={"format": "date-time"})
    action: Literal[
        "create",
        "replace",
        "update",
        "delete",
        "pause",
        "resume",
        "trigger",
        "redeliver",
        "backfill",
        "backfill_cancel",
    ]
    actor: str | None = Field(
        description="admin, key:<prefix> (a namespace key), queue (the command queue) or scheduler."
    )
    detail: dict[str, Any] | None


class JobEventList(_Out):
    events: list[JobEvent]
    next_cursor: str | None


class ThrottlePolicy(_Out):
    name: str
    namespace: str
    max_in_flight: int
    max_per_second: float | None
    created_at: str = Field(json_schema_extra={"format": "date-time"})
    updated_at: str = Field(json_schema_extra={"format": "date-time"})


class Notification(_Out):
    name: str
    namespace: str
    events: list[EventKind]
    selector: str
    target: Target
    min_interval_seconds: int
    created_at: str = Field(json_schema_extra={"format": "date-time"})
    updated_at: str = Field(json_schema_extra={"format": "date-time"})


class NotificationList(_Out):
    notifications: list[Notification]


class ThrottlePolicyList(_Out):
    throttles: list[ThrottlePolicy]


class SigningSecret(_Out):
    namespace: str
    secret: str = Field(description="Shown only in this answer; keep it where the receivers can read it.")
    created_at: str = Field(json_schema_extra={"format": "date-time"})


class ActiveSigningSecret(_Out):
    prefix: str = Field(description="The secret's first 10 characters.")
    created_at: str = Field(json_schema_extra={"format": "date-time"})
    retires_at: str | None = Field(
        json_schema_extra={"format": "date-time"},
        description="When this secret stops signing (a day after the rotation that replaced it); null for the newest.",
    )


class SigningSecrets(_Out):
    namespace: str
    active: list[ActiveSigningSecret] = Field(description="The secrets that sign deliveries now, newest first.")


class Command(_Out):
    command_id: str
    namespace: str | None
    action: str
    job_id: str | None
    status: Literal["applied", "rejected"]
    error: str | None
    received_at: str = Field(json_schema_extra={"format": "date-time"})
    applied_at: str | None = Field(json_schema_extra={"format": "date-time"})


class CommandToken(_Out):
    token: str = Field(
        description="Signs the messages this key puts on the command queue (HMAC-SHA256, see the API guide); "
        "keep it as secret as the key. The commands act in the key's namespace."
    )
    key: str = Field(description="The key's prefix, or admin: the value of the Cronman-Command-Key attribute.")
    namespace: str | None = Field(description="The namespace the commands act in; null for the admin key (any).")


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_AUTH_ERRORS = {
    "401": {
        **_json(_ref("Error"), "No API key, or an unknown or revoked one"),
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
    },
    "403": _json(_ref("Error"), "The key may not do this (another namespace, or an admin-only endpoint)"),
}
_ERRORS = {
    "400": _json(_ref("Error"), "Invalid input"),
    "404": _json(_ref("Error"), "No such job"),
    **_AUTH_ERRORS,
}
_NAMESPACE = {
    "name": "namespace",
    "in": "query",
    "description": "The admin key: the namespace to act in (a namespace key may name only its own).",
    "schema": {"type": "string", "pattern": NAMESPACE_PATTERN, "maxLength": 64},
}
_SELECTOR = {
    "name": "selector",
    "in": "query",
    "description": "Label selector: requirements separated by commas, all of which must hold: key=value (or "
    "key==value), key!=value, key in (v1,v2), key notin (v1,v2), key (present), !key (absent). A bad selector "
    "is a 400 invalid_selector.",
    "schema": {"type": "string", "maxLength": MAX_SELECTOR},
    "example": "team=payments,env!=dev",
}
_SEARCH = {
    "name": "q",
    "in": "query",
    "description": "Only jobs whose id or name contains this text, ignoring case.",
    "schema": {"type": "string", "maxLength": MAX_SEARCH},
}
_STOPS = (
    "Once answered, every scheduler node has been told: nothing more of the job goes out but an attempt already "
    "being sent, which is not retried; a retry waiting for its time is recorded cancelled."
)
_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": JOB_ID_PATTERN, "maxLength": 128},
}


_THROTTLE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": THROTTLE_NAME_PATTERN, "maxLength": 64},
}


def _page(limit_max: int) -> list[dict[str, Any]]:
    return [
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": limit_max}},
        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
    ]


def _body(
    schema: dict[str, Any], types: tuple[str, ...] = ("application/json",), example: Any = None
) -> dict[str, Any]:
    extra = {} if example is None else {"example": example}
    return {"required": True, "content": {t: {"schema": schema, **extra} for t in types}}


_EXAMPLE_JOB = {
    "name": "daily invoice reminder",
    "schedule": {"type": "cron", "expression": "0 7 * * *", "timezone": "America/New_York"},
    "target": {
        "type": "http",
        "url": "https://example.com/hook",
        "headers": {"Authorization": "Bearer receiver-secret"},
    },
    "payload": {"invoice": 42},
    "retry": {"max_attempts": 3, "backoff_seconds": 1, "max_backoff_seconds": 60},
}


_ETAG = {
    "ETag": {
        "schema": {"type": "string"},
        "description": 'The job\'s version as an entity tag ("42"), for If-Match on DELETE',
    }
}
_IF_MATCH = {
    "name": "If-Match",
    "in": "header",
    "description": 'Delete only while the job is at this version (its ETag, e.g. "42"; several may be given, '
    "comma-separated; * for any). A job changed since is a 412 version_mismatch, and is not deleted.",
    "schema": {"type": "string", "maxLength": 200},
}


def _paths() -> dict[str, Any]:
    job_ok = {**_json(_ref("Job"), "The job"), "headers": _ETAG}
    created = {**_json(_ref("Job"), "Created"), "headers": _ETAG}
    write_errors = {
        **_ERRORS,
        "409": _json(_ref("Error"), "Conflict"),
        "413": _json(_ref("Error"), "Too large"),
        "415": _json(_ref("Error"), "Not JSON"),
    }
    action = {"parameters": [_JOB_ID], "responses": {"200": job_ok, **_ERRORS}}
    return {
        "/v1/jobs": {
            "post": {
                "summary": "Create a job",
                "operationId": "createJob",
                "parameters": [_NAMESPACE],
                "requestBody": _body(_ref("JobSpec"), example=_EXAMPLE_JOB),
                "responses": {"201": created, **write_errors},
            },
            "get": {
                "summary": "List jobs",
                "operationId": "listJobs",
                "parameters": [*_page(1000), _NAMESPACE, _SELECTOR, _SEARCH],
                "responses": {"200": _json(_ref("JobList"), "A page of jobs"), "400": _ERRORS["400"], **_AUTH_ERRORS},
            },
        },
        "/v1/jobs/{job_id}": {
            "parameters": [_JOB_ID],
            "get": {"summary": "Get a job", "operationId": "getJob", "responses": {"200": job_ok, **_ERRORS}},
            "put": {
                "summary": "Create or replace a job",
                "operationId": "putJob",
                "parameters": [_NAMESPACE],
                "requestBody": _body(_ref("JobSpec"), example=_EXAMPLE_JOB),
                "responses": {"200": job_ok, "201": created, **write_errors},
            },
            "patch": {
                "summary": "Update some fields (JSON merge patch; payload and a schedule or target whose type "
                "changes are replaced whole)",
                # One media type described: the server takes application/json as well, but a body
                # described under two makes generated clients that do not run.
                "description": "The body is a JSON merge patch (RFC 7396); application/json is taken too.",
                "operationId": "patchJob",
                "requestBody": _body(
                    _ref("JobPatch"),
                    ("application/merge-patch+json",),
                    example={"schedule": {"expression": "30 8 * * *"}, "paused": True},
                ),
                "responses": {"200": job_ok, **write_errors},
            },
            "delete": {
                "summary": "Delete a job",
                "description": _STOPS,
                "operationId": "deleteJob",
                "parameters": [_IF_MATCH],
                "responses": {
                    "204": {"description": "Deleted"},
                    **_ERRORS,
                    "412": _json(_ref("Error"), "If-Match names a version the job is no longer at; not deleted"),
                },
            },
        },
        "/v1/jobs/{job_id}/next": {
            "get": {
                "summary": "The next fire times",
                "operationId": "nextFireTimes",
                "parameters": [
                    _JOB_ID,
                    {"name": "count", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                    {
                        "name": "after",
                        "in": "query",
                        "description": "Default now; from 1970-01-01T00:00:00Z to before 9000-01-01T00:00:00Z.",
                        "schema": {"type": "string", "format": "date-time"},
                    },
                ],
                "responses": {"200": _json(_ref("NextTimes"), "Fire times, ISO-8601 UTC"), **_ERRORS},
            }
        },
        "/v1/jobs/{job_id}/executions": {
            "get": {
                "summary": "Execution history, newest first",
                "operationId": "listExecutions",
                "parameters": [_JOB_ID, *_page(1000)],
                "responses": {"200": _json(_ref("ExecutionList"), "A page of executions"), **_ERRORS},
            },
        },
        "/v1/jobs/{job_id}/pause": {
            "post": {"summary": "Pause", "description": _STOPS, "operationId": "pauseJob", **action}
        },
        "/v1/jobs/{job_id}/resume": {"post": {"summary": "Resume", "operationId": "resumeJob", **action}},
        "/v1/jobs/{job_id}/trigger": {
            "post": {
                "summary": "Fire once now",
                "operationId": "triggerJob",
                "parameters": [_JOB_ID],
                "responses": {"202": _json(_ref("Triggered"), "Accepted"), **_ERRORS},
            },
        },
        "/v1/jobs:batch": {
            "post": {
                "summary": "Create or replace up to 1000 jobs",
                "description": "Each item follows the rules of PUT /v1/jobs/{id} (an item without an id gets one, "
                "as with POST). Invalid items do not stop valid ones: the answer is a 200 with a result per item. "
                "The body may be up to 16 MiB.",
                "operationId": "putJobsBatch",
                "parameters": [_NAMESPACE],
                "requestBody": _body(_ref("JobBatch"), example={"jobs": [{"id": "batch-1", **_EXAMPLE_JOB}]}),
                "responses": {
                    "200": _json(_ref("BatchResult"), "A result per item"),
                    "400": _ERRORS["400"],
                    "413": write_errors["413"],
                    "415": write_errors["415"],
                    **_AUTH_ERRORS,
                },
            },
        },
        "/v1/jobs/{job_id}/executions/{execution_id}/redeliver": {
            "post": {
                "summary": "Send a failed execution again, under its execution id, as its next attempt",
                "operationId": "redeliverExecution",
                "parameters": [
                    _JOB_ID,
                    {"name": "execution_id", "in": "path", "required": True, "schema": {"type": "string"}},
                ],
                "responses": {
                    "202": _json(_ref("Redelivered"), "Accepted"),
                    **_ERRORS,
                    "409": _json(_ref("Error"), "The execution did not fail"),
                },
            },
        },
        "/v1/jobs/{job_id}/events": {
            "get": {
                "summary": "Who did what to the job, newest first",
                "operationId": "listJobEvents",
                "parameters": [_JOB_ID, *_page(1000)],
                "responses": {"200": _json(_ref("JobEventList"), "A page of events"), **_ERRORS},
            },
        },
        "/v1/throttles": {
            "get": {
                "summary": "List throttle policies",
                "operationId": "listThrottles",
                "parameters": [_NAMESPACE],
                "responses": {
                    "200": _json(_ref("ThrottlePolicyList"), "Policies"),
                    "400": _ERRORS["400"],
                    **_AUTH_ERRORS,
                },
            },
        },
        "/v1/throttles/{name}": {
            "parameters": [_THROTTLE_NAME],
            "put": {
                "summary": "Create or replace a throttle policy",
                "operationId": "putThrottle",
                "parameters": [_NAMESPACE],
                "requestBody": _body(_ref("ThrottlePolicySpec"), example={"max_in_flight": 10, "max_per_second": 5}),
                "responses": {
                    "200": _json(_ref("ThrottlePolicy"), "Replaced"),
                    "201": _json(_ref("ThrottlePolicy"), "Created"),
                    **write_errors,
                },
            },
            "get": {
                "summary": "Get a throttle policy",
                "operationId": "getThrottle",
                "parameters": [_NAMESPACE],
                "responses": {"200": _json(_ref("ThrottlePolicy"), "The policy"), **_ERRORS},
            },
            "delete": {
                "summary": "Delete a throttle policy (jobs that name it then run unthrottled)",
                "operationId": "deleteThrottle",
                "parameters": [_NAMESPACE],
                "responses": {"204": {"description": "Deleted"}, **_ERRORS},
            },
        },
        "/v1/notifications": {
            "get": {
                "summary": "List notification rules",
                "operationId": "listNotifications",
                "parameters": [_NAMESPACE],
                "responses": {
                    "200": _json(_ref("NotificationList"), "Rules"),
                    "400": _ERRORS["400"],
                    **_AUTH_ERRORS,
                },
            },
        },
        "/v1/notifications/{name}": {
            "parameters": [_THROTTLE_NAME],
            "put": {
                "summary": "Create or replace a notification rule",
                "description": "Delivered body: {event_id, event, namespace, notification, job_id, at, first_at, "
                "count, ...}; at least once, the same event_id on every attempt; HTTP targets get a POST signed "
                "in Cronman-Notification-Signature (the namespace's secrets over notification.<t>.<body>; never "
                "valid as a delivery's Cronman-Signature). At most one notification per job and event kind per "
                "min_interval_seconds; the events in between are summarised (count).",
                "operationId": "putNotification",
                "parameters": [_NAMESPACE],
                "requestBody": _body(
                    _ref("NotificationSpec"),
                    example={
                        "events": ["execution.permanently_failed", "job.auto_paused", "job.recovered"],
                        "selector": "team=payments",
                        "target": {"type": "http", "url": "https://example.com/alerts"},
                        "min_interval_seconds": 60,
                    },
                ),
                "responses": {
                    "200": _json(_ref("Notification"), "Replaced"),
                    "201": _json(_ref("Notification"), "Created"),
                    **write_errors,
                },
            },
            "get": {
                "summary": "Get a notification rule",
                "operationId": "getNotification",
                "parameters": [_NAMESPACE],
                "responses": {"200": _json(_ref("Notification"), "The rule"), **_ERRORS},
            },
            "delete": {
                "summary": "Delete a notification rule",
                "operationId": "deleteNotification",
                "parameters": [_NAMESPACE],
                "responses": {"204": {"description": "Deleted"}, **_ERRORS},
            },
        },
        **schedule_paths(_NAMESPACE, _JOB_ID, _ERRORS, write_errors),
        **execution_paths(_ERRORS),
        "/v1/signing-secrets": {
            "post": {
                "summary": "Rotate the namespace's signing secret",
                "description": "Returns the new secret, once. The previous secret keeps signing for a day.",
                "operationId": "rotateSigningSecret",
                "parameters": [_NAMESPACE],
                "responses": {
                    "201": _json(_ref("SigningSecret"), "The new secret"),
                    "400": _ERRORS["400"],
                    **_AUTH_ERRORS,
                },
            },
            "get": {
                "summary": "The namespace's active signing secrets (prefixes only)",
                "operationId": "listSigningSecrets",
                "parameters": [_NAMESPACE],
                "responses": {
                    "200": _json(_ref("SigningSecrets"), "Active secrets"),
                    "400": _ERRORS["400"],
                    **_AUTH_ERRORS,
                },
            },
        },
        "/v1/commands:token": {
            "get": {
                "summary": "The calling key's command token, to sign commands sent through the command queue",
                "operationId": "getCommandToken",
                "responses": {
                    "200": _json(_ref("CommandToken"), "The token"),
                    "409": _json(_ref("Error"), "The command queue is not set up (CRONMAN_COMMAND_SECRET)"),
                    **_AUTH_ERRORS,
                },
            },
        },
        "/v1/commands/{command_id}": {
            "get": {
                "summary": "What became of a command sent through the command queue",
                "operationId": "getCommand",
                "parameters": [
                    {
                        "name": "command_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": COMMAND_ID_PATTERN, "maxLength": 128},
                    }
                ],
                "responses": {"200": _json(_ref("Command"), "The command"), "404": _ERRORS["404"], **_AUTH_ERRORS},
            },
        },
        "/v1/cluster": {
            "get": {
                "summary": "Live scheduler nodes",
                "operationId": "getCluster",
                "description": "Needs the admin key.",
                "responses": {"200": _json(_ref("Cluster"), "The cluster"), **_AUTH_ERRORS},
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "operationId": "healthz",
                "security": [],
                "responses": {"200": _json({"type": "object"}, "Alive")},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness",
                "operationId": "readyz",
                "security": [],
                "responses": {"200": _json({"type": "object"}, "Ready"), "503": _json({"type": "object"}, "Not ready")},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "operationId": "metrics",
                "security": [],
                "responses": {
                    "200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}
                },
            }
        },
    }


def _server_limit(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {"type": "string"}}}}


# Answered by the HTTP server (gunicorn) before a request reaches the application, in its own words.
_SERVER_LIMITS = {
    "414": _server_limit("Request line (path and query) longer than 4094 bytes; answered by the HTTP server"),
    "431": _server_limit("More than 100 header fields, or one longer than 8190 bytes; answered by the HTTP server"),
}


def _with_server_limits(paths: dict[str, Any]) -> dict[str, Any]:
    for item in paths.values():
        for method, operation in item.items():
            if method == "parameters":
                continue
            for status, response in _SERVER_LIMITS.items():
                operation["responses"].setdefault(status, response)
    return paths


@cache
def openapi_document() -> dict[str, Any]:
    models: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
        (JobSpec, "validation"),
        (JobPatch, "validation"),
        (Job, "serialization"),
        (JobList, "serialization"),
        (Execution, "serialization"),
        (ExecutionList, "serialization"),
        (NextTimes, "serialization"),
        (Triggered, "serialization"),
        (Error, "serialization"),
        (Cluster, "serialization"),
        (JobBatch, "validation"),
        (BatchResult, "serialization"),
        (Redelivered, "serialization"),
        (JobEventList, "serialization"),
        (ThrottlePolicySpec, "validation"),
        (ThrottlePolicy, "serialization"),
        (ThrottlePolicyList, "serialization"),
        (NotificationSpec, "validation"),
        (Notification, "serialization"),
        (NotificationList, "serialization"),
        (SigningSecret, "serialization"),
        (SigningSecrets, "serialization"),
        (Command, "serialization"),
        (CommandToken, "serialization"),
        *SCHEDULE_MODELS,
        *EXECUTION_MODELS,
    ]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "cronman",
            "version": __version__,
            "description": "Register jobs over HTTP; a cluster of scheduler nodes fires each job's HTTP callback "
            "or SQS message on time, at least once, with a stable execution id.",
        },
        "paths": _with_server_limits(_paths()),
        "security": [{"bearerAuth": []}],
        "components": {
            "schemas": top["$defs"],
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: the admin key (CRONMAN_API_KEY) or a namespace key "
                    "(cronman keys create). Every /v1 endpoint needs one, but :complete and :heartbeat of an "
                    "execution also take its completion token instead.",
                },
                "completionToken": COMPLETION_TOKEN_SCHEME,
            },
        },
    }
