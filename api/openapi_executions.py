"""The API description of work that finishes later: ``/v1/executions/{execution_id}`` with
``:complete`` and ``:heartbeat`` (part of /openapi.json, see api.openapi)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from api.auth import COMPLETION_TOKEN_HEADER, MAX_TOKEN_LENGTH
from cronman.model.spec import MAX_OUTPUT_BYTES

_DATE_TIME: JsonDict = {"format": "date-time"}


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompletionReport(_Doc):
    """The end of an execution's work, as the work reports it."""

    status: Literal["succeeded", "failed"] = Field(
        description="failed ends the attempt as a failed one: retried by the job's retry policy, as a delivery "
        "that failed would be."
    )
    output: str | None = Field(
        None,
        max_length=MAX_OUTPUT_BYTES,
        description=f"A short account of the work (at most {MAX_OUTPUT_BYTES} bytes of UTF-8, no NUL): kept as the "
        "execution's response.",
    )


class CompletionRecorded(_Doc):
    execution_id: str
    job_id: str
    namespace: str
    attempt: int = Field(description="The attempt the report ended (Cronman-Attempt of its delivery).")
    status: Literal["succeeded", "failed"]
    output: str | None
    reported_at: str | None = Field(json_schema_extra=_DATE_TIME)
    duplicate: bool = Field(
        description="true: this end had been reported already (the answer shows the report recorded first; "
        "nothing changed)."
    )


class Heartbeat(_Doc):
    execution_id: str
    attempt: int
    deadline_at: str | None = Field(
        json_schema_extra=_DATE_TIME,
        description="The attempt fails unless its work reports again by then (moved by each heartbeat when the job "
        "sets completion.heartbeat_seconds).",
    )
    timeout_at: str | None = Field(
        json_schema_extra=_DATE_TIME, description="The attempt's last moment, however many heartbeats."
    )


class AsyncExecution(_Doc):
    execution_id: str
    job_id: str
    namespace: str
    scheduled_for: str | None = Field(json_schema_extra=_DATE_TIME)
    trigger: str
    attempt: int = Field(description="The attempt sent last.")
    status: Literal["running", "succeeded", "failed", "timed_out", "unaccepted"] = Field(
        description="running: accepted, its end not reported; succeeded/failed: reported; timed_out: no end "
        "reported by the deadline (the attempt failed; a retry follows if the job's retry policy allows one); "
        "unaccepted: the receiver's answer to the attempt was a failure, so its work is not awaited."
    )
    started_at: str | None = Field(json_schema_extra=_DATE_TIME)
    deadline_at: str | None = Field(json_schema_extra=_DATE_TIME)
    timeout_at: str | None = Field(json_schema_extra=_DATE_TIME)
    last_heartbeat_at: str | None = Field(json_schema_extra=_DATE_TIME)
    reported_at: str | None = Field(json_schema_extra=_DATE_TIME)
    reported_by: str | None = Field(description="token, admin or key:<prefix>.")
    output: str | None


class FlowEdge(_Doc):
    job_id: str
    kind: Literal["after", "require"] = Field(description="after: the downstream's schedule; require: its requirement.")
    within_seconds: int
    exists: bool = Field(description="false: no such job (any more) in the namespace.")


class FlowRunning(_Doc):
    execution_id: str
    scheduled_for: str = Field(json_schema_extra=_DATE_TIME)
    attempt: int
    started_at: str = Field(json_schema_extra=_DATE_TIME)
    deadline_at: str = Field(json_schema_extra=_DATE_TIME, description="No end reported by then: the attempt fails.")
    last_heartbeat_at: str | None = Field(json_schema_extra=_DATE_TIME)


class FlowMiss(_Doc):
    execution_id: str
    scheduled_for: str = Field(json_schema_extra=_DATE_TIME)
    deadline_at: str = Field(json_schema_extra=_DATE_TIME)
    status: str | None = Field(description="What history said of the occurrence at its deadline (null: nothing).")


class JobFlow(_Doc):
    job_id: str
    upstreams: list[FlowEdge] = Field(description="The jobs it waits for (at most 50).")
    downstreams: list[FlowEdge] = Field(description="The jobs that wait for it (at most 50).")
    running: list[FlowRunning] = Field(description="Its executions whose work still runs, newest first (at most 20).")
    deadline_misses: list[FlowMiss] = Field(description="Its latest missed deadlines, newest first (at most 10).")


