"""Target header values are write-only: shown as "<redacted>", kept across GET-modify-PUT, never logged."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import text

from cronman.dev.receiver import Receiver
from cronman.model.spec import JobSpec
from cronman.settings import Settings
from tests.helpers import NodeThread, wait_for
from tests.security.conftest import job, send

SECRET = "Bearer s3cr3t-t0ken-value"


def _stored_headers(app: Flask, job_id: str) -> dict[str, str]:
    with app.extensions["cronman"].store.engine.connect() as conn:
        sql = text("SELECT target->'headers' FROM jobs WHERE id = :id")
        return dict(conn.execute(sql, {"id": job_id}).scalar_one())


def _with_headers(job_id: str | None, headers: dict[str, str], **extra: Any) -> dict[str, Any]:
    doc = job(job_id, **extra)
    doc["target"]["headers"] = headers
    return doc


@pytest.fixture
def created(admin: FlaskClient) -> dict[str, Any]:
    r = send(admin, "post", "/v1/jobs", _with_headers("secret-job", {"Authorization": SECRET, "X-Team": "billing"}))
    assert r.status_code == 201, r.json
    return r.json  # type: ignore[no-any-return]


def test_responses_show_header_names_only(admin: FlaskClient, created: dict[str, Any]) -> None:
    redacted = {"Authorization": "<redacted>", "X-Team": "<redacted>"}
    assert created["target"]["headers"] == redacted
    assert admin.get("/v1/jobs/secret-job").json["target"]["headers"] == redacted
    assert admin.get("/v1/jobs").json["jobs"][0]["target"]["headers"] == redacted
    assert admin.post("/v1/jobs/secret-job/pause").json["target"]["headers"] == redacted
    for r in (admin.get("/v1/jobs/secret-job"), admin.get("/v1/jobs"), admin.post("/v1/jobs/secret-job/resume")):
        assert "s3cr3t" not in r.get_data(as_text=True)


def test_get_modify_put_keeps_the_stored_values(admin: FlaskClient, app: Flask, created: dict[str, Any]) -> None:
    current: dict[str, Any] = admin.get("/v1/jobs/secret-job").get_json()
    doc = {k: v for k, v in current.items() if k in JobSpec.model_fields}  # drop the read-only fields
    doc["payload"] = {"changed": True}
    doc["target"]["headers"]["X-Extra"] = "new"
    r = send(admin, "put", "/v1/jobs/secret-job", doc)
    assert r.status_code == 200, r.json
    assert r.json["payload"] == {"changed": True}
    assert _stored_headers(app, "secret-job") == {"Authorization": SECRET, "X-Team": "billing", "X-Extra": "new"}


def test_a_placeholder_matches_a_header_name_in_any_case(admin: FlaskClient, app: Flask, created: Any) -> None:
    r = send(admin, "put", "/v1/jobs/secret-job", _with_headers(None, {"authorization": "<redacted>"}))
    assert r.status_code == 200, r.json
    assert _stored_headers(app, "secret-job") == {"authorization": SECRET}


def test_patch_keeps_replaces_or_removes_values(admin: FlaskClient, app: Flask, created: Any) -> None:
    r = send(admin, "patch", "/v1/jobs/secret-job", {"target": {"headers": {"Authorization": "<redacted>"}}})
    assert r.status_code == 200 and _stored_headers(app, "secret-job")["Authorization"] == SECRET
    send(admin, "patch", "/v1/jobs/secret-job", {"target": {"headers": {"Authorization": "Bearer rotated"}}})
    assert _stored_headers(app, "secret-job")["Authorization"] == "Bearer rotated"
    send(admin, "patch", "/v1/jobs/secret-job", {"target": {"headers": {"Authorization": None}}})
    assert _stored_headers(app, "secret-job") == {"X-Team": "billing"}


@pytest.mark.parametrize(
    ("method", "path"), [("post", "/v1/jobs"), ("put", "/v1/jobs/secret-job"), ("put", "/v1/jobs/fresh")]
)
def test_a_placeholder_with_nothing_stored_is_refused(admin: FlaskClient, created: Any, method: str, path: str) -> None:
    doc = _with_headers("secret-job" if method == "post" else None, {"X-New": "<redacted>"})
    r = send(admin, method, path, doc)
    assert r.status_code == 400, r.json
    assert (r.json["error"]["code"], r.json["error"]["field"]) == ("invalid_header", "target.headers.X-New")


def test_another_namespace_cannot_borrow_stored_values(client_for: Any, admin: FlaskClient, created: Any) -> None:
    """The placeholder resolves against the caller's own job only."""
    other = client_for("team-x")
    r = send(other, "put", "/v1/jobs/secret-job", _with_headers(None, {"Authorization": "<redacted>"}))
    assert r.status_code in (400, 404)
    assert "s3cr3t" not in r.get_data(as_text=True)


def test_header_values_never_reach_the_logs(admin: FlaskClient, created: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    send(admin, "patch", "/v1/jobs/secret-job", {"target": {"headers": {"Authorization": SECRET + "\n"}}})
    send(admin, "put", "/v1/jobs/secret-job", _with_headers(None, {"Authorization": SECRET, "Bad Name": "x"}))
    send(admin, "put", "/v1/jobs/secret-job", _with_headers(None, {"Authorization": SECRET + "x" * 5000}))
    admin.get("/v1/jobs/secret-job")
    assert "s3cr3t" not in caplog.text


def test_the_receiver_gets_the_real_values_after_a_round_trip(admin: FlaskClient, settings: Settings) -> None:
    with Receiver() as receiver, NodeThread(settings):
        doc = _with_headers("round-trip", {"Authorization": SECRET}, url=f"{receiver.url}/hook")
        assert send(admin, "post", "/v1/jobs", doc).status_code == 201
        current: dict[str, Any] = admin.get("/v1/jobs/round-trip").get_json()
        edited = {k: v for k, v in current.items() if k in JobSpec.model_fields}
        edited["payload"] = {"edited": True}
        assert send(admin, "put", "/v1/jobs/round-trip", edited).status_code == 200
        assert admin.post("/v1/jobs/round-trip/trigger").status_code == 202
        got = wait_for(lambda: receiver.snapshot(), 20, "the triggered delivery")
    assert got[0].headers["Authorization"] == SECRET and got[0].body == b'{"edited":true}'
