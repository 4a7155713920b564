"""``POST /v1/jobs:batch``: create or replace up to 1000 jobs in one request and one statement.

Each item follows the rules of ``PUT /v1/jobs/{id}`` for the caller's key (an item without an id
gets one, as with ``POST /v1/jobs``). Items are judged one by one: an invalid item is reported and
the valid ones are written all the same, so the answer is a 200 with a result per item.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.common import actor, json_body, now_ms, own_namespace, requested_namespace, services
from api.metrics import api_metrics
from cronman.errors import CronmanError, InvalidInput
from cronman.model.changes import Stop
from cronman.model.namespaces import DEFAULT_NAMESPACE
from cronman.model.spec import JOB_ID_RE, JobSpec, new_job_id
from cronman.model.targets import resolve_callbacks, spec_from_document
from cronman.store.store import StoredJob

bp = Blueprint("batch", __name__)

MAX_BATCH = 1000
MAX_BATCH_BODY_BYTES = 16 * 1024 * 1024


def _items(doc: dict[str, Any]) -> list[Any]:
    unknown = sorted(set(doc) - {"jobs"})
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}", field=unknown[0], code="unknown_field")
    if "jobs" not in doc:
        raise InvalidInput("jobs is required", field="jobs", code="missing_field")
    items = doc["jobs"]
    if not isinstance(items, list):
        raise InvalidInput("jobs must be an array of jobs", field="jobs", code="invalid_type")
    if len(items) > MAX_BATCH:
        raise InvalidInput(f"at most {MAX_BATCH} jobs per batch (got {len(items)})", field="jobs", code="too_large")
    return items


def _given_id(item: Any) -> str | None:
    value = item.get("id") if isinstance(item, dict) else None
    return value if isinstance(value, str) and JOB_ID_RE.match(value) else None


def _result(index: int, job_id: str | None, status: int, error: CronmanError | None = None) -> dict[str, Any]:
    return {"index": index, "id": job_id, "status": status, "error": None if error is None else error.to_dict()}


def _spec(
    item: dict[str, Any], namespace: str | None, current: StoredJob | None, now: int, resolved: dict[str, list[str]]
) -> JobSpec:
    """One item validated by PUT's rules (without a namespace, the admin replaces a job in its own)."""
    lands_in = namespace or (current.namespace if current else DEFAULT_NAMESPACE)
    return spec_from_document(
        item,
        services().settings,
        current.target if current else None,
        None,
        resolved,
        namespace=lands_in,
        now_ms=now,
        stored_schedule=current.schedule if current and current.namespace == lands_in else None,
    )


@bp.post("/v1/jobs:batch")
def put_jobs() -> Response:
    _, doc = json_body(MAX_BATCH_BODY_BYTES)
    items = _items(doc)
    namespace = requested_namespace() or own_namespace()
    svc = services()
    stored = svc.store.stored([i for i in map(_given_id, items) if i], own_namespace())
    now = now_ms()
    resolved: dict[str, list[str]] = {}  # host lookups, shared by the batch's callbacks
    resolve_callbacks(items, svc.settings, resolved)  # side by side, within one timeout
    results: list[dict[str, Any]] = [{}] * len(items)
    valid: list[tuple[JobSpec, str]] = []
    positions: list[int] = []
    for i, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise InvalidInput("each job must be a JSON object", code="invalid_json")
            current = stored.get(_given_id(item) or "")
            spec = _spec(item, namespace, current, now, resolved)
        except CronmanError as exc:
            results[i] = _result(i, _given_id(item), exc.status, exc)
            continue
        valid.append((spec, spec.id or new_job_id()))
        positions.append(i)
    stops: list[Stop] = []
    outcomes = svc.store.put_many(valid, namespace, actor(), {"batch": True}, stops) if valid else []
    created = replaced = 0
    for i, (_, job_id), outcome in zip(positions, valid, outcomes):
        if isinstance(outcome, CronmanError):
            results[i] = _result(i, job_id, outcome.status, outcome)
        elif outcome:
            created += 1
            results[i] = _result(i, job_id, 201)
        else:
            replaced += 1
            results[i] = _result(i, job_id, 200)
    if created or replaced:
        svc.notify_change(stops)
        changes = api_metrics().job_changes
        changes.labels(change="created").inc(created)
        changes.labels(change="updated").inc(replaced)
    return jsonify(
        {"results": results, "created": created, "replaced": replaced, "failed": len(items) - created - replaced}
    )
