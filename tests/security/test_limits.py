"""Every limit on input is a clear 4xx naming the code and the field, and nothing is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import text

from tests.security.conftest import job, send


def _headers(headers: dict[str, str]) -> dict[str, Any]:
    doc = job("limited")
    doc["target"]["headers"] = headers
    return doc


CASES: list[tuple[str, Any, int, str, str]] = [
    (
        "body over 1 MiB",
        b'{"payload": "' + b"a" * (1024 * 1024) + b'"}',
        413,
        "payload_too_large",
        "body",
    ),
    ("payload over 256 KiB", job("limited", payload={"big": "x" * (256 * 1024)}), 400, "too_large", "payload"),
    ("51 headers", _headers({f"X-H{i}": "v" for i in range(51)}), 400, "too_large", "target.headers"),
    ("header value over 4096", _headers({"X-Big": "v" * 4097}), 400, "too_large", "target.headers.X-Big"),
    (
        "headers over 16 KiB in all",
        _headers({f"X-H{i}": "v" * 4000 for i in range(5)}),
        400,
        "too_large",
        "target.headers",
    ),
    ("header name charset", _headers({"X Bad": "v"}), 400, "invalid_header", "target.headers.X Bad"),
    ("header control character", _headers({"X-Nul": "a\x00b"}), 400, "invalid_header", "target.headers.X-Nul"),
    (
        "header set by cronman",
        _headers({"cronman-attempt": "9"}),
        400,
        "invalid_header",
        "target.headers.cronman-attempt",
    ),
    ("id charset", job("no spaces!"), 400, "invalid_value", "id"),
    ("id length", job("a" * 129), 400, "invalid_value", "id"),
    ("name length", job("limited", name="n" * 201), 400, "invalid_value", "name"),
    ("url length", job("limited", url="https://example.com/" + "a" * 2100), 400, "invalid_value", "target.url"),
]


@pytest.mark.parametrize(("case", "doc", "status", "code", "field"), CASES, ids=[c[0] for c in CASES])
def test_limits(admin: FlaskClient, app: Flask, case: str, doc: Any, status: int, code: str, field: str) -> None:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    r = admin.post("/v1/jobs", data=body, content_type="application/json")
    assert r.status_code == status, (case, r.json)
    assert (r.json["error"]["code"], r.json["error"]["field"]) == (code, field), r.json
    assert r.json["error"]["message"]
    with app.extensions["cronman"].store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 0


def test_fifty_headers_are_fine(admin: FlaskClient) -> None:
    r = send(admin, "post", "/v1/jobs", _headers({f"X-H{i}": "v" * 100 for i in range(50)}))
    assert r.status_code == 201, r.json


def test_path_ids_and_query_parameters(admin: FlaskClient) -> None:
    r = send(admin, "put", "/v1/jobs/bad%20id", job(None))
    assert r.status_code == 400 and r.json["error"]["field"] == "id"
    assert admin.get("/v1/jobs/" + "a" * 129).status_code == 404
    r = admin.get("/v1/jobs", query_string={"namespace": "x" * 65})
    assert r.status_code == 400 and r.json["error"]["field"] == "namespace"
    r = admin.get("/v1/jobs", query_string={"limit": 1001})
    assert r.status_code == 400 and r.json["error"]["field"] == "limit"
