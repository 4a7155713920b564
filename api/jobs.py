"""/v1/jobs: create, read, update, delete, pause, resume, trigger; next fire times; history."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from api.auth import caller
from api.targets import check_callback, has_placeholder, redact_target, restore_secrets
from cronman.apikeys import DEFAULT_NAMESPACE, check_namespace
from cronman.errors import Conflict, Forbidden, InvalidInput, NotFound, PayloadTooLarge, UnsupportedMediaType
from cronman.execution import Trigger, execution_id
from cronman.schedule import next_times, timing_from_dict
from cronman.spec import JOB_ID_RE, JobSpec, options_with_defaults, parse_job
from cronman.store import ExecutionRecord, JobRecord, decode_cursor, encode_cursor
from cronman.timeutil import iso, iso_dt, parse_iso

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")

_JSON_TYPES = ("application/json", "application/merge-patch+json")
MAX_LIST = 1000
MAX_NEXT = 100


def _services():  # type: ignore[no-untyped-def]
    return current_app.extensions["cronman"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _namespace() -> str | None:
    """The caller's namespace (None: every namespace, for the admin key)."""
    return caller().namespace


def _requested_namespace() -> str | None:
    """The ``namespace`` query parameter: the admin key's way to act in a namespace; a namespace
    key may name only its own."""
    requested = request.args.get("namespace")
    if requested is None:
        return None
    check_namespace(requested)
    own = _namespace()
    if own is not None and requested != own:
        raise Forbidden(f"this key belongs to namespace {own!r}; it cannot act in {requested!r}", field="namespace")
    return requested


def _spec(raw: bytes, doc: dict[str, Any], stored_target: dict[str, Any] | None) -> JobSpec:
    """Validate a job document (after restoring redacted header values) and check its callback."""
    body = json.dumps(restore_secrets(doc, stored_target)) if has_placeholder(doc) else raw
    spec = parse_job(body)
    check_callback(spec, _services().settings)
    return spec


def _json_body() -> tuple[bytes, dict[str, Any]]:
    mimetype = request.mimetype or ""
    if mimetype not in _JSON_TYPES:
        raise UnsupportedMediaType(
            f"send the body as JSON with Content-Type: application/json (got {mimetype or 'none'!r})",
            field="Content-Type",
        )
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    too_large = PayloadTooLarge(f"the request body exceeds {limit} bytes", field="body")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise too_large from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object", code="invalid_json")
    return raw, doc


def _check_path_id(job_id: str) -> None:
    if not JOB_ID_RE.match(job_id):
        raise NotFound(f"no job with id {job_id!r}", field="id")


