"""Work that finishes later reports to ``/v1/executions/{execution_id}``: ``:complete`` (its end,
succeeded or failed, with a short output) and ``:heartbeat`` (it is alive: its deadline moves on);
``GET`` shows where it stands. Authorised by the namespace's key (or the admin key) or by the
``Cronman-Completion-Token`` the attempt was sent with, alone (see api.auth)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from api.auth import COMPLETION_TOKEN_HEADER, MAX_TOKEN_LENGTH, completion_token
from api.common import json_body, services
from cronman.errors import Forbidden, InvalidInput, Unauthorized
from cronman.model.spec import MAX_OUTPUT_BYTES
from cronman.model.timeutil import iso_dt
from cronman.store.async_runs import REPORTED, AsyncRun, AsyncRunStore, Caller

bp = Blueprint("executions", __name__, url_prefix="/v1/executions")

MAX_REPORT_BYTES = 64 * 1024  # a report's body: the output's 4 KiB as JSON escapes it, and room to say so


def _store() -> AsyncRunStore:
    return AsyncRunStore(services().store.engine)


def _who() -> Caller:
    """The key's caller (and the token, checked too when sent), or the token alone."""
    token = completion_token()
    if token is not None and (not token or len(token) > MAX_TOKEN_LENGTH):
        raise Forbidden(
            f"{COMPLETION_TOKEN_HEADER} must be the token sent with the attempt (1-{MAX_TOKEN_LENGTH} characters)",
            field=COMPLETION_TOKEN_HEADER,
            code="invalid_token",
        )
    found = g.get("cronman_caller")
    if found is not None:
        return Caller(found.namespace, token, found.name, keyed=True)
    if token is None:  # (api.auth lets no such request through)
        raise Unauthorized("send an API key as Authorization: Bearer <key>, or the completion token")
    return Caller(None, token, "token", keyed=False)


def _report(doc: dict[str, Any]) -> tuple[str, str | None]:
    unknown = sorted(set(doc) - {"status", "output"})
    if unknown:
        raise InvalidInput(
            f"unknown field {unknown[0]!r}: a report has status and output", field=unknown[0], code="unknown_field"
        )
    status = doc.get("status")
    if status is None:
        raise InvalidInput('status is required: "succeeded" or "failed"', field="status", code="missing_field")
    if status not in REPORTED:
        raise InvalidInput('status must be "succeeded" or "failed"', field="status", code="invalid_value")
    output = doc.get("output")
    if output is not None:
        if not isinstance(output, str):
            raise InvalidInput("output must be a string", field="output", code="invalid_type")
        if "\x00" in output:
            raise InvalidInput("output must not contain NUL characters", field="output", code="invalid_value")
        size = len(output.encode("utf-8", "surrogatepass"))
        if size > MAX_OUTPUT_BYTES:
            raise InvalidInput(
                f"output must be at most {MAX_OUTPUT_BYTES} bytes of UTF-8 (got {size})",
                field="output",
                code="too_large",
            )
        try:
            output.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput("output must be valid Unicode text", field="output", code="invalid_value") from None
    return status, output


def _empty_or_nothing() -> None:
    """A heartbeat has no body; an empty JSON object is taken too."""
    if request.content_length == 0 or (request.content_length is None and not request.get_data(cache=True)):
        return
    _, doc = json_body(1024)
    if doc:
        key = sorted(doc)[0]
        raise InvalidInput(f"unknown field {key!r}: a heartbeat has no body", field=key, code="unknown_field")


@bp.post("/<execution_id>:complete")
def complete(execution_id: str) -> Response:
    """The work's end: succeeded or failed, with an optional output (at most 4 KiB)."""
    who = _who()
    _, doc = json_body(MAX_REPORT_BYTES)
    status, output = _report(doc)
    run, duplicate = _store().complete(execution_id, who, status, output)
    return jsonify(run.completion_json(duplicate))


@bp.post("/<execution_id>:heartbeat")
def heartbeat(execution_id: str) -> Response:
    """The work is alive; with the job's heartbeat_seconds, its deadline moves that far on."""
    who = _who()
    _empty_or_nothing()
    return jsonify(_store().heartbeat(execution_id, who).heartbeat_json())


def run_json(run: AsyncRun) -> dict[str, Any]:
    return {
        "execution_id": run.execution_id,
        "job_id": run.job_id,
        "namespace": run.namespace,
        "scheduled_for": iso_dt(run.scheduled_for),
        "trigger": run.trigger,
        "attempt": run.attempt,
        "status": run.status,
        "started_at": iso_dt(run.started_at),
        "deadline_at": iso_dt(run.deadline_at),
        "timeout_at": iso_dt(run.timeout_at),
        "last_heartbeat_at": iso_dt(run.last_heartbeat_at),
        "reported_at": iso_dt(run.reported_at),
        "reported_by": run.reported_by,
        "output": run.output,
    }


@bp.get("/<execution_id>")
def get_execution(execution_id: str) -> Response:
    """Where work that completes later stands (the namespace's key)."""
    found = g.get("cronman_caller")
    if found is None:
        raise Unauthorized("send an API key as Authorization: Bearer <key>")
    run = _store().get(execution_id, Caller(found.namespace, None, found.name, keyed=True))
    return jsonify(run_json(run))