EXECUTION_MODELS: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
    (CompletionReport, "validation"),
    (CompletionRecorded, "serialization"),
    (Heartbeat, "serialization"),
    (AsyncExecution, "serialization"),
    (JobFlow, "serialization"),
]

COMPLETION_TOKEN_SCHEME = {
    "type": "apiKey",
    "in": "header",
    "name": COMPLETION_TOKEN_HEADER,
    "description": "The token sent with an attempt of work that completes later (header "
    f"{COMPLETION_TOKEN_HEADER} of the HTTP delivery, message attribute of the same name of an SQS one; at "
    f"most {MAX_TOKEN_LENGTH} characters). It authorises :complete and :heartbeat of that execution's current "
    "attempt only, without a key.",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_EXECUTION_ID = {
    "name": "execution_id",
    "in": "path",
    "required": True,
    "description": "The execution id (Cronman-Execution-Id of the delivery).",
    "schema": {"type": "string", "format": "uuid"},
}
_REFUSED = (
    "409: the attempt is no longer awaited: deadline_passed (its deadline passed; a retry follows if the job's "
    "retry policy allows one), timed_out (the scheduler ended it so), not_accepted (the receiver's answer to the "
    "attempt was a failure), already_completed (another end was reported: the error names it and when)."
)


def execution_paths(errors: dict[str, Any]) -> dict[str, Any]:
    """``errors``: the usual 400/401/403/404 answers."""
    either: list[dict[str, list[str]]] = [{"bearerAuth": []}, {"completionToken": []}]
    refused = {
        **errors,
        "403": _json(
            _ref("Error"),
            "invalid_token: the completion token does not match the execution's current attempt (forged, or of an "
            "earlier attempt)",
        ),
        "404": _json(
            _ref("Error"),
            "not_found: no such execution of work that completes later, or one of another namespace than the key's",
        ),
        "409": _json(_ref("Error"), _REFUSED),
    }
    body = {
        **refused,
        "413": _json(_ref("Error"), "Too large"),
        "415": _json(_ref("Error"), "Not JSON"),
    }
    return {
        "/v1/executions/{execution_id}:complete": {
            "post": {
                "summary": "Report the end of an execution's work (work that completes later)",
                "description": "Authorised by the namespace's key (or the admin key) or by the completion token "
                "sent with the attempt, alone. A token sent with a key is checked too. The same end reported again "
                "is answered 200 with duplicate: true and changes nothing. " + _REFUSED,
                "operationId": "completeExecution",
                "security": either,
                "parameters": [_EXECUTION_ID],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": _ref("CompletionReport"),
                            "example": {"status": "succeeded", "output": "loaded 1204 rows"},
                        }
                    },
                },
                "responses": {"200": _json(_ref("CompletionRecorded"), "Recorded (or recorded before)"), **body},
            }
        },
        "/v1/executions/{execution_id}:heartbeat": {
            "post": {
                "summary": "The execution's work is alive",
                "description": "No body (or {}). With the job's completion.heartbeat_seconds, the attempt's "
                "deadline moves to now + heartbeat_seconds, never past its timeout. Authorised as :complete is.",
                "operationId": "heartbeatExecution",
                "security": either,
                "parameters": [_EXECUTION_ID],
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": {"type": "object", "additionalProperties": False}}},
                },
                "responses": {"200": _json(_ref("Heartbeat"), "Recorded"), **body},
            }
        },
        "/v1/jobs/{job_id}/flow": {
            "get": {
                "summary": "A job's upstreams and downstreams, its work still running and its missed deadlines",
                "operationId": "getJobFlow",
                "parameters": [
                    {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 128}}
                ],
                "responses": {"200": _json(_ref("JobFlow"), "The job's flow"), **errors},
            }
        },
        "/v1/executions/{execution_id}": {
            "get": {
                "summary": "Where an execution's work (completing later) stands",
                "operationId": "getAsyncExecution",
                "parameters": [_EXECUTION_ID],
                "responses": {
                    "200": _json(_ref("AsyncExecution"), "The execution's latest attempt"),
                    **errors,
                    "404": refused["404"],
                },
            }
        },
    }
