"""Liveness, readiness, metrics, the cluster view and the API description."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.openapi import openapi_document
from cronman.cluster import cluster_view

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
    ok = all(v == "ok" for v in checks.values())
    resp = jsonify({"status": "ready" if ok else "not_ready", "checks": checks})
    resp.status_code = 200 if ok else 503
    return resp


@bp.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(), mimetype=CONTENT_TYPE_LATEST)


@bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(openapi_document())


@bp.get("/v1/cluster")
def cluster() -> Response:
    svc = current_app.extensions["cronman"]
    return jsonify(cluster_view(svc.redis, svc.keys, svc.settings.replication_factor))