def _int_arg(name: str, default: int, lo: int, hi: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer", field=name) from None
    if not lo <= value <= hi:
        raise InvalidInput(f"{name} must be between {lo} and {hi}", field=name)
    return value


def _type_first(d: dict[str, Any]) -> dict[str, Any]:
    return {"type": d.get("type"), **d}


def job_json(r: JobRecord, now_ms: int) -> dict[str, Any]:
    timing = timing_from_dict(r.schedule, r.id)
    nxt = None if r.paused else timing.next_after(now_ms)
    doc: dict[str, Any] = {"id": r.id, "namespace": r.namespace}
    if r.name is not None:
        doc["name"] = r.name
    doc.update(
        schedule=_type_first(r.schedule),
        target=_type_first(redact_target(r.target)),
        payload=json.loads(r.payload),
        retry=r.retry,
        paused=r.paused,
        **options_with_defaults(r.options),
        state="paused" if r.paused else ("active" if nxt is not None else "completed"),
        created_at=iso_dt(r.created_at),
        updated_at=iso_dt(r.updated_at),
        version=r.version,
        next_fire_at=None if nxt is None else iso(nxt),
    )
    return doc


def execution_json(e: ExecutionRecord) -> dict[str, Any]:
    return {
        "execution_id": e.execution_id,
        "job_id": e.job_id,
        "scheduled_for": iso_dt(e.scheduled_for),
        "event_index": e.event_index,
        "attempt": e.attempt,
        "trigger": e.trigger,
        "status": e.status,
        "node": e.node,
        "fired_at": iso_dt(e.fired_at),
        "finished_at": iso_dt(e.finished_at),
        "lag_ms": e.lag_ms,
        "http_status": e.http_status,
        "error": e.error,
        "duplicates": e.duplicates,
        "throttle_wait_ms": e.throttle_wait_ms,
        "dead_lettered": e.dead_lettered,
    }


def _job_response(record: JobRecord, status: int) -> Response:
    resp = jsonify(job_json(record, _now_ms()))
    resp.status_code = status
    if status == 201:
        resp.headers["Location"] = f"/v1/jobs/{record.id}"
    return resp


@bp.post("")
def create_job() -> Response:
    raw, doc = _json_body()
    namespace = _requested_namespace() or _namespace() or DEFAULT_NAMESPACE
    spec = _spec(raw, doc, None)
    job_id = spec.id or f"job-{uuid.uuid4().hex}"
    svc = _services()
    record = svc.store.create(spec, job_id, namespace)
    svc.notify_change()
    return _job_response(record, 201)


@bp.get("")
def list_jobs() -> Response:
    limit = _int_arg("limit", 100, 1, MAX_LIST)
    cursor = request.args.get("cursor") or None
    after = decode_cursor(cursor, (str,))[0] if cursor else None
    records = _services().store.list_jobs(_requested_namespace() or _namespace(), limit + 1, after)
    more = len(records) > limit
    records = records[:limit]
    now = _now_ms()
    return jsonify(
        {
            "jobs": [job_json(r, now) for r in records],
            "next_cursor": encode_cursor([records[-1].id]) if more else None,
        }
    )


@bp.get("/<job_id>")
def get_job(job_id: str) -> Response:
    _check_path_id(job_id)
    return _job_response(_services().store.get(job_id, _namespace()), 200)


@bp.put("/<job_id>")
def put_job(job_id: str) -> Response:
    raw, doc = _json_body()
    if not JOB_ID_RE.match(job_id):
        raise InvalidInput(
            "id must be 1-128 characters: letters, digits, '.', '_', ':' or '-'", field="id", code="invalid_value"
        )
    if doc.get("id", job_id) != job_id:
        raise InvalidInput("the id in the body differs from the id in the path", field="id", code="invalid_value")
    namespace = _requested_namespace() or _namespace()
    svc = _services()
    stored = None
    if has_placeholder(doc):
        try:
            stored = svc.store.get(job_id, _namespace()).target
        except NotFound:
            stored = None
    spec = _spec(raw, doc, stored)
    try:
        record, created = svc.store.put(spec, job_id, namespace)
    except Conflict:
        if _namespace() is None:
            raise
        # Like every other single-job operation, another namespace's job is "not found" here.
        raise NotFound(f"no job with id {job_id!r} in this namespace, and the id is taken", field="id") from None
    svc.notify_change()
    return _job_response(record, 201 if created else 200)


def _merge(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch, except that a nested object whose ``type`` changes is replaced whole
    and ``payload`` is always replaced (it is the user's document, not ours to merge)."""
    out = dict(current)
    for key, value in patch.items():
        old = out.get(key)
        if value is None:
            out.pop(key, None)
        elif (
            key != "payload"
            and isinstance(value, dict)
            and isinstance(old, dict)
            and value.get("type", old.get("type")) == old.get("type")
        ):
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


@bp.patch("/<job_id>")
def patch_job(job_id: str) -> Response:
    _check_path_id(job_id)
    _, patch = _json_body()
    if patch.get("id", job_id) != job_id:
        raise InvalidInput("a job's id cannot be changed", field="id", code="invalid_value")
    svc = _services()
    current = svc.store.get(job_id, _namespace())
    merged = _merge(current.spec_document(), patch)
    spec = _spec(json.dumps(merged).encode(), merged, current.target)
    record = svc.store.replace_checked(job_id, _namespace(), current.version, spec)
    svc.notify_change()
    return _job_response(record, 200)


@bp.delete("/<job_id>")
def delete_job(job_id: str) -> Response:
    _check_path_id(job_id)
    svc = _services()
    svc.store.delete(job_id, _namespace())
    svc.notify_change()
    return Response(status=204)


@bp.get("/<job_id>/next")
def next_fire_times(job_id: str) -> Response:
    _check_path_id(job_id)
    count = _int_arg("count", 5, 1, MAX_NEXT)
    after_raw = request.args.get("after")
    if after_raw:
        try:
            after = parse_iso(after_raw)
        except ValueError as exc:
            raise InvalidInput(f"after must be an ISO-8601 timestamp with an offset: {exc}", field="after") from None
    else:
        after = _now_ms()
    record = _services().store.get(job_id, _namespace())
    times = next_times(timing_from_dict(record.schedule, record.id), after, count)
    return jsonify({"next": [iso(t) for t in times]})


@bp.get("/<job_id>/executions")
def list_executions(job_id: str) -> Response:
    _check_path_id(job_id)
    limit = _int_arg("limit", 100, 1, MAX_LIST)
    svc = _services()
    svc.store.get(job_id, _namespace())
    rows, next_cursor = svc.store.executions(job_id, limit, request.args.get("cursor") or None)
    return jsonify({"executions": [execution_json(e) for e in rows], "next_cursor": next_cursor})


def _set_paused(job_id: str, paused: bool) -> Response:
    _check_path_id(job_id)
    svc = _services()
    record = svc.store.set_paused(job_id, _namespace(), paused)
    svc.notify_change()
    return _job_response(record, 200)


@bp.post("/<job_id>/pause")
def pause_job(job_id: str) -> Response:
    return _set_paused(job_id, True)


@bp.post("/<job_id>/resume")
def resume_job(job_id: str) -> Response:
    return _set_paused(job_id, False)


@bp.post("/<job_id>/trigger")
def trigger_job(job_id: str) -> Response:
    _check_path_id(job_id)
    svc = _services()
    requested = svc.store.add_trigger(job_id, _namespace(), request.remote_addr)
    svc.notify_change()
    resp = jsonify(
        {
            "job_id": job_id,
            "execution_id": execution_id(job_id, requested, 0, Trigger.MANUAL),
            "scheduled_for": iso(requested),
        }
    )
    resp.status_code = 202
    return resp
