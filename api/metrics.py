"""Prometheus series and one JSON access line per API request.

Under gunicorn each worker is its own process, so the series use prometheus_client's multiprocess
mode: ``cronman api`` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before the workers
fork (see :mod:`api.server`), every worker writes its samples to files there, and ``/metrics``
adds them up whichever worker answers. Without that variable (tests, an embedded app) the
process's default registry is used.

Series are labelled by the route template (``/v1/jobs/<job_id>``), never the raw path, so a
client cannot create series at will.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

log = logging.getLogger("cronman.api.access")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_VALIDATION_STATUSES = frozenset({400, 413, 415, 422})
UNMATCHED = "<unmatched>"
# Probes and scrapes arrive every few seconds: their access lines are debug-level.
_QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
JOB_CHANGES = ("created", "updated", "deleted")


class ApiMetrics:
    def __init__(self) -> None:
        self.requests = Counter(
            "cronman_api_requests", "API requests, by method, route template and status", ["method", "route", "status"]
        )
        self.latency = Histogram(
            "cronman_api_request_duration_seconds",
            "API request latency, by method and route template",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
        )
        self.job_changes = Counter(
            "cronman_api_job_changes", "Jobs created, updated or deleted through the API", ["change"]
        )
        self.validation_errors = Counter(
            "cronman_api_validation_errors", "Requests refused as invalid, by error code", ["code"]
        )
        for change in JOB_CHANGES:
            self.job_changes.labels(change=change)
        # The watchdog and the notification dispatcher, when a worker of this process leads them.
        self.occurrences_late = Counter(
            "cronman_occurrences_late", "Occurrences nobody took up within late_after_seconds"
        )
        self.deadlines_missed = Counter(
            "cronman_deadlines_missed", "Occurrences not succeeded within their job's deadline_seconds"
        )
        self.notifications = Counter("cronman_notifications", "Notification attempts, by result", ["result"])


@functools.cache
def api_metrics() -> ApiMetrics:
    """The process's series, created on first use: in a gunicorn worker, after the fork and after
    ``cronman api`` has set the multiprocess directory."""
    if os.environ.get(MULTIPROC_ENV) and not getattr(values.ValueClass, "_multiprocess", False):
        # prometheus_client chose its value class when first imported; choose again now the directory is set.
        values.ValueClass = values.get_value_class()
    return ApiMetrics()


def multiprocess_dir() -> str | None:
    path = os.environ.get(MULTIPROC_ENV)
    return path if path and os.path.isdir(path) else None


def render_metrics() -> Response:
    path = multiprocess_dir()
    if path:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)
        body = generate_latest(registry)
    else:
        body = generate_latest(REGISTRY)
    return Response(body, content_type=CONTENT_TYPE_LATEST)


def job_change(method: str, route: str, status: int) -> str | None:
    """What a successful request did to a job, from its method, route template and status."""
    if not 200 <= status < 300 or not route.startswith("/v1/jobs"):
        return None
    if method == "POST" and route == "/v1/jobs":
        return "created"
    if method == "PUT":
        return "created" if status == 201 else "updated"
    if method == "PATCH" or (method == "POST" and route.endswith(("/pause", "/resume"))):
        return "updated"
    if method == "DELETE":
        return "deleted"
    return None


def note_error(code: str) -> None:
    """Remember the error code of the response being built (read by the after-request hook)."""
    g.cronman_error_code = code


# The series a request of one method, route template and status counts in, found once: a request
# spent more on ``labels()`` than on the counting. Bounded: methods, templates and statuses are few.
_series: dict[tuple[str, str, int], tuple[Any, Any, Any]] = {}


def _series_of(m: ApiMetrics, method: str, route: str, status: int) -> tuple[Any, Any, Any]:
    change = job_change(method, route, status)
    series = (
        m.requests.labels(method=method, route=route, status=str(status)),
        m.latency.labels(method=method, route=route),
        m.job_changes.labels(change=change) if change else None,
    )
    _series[(method, route, status)] = series
    return series


def _start() -> None:
    g.cronman_t0 = time.perf_counter()


def _finish(response: Response) -> Response:
    t0 = g.get("cronman_t0")
    elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
    rule = request.url_rule
    route = rule.rule if rule is not None else UNMATCHED
    method = request.method if request.method in _METHODS else "OTHER"
    status = response.status_code
    m = api_metrics()
    series = _series.get((method, route, status))
    if series is None:
        series = _series_of(m, method, route, status)
    requests, latency, changes = series
    requests.inc()
    latency.observe(elapsed)
    if changes is not None:
        changes.inc()
    code = g.get("cronman_error_code")
    if code and status in _VALIDATION_STATUSES:
        m.validation_errors.labels(code=code).inc()
    level = logging.DEBUG if route in _QUIET_ROUTES else logging.INFO
    if log.isEnabledFor(level):
        fields: dict[str, object] = {
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": round(elapsed * 1000, 2),
        }
        job_id = (request.view_args or {}).get("job_id")
        if job_id is not None:
            fields["job_id"] = job_id
        if code:
            fields["error_code"] = code
        log.log(level, "%s %s %d", method, route, status, extra=fields)
    return response


def init_app(app: Flask) -> None:
    api_metrics()
    # First among the before-request hooks, so a hook that answers early (authentication) is timed too.
    app.before_request_funcs.setdefault(None, []).insert(0, _start)
    app.after_request(_finish)
