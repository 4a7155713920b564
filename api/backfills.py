"""Backfills: ``POST /v1/jobs/{id}/backfill`` delivers a job's occurrences in a past range again, as
executions of their own, at a bounded rate; ``/v1/backfills/{id}`` shows the progress and cancels.
The scheduler nodes pick a new backfill up on the change notification (cronman.model.backfills,
scheduler_node.backfill)."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Response, jsonify

from api.common import actor, int_arg, json_body, now_ms, own_namespace, services
from cronman.errors import InvalidInput, NotFound
from cronman.model.backfills import BACKFILL_ID_PATTERN, BackfillLimits, check_range, parse_backfill
from cronman.model.spec import JOB_ID_RE
from cronman.model.timeutil import iso_dt
from cronman.store.backfill_store import Backfill, BackfillStore
from cronman.store.calendar_store import CalendarStore, names_of

bp = Blueprint("backfills", __name__)

_ID_RE = re.compile(BACKFILL_ID_PATTERN)
MAX_LIST = 100


def _store() -> BackfillStore:
    return BackfillStore(services().store.engine)


def backfill_json(b: Backfill) -> dict[str, Any]:
    return {
        "id": b.id,
        "job_id": b.job_id,
        "namespace": b.namespace,
        "state": b.state.value,
        "from": iso_dt(b.from_at),
        "to": iso_dt(b.to_at),
        "max_per_second": b.max_per_second,
        "total": b.total,
        "dispatched": b.dispatched,
        "delivered": b.delivered,
        "failed": b.failed,
        "skipped": b.skipped,
        "pending": b.pending,
        "driver": b.driver,
        "reason": b.reason,
        "created_by": b.created_by,
        "created_at": iso_dt(b.created_at),
        "updated_at": iso_dt(b.updated_at),
    }


def _job_id(job_id: str) -> str:
    if not JOB_ID_RE.match(job_id):
        raise NotFound(f"no job with id {job_id!r}", field="id")
    return job_id


def _known_id(backfill_id: str) -> str:
    if not _ID_RE.match(backfill_id):
        raise NotFound(f"no backfill {backfill_id!r}", field="id")
    return backfill_id


@bp.post("/v1/jobs/<job_id>/backfill")
def create_backfill(job_id: str) -> Response:
    _job_id(job_id)
    raw, _ = json_body()
    spec = parse_backfill(raw)
    svc = services()
    range_ms = check_range(spec, now_ms(), svc.settings.history_retention_days)
    record = svc.store.get(job_id, own_namespace())
    if record.schedule.get("type") == "after":
        raise InvalidInput(
            f"job {job_id!r} runs after other jobs (schedule type after): it has no times of its own to "
            "backfill; backfill its upstreams instead",
            field="job_id",
            code="not_backfillable",
        )
    names = names_of(record.options)
    found = CalendarStore(svc.store.engine).named({(record.namespace, n) for n in names})
    limits = BackfillLimits.of(svc.settings)
    backfill = _store().create(record, spec, range_ms, {n: c for (_, n), c in found.items()}, actor(), limits)
    svc.notify_change()
    resp = jsonify(backfill_json(backfill))
    resp.status_code = 202
    resp.headers["Location"] = f"/v1/backfills/{backfill.id}"
    return resp


@bp.get("/v1/jobs/<job_id>/backfills")
def list_job_backfills(job_id: str) -> Response:
    """The job's backfills, newest first."""
    _job_id(job_id)
    limit = int_arg("limit", 20, 1, MAX_LIST)
    record = services().store.get(job_id, own_namespace())
    return jsonify({"backfills": [backfill_json(b) for b in _store().of_job(record, limit)]})


@bp.get("/v1/backfills/<backfill_id>")
def get_backfill(backfill_id: str) -> Response:
    return jsonify(backfill_json(_store().get(_known_id(backfill_id), own_namespace())))


@bp.delete("/v1/backfills/<backfill_id>")
def cancel_backfill(backfill_id: str) -> Response:
    """Cancel: nothing more is handed out; executions waiting to retry are cancelled."""
    backfill = _store().cancel(_known_id(backfill_id), own_namespace(), actor())
    services().notify_change()
    return jsonify(backfill_json(backfill))
