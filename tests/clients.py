"""Flask test clients with a key, JSON requests, and a minimal valid job document."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Flask
from flask.testing import FlaskClient


def keyed(app: Flask, key: str | None) -> FlaskClient:
    """A test client that sends ``key`` with every request (none when ``key`` is None)."""
    client = app.test_client()
    if key is not None:
        client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return client


def send(client: FlaskClient, method: str, path: str, doc: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
    if doc is None:
        return client.open(path, method=method.upper(), **kw)
    return client.open(path, method=method.upper(), data=json.dumps(doc), content_type="application/json", **kw)


def job(job_id: str | None = "job-1", url: str = "https://example.com/hook", **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schedule": {"type": "interval", "every_seconds": 3600},
        "target": {"type": "http", "url": url},
        "payload": {"n": 1},
        **extra,
    }
    if job_id is not None:
        doc["id"] = job_id
    return doc


def create(client: FlaskClient, job_id: str, schedule: dict[str, Any], target: dict[str, Any], **extra: Any) -> dict:
    """Create a job through the API (asserting the 201); returns the record."""
    r = client.post(
        "/v1/jobs",
        data=json.dumps({"id": job_id, "schedule": schedule, "target": target, **extra}),
        content_type="application/json",
    )
    assert r.status_code == 201, r.json
    return r.json  # type: ignore[no-any-return]


def at(seconds: float) -> str:
    """The instant ``seconds`` from now, as the API takes it (ISO-8601, milliseconds, Z)."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
