"""Liveness, readiness, metrics, the cluster view and the API description."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from api.metrics import render_metrics
from api.openapi import openapi_document
from cronman.redis.cluster import cluster_view

bp = Blueprint("ops", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    svc = current_app.extensions["cronman"]
    checks: dict[str, str] = {}
    try:
        svc.store.ping()
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - report, do not raise
        checks["database"] = f"unavailable: {type(exc).__name__}"
    try:
        svc.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:  # noqa: BLE001
        checks["redis"] = f"unavailable: {type(exc).__name__}"
    # Jobs are read and written in PostgreSQL alone; without Redis the API still serves them (nodes
    # then learn of changes by polling), so only the database decides readiness.
    ok = checks["database"] == "ok"
    resp = jsonify({"status": "ready" if ok else "not_ready", "checks": checks})
    resp.status_code = 200 if ok else 503
    return resp


@bp.get("/metrics")
def metrics() -> Response:
    """Every worker's series, added up (prometheus_client multiprocess mode under gunicorn)."""
    return render_metrics()


@bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(openapi_document())


@bp.get("/v1/cluster")
def cluster() -> Response:
    svc = current_app.extensions["cronman"]
    s = svc.settings
    return jsonify(cluster_view(svc.redis, svc.keys, s.replication_factor, s.heartbeat_interval_seconds))
