"""/v1/jobs: create, read, update, delete, pause, resume, trigger, redeliver; next fire times; history
and events. Every change records who made it (a job event) in its own transaction."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from flask import Blueprint, Response, jsonify, request

from api.common import (
    actor,
    int_arg,
    json_body,
    now_ms,
    own_namespace,
    requested_namespace,
    services,
    stops_of,
    target_namespace,
)
from cronman.errors import Conflict, InvalidInput, NotFound
from cronman.model.calendars import Calendar
from cronman.model.changes import Stop
from cronman.model.execution import Trigger, execution_id
from cronman.model.labels import parse_selector
from cronman.model.namespaces import DEFAULT_NAMESPACE
from cronman.model.schedule import Timing
from cronman.model.spec import JOB_ID_RE, new_job_id, options_with_defaults
from cronman.model.targets import redact_target, spec_from_document
from cronman.model.timeutil import MAX_INSTANT_MS, MIN_INSTANT_MS, iso, iso_dt, parse_iso
from cronman.store.audit import JobEvent
from cronman.store.calendar_store import CalendarStore, job_timing, names_of
from cronman.store.commands import patch_job as apply_patch
from cronman.store.health import NO_HEALTH, Health, health_json, health_of, paused_reason_of
from cronman.store.store import ExecutionRecord, JobRecord, decode_cursor, encode_cursor

log = logging.getLogger("cronman.api.jobs")

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")

MAX_LIST = 1000
MAX_NEXT = 100
MAX_SEARCH = 200
_LOGGED_MAX = 10_000
_logged: set[tuple[str, int, str]] = set()  # (id, version, updated_at) of jobs whose schedule did not compute


def _check_path_id(job_id: str) -> None:
    if not JOB_ID_RE.match(job_id):
        raise NotFound(f"no job with id {job_id!r}", field="id")


def _search_arg() -> str | None:
    """``q``: a part of the id or the name to look for."""
    q = request.args.get("q") or None
    if q is not None and (len(q) > MAX_SEARCH or any(ord(c) < 0x20 for c in q)):
        raise InvalidInput(
            f"q must be at most {MAX_SEARCH} characters, without control characters", field="q", code="invalid_value"
        )
    return q


def _type_first(d: dict[str, Any]) -> dict[str, Any]:
    return {"type": d.get("type"), **d}


def _unschedulable(r: JobRecord, exc: Exception) -> None:
    """Log, once per job version, a stored job whose next time cannot be computed."""
    seen = (r.id, r.version, str(r.updated_at))
    if seen in _logged:
        return
    if len(_logged) >= _LOGGED_MAX:
        _logged.clear()
    _logged.add(seen)
    log.warning(
        "cannot compute the next fire time of a stored job: %s: %s",
        type(exc).__name__,
        exc,
        extra={"job_id": r.id, "namespace": r.namespace, "version": r.version},
    )


Calendars = Mapping[tuple[str, str], Calendar]


def calendars_of(records: Iterable[JobRecord]) -> Calendars:
    """The calendars these jobs name, by (namespace, name): one query, none when no job names any."""
    pairs = {(r.namespace, n) for r in records for n in names_of(r.options)}
    return CalendarStore(services().store.engine).named(pairs) if pairs else {}


def _timing(r: JobRecord, calendars: Calendars) -> Timing:
    return job_timing(r.id, r.namespace, r.schedule, r.options, calendars)


def _next_fire(r: JobRecord, after_ms: int, calendars: Calendars) -> str | None:
    """The job's next fire time after ``after_ms`` (on a day its calendars do not exclude), or None:
    when it has none, and when a stored schedule cannot be computed (a job written before today's
    limits must not break a page)."""
    try:
        nxt = _timing(r, calendars).next_after(after_ms)
        return None if nxt is None else iso(nxt)
    except Exception as exc:  # noqa: BLE001 - stored data is not trusted to be computable
        _unschedulable(r, exc)
        return None


def job_json(
    r: JobRecord, at_ms: int, health: Health = NO_HEALTH, calendars: Calendars | None = None
) -> dict[str, Any]:
    if calendars is None:
        calendars = calendars_of([r])
    nxt = None if r.paused else _next_fire(r, at_ms, calendars)
    # An after job has no times of its own (next_fire_at null): it runs on while its upstreams do.
    done = nxt is None and r.schedule.get("type") != "after"
    doc: dict[str, Any] = {"id": r.id, "namespace": r.namespace}
    if r.name is not None:
        doc["name"] = r.name
    doc["labels"] = r.labels
    doc.update(
        schedule=_type_first(r.schedule),
        target=_type_first(redact_target(r.target)),
        payload=json.loads(r.payload),
        retry=r.retry,
        paused=r.paused,
        **options_with_defaults(r.options),
        state="paused" if r.paused else ("completed" if done else "active"),
        health=health_json(health, paused=r.paused, completed=done),
        paused_reason=paused_reason_of(r.paused, r.paused_reason, iso_dt(r.updated_at)),
        created_at=iso_dt(r.created_at),
        updated_at=iso_dt(r.updated_at),
        version=r.version,
        next_fire_at=nxt,
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
        "response": e.response,
        "occurrences": e.occurrences,
        "last_scheduled_for": iso_dt(e.last_scheduled_for),
        "upstream_execution_ids": list(e.upstream_execution_ids or ()),
        "started_at": iso_dt(e.started_at),
        "deadline_at": iso_dt(e.deadline_at),
    }


def _health(records: list[JobRecord]) -> dict[str, Health]:
    with services().store.engine.connect() as conn:
        return health_of(conn, [(r.id, r.incarnation) for r in records])


def _job_response(record: JobRecord, status: int) -> Response:
    # A job just created (201) is a new incarnation: it has no health yet, and no query asks.
    health = NO_HEALTH if status == 201 else _health([record]).get(record.id, NO_HEALTH)
    resp = jsonify(job_json(record, now_ms(), health))
    resp.status_code = status
    resp.headers["ETag"] = f'"{record.version}"'
    if status == 201:
        resp.headers["Location"] = f"/v1/jobs/{record.id}"
    return resp


@bp.post("")
def create_job() -> Response:
    raw, doc = json_body()
    namespace = target_namespace()
    svc = services()
    spec = spec_from_document(doc, svc.settings, None, raw, namespace=namespace, now_ms=now_ms())
    job_id = spec.id or new_job_id()
    record = svc.store.create(spec, job_id, namespace, actor())
    svc.notify_change()
    return _job_response(record, 201)


@bp.get("")
def list_jobs() -> Response:
    limit = int_arg("limit", 100, 1, MAX_LIST)
    cursor = request.args.get("cursor") or None
    after = decode_cursor(cursor, (str,))[0] if cursor else None
    selector = parse_selector(request.args.get("selector", ""))
    records = services().store.list_jobs(
        requested_namespace() or own_namespace(), limit + 1, after, selector=selector, search=_search_arg()
    )
    more = len(records) > limit
    records = records[:limit]
    now = now_ms()
    health = _health(records)
    calendars = calendars_of(records)
    return jsonify(
        {
            "jobs": [job_json(r, now, health.get(r.id, NO_HEALTH), calendars) for r in records],
            "next_cursor": encode_cursor([records[-1].id]) if more else None,
        }
    )


@bp.get("/<job_id>")
def get_job(job_id: str) -> Response:
    _check_path_id(job_id)
    return _job_response(services().store.get(job_id, own_namespace()), 200)


@bp.put("/<job_id>")
def put_job(job_id: str) -> Response:
    raw, doc = json_body()
    if not JOB_ID_RE.match(job_id):
        raise InvalidInput(
            "id must be 1-128 characters: letters, digits, '.', '_', ':' or '-'", field="id", code="invalid_value"
        )
    if doc.get("id", job_id) != job_id:
        raise InvalidInput("the id in the body differs from the id in the path", field="id", code="invalid_value")
    namespace = requested_namespace() or own_namespace()
    svc = services()
    try:
        current: JobRecord | None = svc.store.get(job_id, own_namespace())
    except NotFound:
        current = None
    # The namespace the job will be in: the admin replacing a job without naming one keeps the job's.
    lands_in = namespace or (current.namespace if current else DEFAULT_NAMESPACE)
    spec = spec_from_document(
        doc,
        svc.settings,
        current.target if current else None,
        raw,
        namespace=lands_in,
        now_ms=now_ms(),
        stored_schedule=current.schedule if current and current.namespace == lands_in else None,
    )
    try:
        record, created = svc.store.put(spec, job_id, namespace, actor())
    except Conflict:
        if own_namespace() is None:
            raise
        # Like every other single-job operation, another namespace's job is "not found" here.
        raise NotFound(f"no job with id {job_id!r} in this namespace, and the id is taken", field="id") from None
    svc.notify_change(stops_of(record))
    return _job_response(record, 201 if created else 200)


@bp.patch("/<job_id>")
def patch_job(job_id: str) -> Response:
    _check_path_id(job_id)
    _, patch = json_body()
    svc = services()
    record = apply_patch(svc.store, svc.settings, job_id, own_namespace(), patch, actor(), now_ms())
    svc.notify_change(stops_of(record))
    return _job_response(record, 200)


def _if_match() -> set[int] | None:
    """The versions ``If-Match`` allows (entity tags are job versions: ``If-Match: "42"``); None
    when the header is absent or ``*`` (any version of a job that exists)."""
    if "If-Match" not in request.headers or request.if_match.star_tag:
        return None
    tags = request.if_match.as_set()  # strong comparison: weak tags never match
    if not tags or not all(t and t.isdigit() and len(t) <= 18 for t in tags):
        raise InvalidInput(
            'If-Match must hold job versions as entity tags, e.g. If-Match: "42" (the job\'s version), or *',
            field="If-Match",
            code="invalid_if_match",
        )
    return {int(t) for t in tags}


@bp.delete("/<job_id>")
def delete_job(job_id: str) -> Response:
    """Delete; with ``If-Match``, only while the job is at one of the versions it names (else 412)."""
    _check_path_id(job_id)
    versions = _if_match()
    svc = services()
    version = svc.store.delete(job_id, own_namespace(), actor(), versions=versions)
    svc.notify_change([Stop(job_id, version, deleted=True)])
    return Response(status=204)


@bp.get("/<job_id>/next")
def next_fire_times(job_id: str) -> Response:
    _check_path_id(job_id)
    count = int_arg("count", 5, 1, MAX_NEXT)
    after_raw = request.args.get("after")
    if after_raw:
        try:
            after = parse_iso(after_raw)
        except (ValueError, OverflowError) as exc:
            raise InvalidInput(f"after must be an ISO-8601 timestamp with an offset: {exc}", field="after") from None
        if not MIN_INSTANT_MS <= after < MAX_INSTANT_MS:
            raise InvalidInput(
                f"after must lie from {iso(MIN_INSTANT_MS)} to before {iso(MAX_INSTANT_MS)}", field="after"
            )
    else:
        after = now_ms()
    record = services().store.get(job_id, own_namespace())
    return jsonify({"next": _next_times(record, after, count)})


def _next_times(record: JobRecord, after_ms: int, count: int) -> list[str]:
    """Up to ``count`` fire times after ``after_ms`` on days the job's calendars do not exclude,
    as far as a stored schedule can be computed."""
    out: list[str] = []
    calendars = calendars_of([record])
    try:
        timing: Timing = _timing(record, calendars)
        t: int | None = after_ms
        while len(out) < count and t is not None:
            t = timing.next_after(t)
            if t is not None:
                out.append(iso(t))
    except Exception as exc:  # noqa: BLE001 - stored data is not trusted to be computable
        _unschedulable(record, exc)
    return out


@bp.get("/<job_id>/executions")
def list_executions(job_id: str) -> Response:
    _check_path_id(job_id)
    limit = int_arg("limit", 100, 1, MAX_LIST)
    rows, next_cursor = services().store.executions(job_id, own_namespace(), limit, request.args.get("cursor") or None)
    return jsonify({"executions": [execution_json(e) for e in rows], "next_cursor": next_cursor})


def _set_paused(job_id: str, paused: bool) -> Response:
    _check_path_id(job_id)
    svc = services()
    record = svc.store.set_paused(job_id, own_namespace(), paused, actor())
    svc.notify_change(stops_of(record))
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
    svc = services()
    requested = svc.store.add_trigger(job_id, own_namespace(), request.remote_addr, actor())
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


@bp.post("/<job_id>/executions/<execution_id>/redeliver")
def redeliver_execution(job_id: str, execution_id: str) -> Response:
    """Send a failed execution again, under its own execution id, as its next attempt."""
    _check_path_id(job_id)
    svc = services()
    _, attempt = svc.store.add_redelivery(job_id, own_namespace(), execution_id, request.remote_addr, actor())
    svc.notify_change()
    resp = jsonify({"job_id": job_id, "execution_id": str(uuid.UUID(execution_id)), "attempt": attempt})
    resp.status_code = 202
    return resp


def event_json(e: JobEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "job_id": e.job_id,
        "namespace": e.namespace,
        "at": iso_dt(e.at),
        "action": e.action,
        "actor": e.actor,
        "detail": e.detail,
    }


@bp.get("/<job_id>/events")
def list_events(job_id: str) -> Response:
    """Who did what to the job, newest first (a deleted job's events stay readable)."""
    _check_path_id(job_id)
    limit = int_arg("limit", 100, 1, MAX_LIST)
    rows, next_cursor = services().store.events(job_id, own_namespace(), limit, request.args.get("cursor") or None)
    return jsonify({"events": [event_json(e) for e in rows], "next_cursor": next_cursor})
