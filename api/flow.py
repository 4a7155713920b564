"""``GET /v1/jobs/{job_id}/flow``: the job's place among others and its work in flight (see
cronman.store.flow): the jobs it waits for and those that wait for it, its executions whose work is
still running, and its latest missed deadlines, as the dashboard's job page shows them."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.common import own_namespace, services
from cronman.model.timeutil import iso_dt
from cronman.store.flow import Edge, job_flow

bp = Blueprint("flow", __name__, url_prefix="/v1/jobs")


def _edge(e: Edge) -> dict[str, Any]:
    return {"job_id": e.job_id, "kind": e.kind, "within_seconds": e.within_ms // 1000, "exists": e.live}


@bp.get("/<job_id>/flow")
def get_flow(job_id: str) -> Response:
    record = services().store.get(job_id, own_namespace())
    f = job_flow(services().store.engine, record.namespace, record.id, record.created_at)
    return jsonify(
        {
            "job_id": record.id,
            "upstreams": [_edge(e) for e in f.upstreams],
            "downstreams": [_edge(e) for e in f.downstreams],
            "running": [
                {
                    "execution_id": r.execution_id,
                    "scheduled_for": iso_dt(r.scheduled_for),
                    "attempt": r.attempt,
                    "started_at": iso_dt(r.started_at),
                    "deadline_at": iso_dt(r.deadline_at),
                    "last_heartbeat_at": None if r.last_heartbeat_at is None else iso_dt(r.last_heartbeat_at),
                }
                for r in f.running
            ],
            "deadline_misses": [
                {
                    "execution_id": m.execution_id,
                    "scheduled_for": iso_dt(m.scheduled_for),
                    "deadline_at": iso_dt(m.deadline_at),
                    "status": m.status,
                }
                for m in f.misses
            ],
        }
    )
