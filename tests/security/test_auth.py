"""Keys and namespaces: a key sees and changes only its own namespace's jobs, on every endpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from pydantic import SecretStr, ValidationError
from sqlalchemy import text

from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore
from tests.conftest import ADMIN_KEY
from tests.security.conftest import job, keyed, send

# Every /v1 endpoint that names one job, as (method, path suffix, body).
JOB_ENDPOINTS: list[tuple[str, str, Any]] = [
    ("get", "", None),
    ("put", "", job(None, payload={"hijacked": True})),
    ("patch", "", {"payload": {"hijacked": True}}),
    ("delete", "", None),
    ("get", "/next", None),
    ("get", "/executions", None),
    ("post", "/pause", None),
    ("post", "/resume", None),
    ("post", "/trigger", None),
]
ALL_V1: list[tuple[str, str]] = [
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    *[(m, f"/v1/jobs/some-job{suffix}") for m, suffix, _ in JOB_ENDPOINTS],
    ("get", "/v1/cluster"),
    ("get", "/v1/no-such-endpoint"),
]


def _ids(rows: list[tuple[Any, ...]]) -> list[str]:
    return [f"{r[0].upper()} {r[1] or '/'}" for r in rows]


@pytest.fixture
def team_a(client_for: Callable[[str], FlaskClient]) -> FlaskClient:
    return client_for("team-a")


@pytest.fixture
def team_b(client_for: Callable[[str], FlaskClient]) -> FlaskClient:
    client = client_for("team-b")
    assert send(client, "post", "/v1/jobs", job("b-job")).status_code == 201
    return client


@pytest.mark.parametrize(("method", "suffix", "body"), JOB_ENDPOINTS, ids=_ids(JOB_ENDPOINTS))
def test_another_namespaces_job_is_not_found(
    team_a: FlaskClient, team_b: FlaskClient, app: Flask, method: str, suffix: str, body: Any
) -> None:
    before = team_b.get("/v1/jobs/b-job").json
    r = send(team_a, method, f"/v1/jobs/b-job{suffix}", body)
    assert r.status_code == 404, r.json
    assert r.json["error"]["code"] == "not_found" and r.json["error"]["field"] == "id"
    assert "team-b" not in r.get_data(as_text=True)
    after = team_b.get("/v1/jobs/b-job").json
    assert after == before  # not changed, paused, resumed or deleted
    with app.extensions["cronman"].store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_triggers")).scalar_one() == 0  # not triggered


def test_the_same_calls_work_in_the_own_namespace(team_b: FlaskClient) -> None:
    for method, suffix, body in sorted(JOB_ENDPOINTS, key=lambda e: e[0] == "delete"):
        r = send(team_b, method, f"/v1/jobs/b-job{suffix}", body)
        assert r.status_code in (200, 202, 204), (method, suffix, r.json)


def test_list_shows_only_the_own_namespace(team_a: FlaskClient, team_b: FlaskClient) -> None:
    for i in range(3):
        assert send(team_a, "post", "/v1/jobs", job(f"a-{i}")).status_code == 201
    seen, cursor = [], None
    while True:
        page = team_a.get("/v1/jobs", query_string={"limit": 2, **({"cursor": cursor} if cursor else {})}).json
        seen += [(j["id"], j["namespace"]) for j in page["jobs"]]
        if not (cursor := page["next_cursor"]):
            break
    assert seen == [("a-0", "team-a"), ("a-1", "team-a"), ("a-2", "team-a")]
    assert [j["id"] for j in team_b.get("/v1/jobs").json["jobs"]] == ["b-job"]
    # naming another namespace is refused; naming one's own is allowed
    r = team_a.get("/v1/jobs", query_string={"namespace": "team-b"})
    assert r.status_code == 403 and r.json["error"]["field"] == "namespace"
    assert len(team_a.get("/v1/jobs", query_string={"namespace": "team-a"}).json["jobs"]) == 3


def test_an_id_used_in_another_namespace_is_a_bare_conflict(team_a: FlaskClient, team_b: FlaskClient) -> None:
    r = send(team_a, "post", "/v1/jobs", job("b-job"))
    assert r.status_code == 409
    assert r.json == {"error": {"code": "conflict", "message": "a job with id 'b-job' already exists", "field": "id"}}
    # once deleted there, the id is free again, for POST and PUT alike
    assert team_b.delete("/v1/jobs/b-job").status_code == 204
    assert send(team_a, "put", "/v1/jobs/b-job", job(None)).status_code == 201
    assert team_a.get("/v1/jobs/b-job").json["namespace"] == "team-a"


def test_a_namespace_key_cannot_write_into_another_namespace(team_a: FlaskClient, team_b: FlaskClient) -> None:
    r = send(team_a, "post", "/v1/jobs?namespace=team-b", job("sneaky"))
    assert r.status_code == 403 and r.json["error"]["code"] == "forbidden"
    r = send(team_a, "put", "/v1/jobs/sneaky?namespace=team-b", job(None))
    assert r.status_code == 403
    assert send(team_a, "post", "/v1/jobs?namespace=team-a", job("mine")).status_code == 201
    assert [j["id"] for j in team_b.get("/v1/jobs").json["jobs"]] == ["b-job"]


def test_the_cluster_view_needs_the_admin_key(team_a: FlaskClient, admin: FlaskClient) -> None:
    r = team_a.get("/v1/cluster")
    assert r.status_code == 403 and r.json["error"]["code"] == "forbidden"
    assert admin.get("/v1/cluster").status_code == 200


def test_the_admin_key_sees_every_namespace_and_creates_in_any(
    admin: FlaskClient, team_a: FlaskClient, team_b: FlaskClient
) -> None:
    assert send(team_a, "post", "/v1/jobs", job("a-job")).status_code == 201
    listed = admin.get("/v1/jobs").json["jobs"]
    assert [(j["id"], j["namespace"]) for j in listed] == [("a-job", "team-a"), ("b-job", "team-b")]
    filtered = admin.get("/v1/jobs", query_string={"namespace": "team-b"}).json["jobs"]
    assert [j["id"] for j in filtered] == ["b-job"]
    assert admin.post("/v1/jobs/b-job/pause").json["paused"] is True

    # creating: in "default" unless a namespace is named
    assert send(admin, "post", "/v1/jobs", job("admin-default")).json["namespace"] == "default"
    r = send(admin, "post", "/v1/jobs?namespace=team-c", job("for-c"))
    assert r.status_code == 201 and r.json["namespace"] == "team-c"
    r = send(admin, "put", "/v1/jobs/put-for-a?namespace=team-a", job(None))
    assert r.status_code == 201 and r.json["namespace"] == "team-a"
    assert team_a.get("/v1/jobs/put-for-a").status_code == 200
    # replacing keeps the job's namespace; naming another one is a conflict
    r = send(admin, "put", "/v1/jobs/b-job", job(None, payload={"v": 2}))
    assert r.status_code == 200 and r.json["namespace"] == "team-b"
    assert send(admin, "put", "/v1/jobs/b-job?namespace=team-a", job(None)).status_code == 409
    r = send(admin, "post", "/v1/jobs?namespace=bad%20name", job("x"))
    assert r.status_code == 400 and r.json["error"]["field"] == "namespace"


@pytest.mark.parametrize(("method", "path"), ALL_V1, ids=_ids(ALL_V1))
def test_every_v1_endpoint_needs_a_key(anon: FlaskClient, method: str, path: str) -> None:
    r = send(anon, method, path, job("x") if method in ("post", "put") and path == "/v1/jobs" else None)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert r.json["error"]["code"] == "unauthorized" and r.json["error"]["message"]


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json"])
def test_probes_metrics_and_the_description_stay_open(anon: FlaskClient, path: str) -> None:
    assert anon.get(path).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer ",
        "Bearer wrong-admin-key-of-some-length",
        "Bearer cmk_000000000000_notarealkeyatall",
        f"Bearer {ADMIN_KEY}x",
        f"Bearer {'k' * 600}",
        ADMIN_KEY,
    ],
)
def test_a_bad_key_is_refused(app: Flask, header: str) -> None:
    client = app.test_client()
    r = client.get("/v1/jobs", headers={"Authorization": header})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert r.json["error"]["code"] == "unauthorized"


def test_an_unknown_key_is_flagged_invalid(app: Flask) -> None:
    r = keyed(app, "cmk_000000000000_notarealkeyatall").get("/v1/jobs")
    assert r.status_code == 401 and 'error="invalid_token"' in r.headers["WWW-Authenticate"]


def test_a_revoked_key_is_refused(app: Flask, key_store: ApiKeyStore) -> None:
    record, key = key_store.create("team-a")
    client = keyed(app, key)
    assert client.get("/v1/jobs").status_code == 200
    revoked = key_store.revoke(record.prefix)
    assert revoked.revoked_at is not None
    r = client.get("/v1/jobs")
    assert r.status_code == 401 and r.json["error"]["message"] == "the API key is unknown or revoked"
    # other keys of the namespace keep working
    assert keyed(app, key_store.create("team-a")[1]).get("/v1/jobs").status_code == 200


def test_keys_are_stored_hashed(app: Flask, key_store: ApiKeyStore) -> None:
    _, key = key_store.create("team-a", "hash check")
    with app.extensions["cronman"].store.engine.connect() as conn:
        rows = conn.execute(text("SELECT namespace, prefix, key_hash, description FROM api_keys")).all()
    assert len(rows) == 1
    assert key not in " ".join(str(c) for c in rows[0]) and key.startswith(rows[0].prefix + "_")
    assert len(rows[0].key_hash) == 64


def test_auth_can_be_turned_off(app_with: Callable[..., Flask]) -> None:
    open_app = app_with(auth_disabled=True)
    anon = keyed(open_app, None)
    assert send(anon, "post", "/v1/jobs", job("open")).status_code == 201
    assert anon.get("/v1/cluster").status_code == 200


def test_without_an_admin_key_only_namespace_keys_work(app_with: Callable[..., Flask]) -> None:
    app = app_with(api_key=None)
    assert keyed(app, ADMIN_KEY).get("/v1/jobs").status_code == 401
    _, key = ApiKeyStore(app.extensions["cronman"].store.engine).create("team-a")
    assert keyed(app, key).get("/v1/jobs").status_code == 200


def test_the_admin_key_is_a_secret_setting(settings: Settings) -> None:
    assert ADMIN_KEY not in repr(settings) and ADMIN_KEY not in str(settings.model_dump())
    assert settings.api_key is not None and settings.api_key.get_secret_value() == ADMIN_KEY
    with pytest.raises(ValidationError, match="at least 16 characters"):
        Settings(api_key=SecretStr("short"))
    assert Settings(api_key=SecretStr("")).api_key is None
