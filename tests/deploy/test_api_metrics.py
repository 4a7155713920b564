"""The API's Prometheus series and access log: in process, and under gunicorn with several workers."""

from __future__ import annotations

import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from api import create_app
from api.metrics import job_change
from api.server import prepare_multiprocess_dir
from cronman.dev.embedded import Child, free_port
from cronman.settings import Settings

JOB: dict[str, Any] = {
    "schedule": {"type": "interval", "every_seconds": 60},
    "target": {"type": "http", "url": "https://example.com/hook", "headers": {"Authorization": "Bearer hook-s3cret"}},
    "payload": {"card": "4111-1111"},
}


@pytest.fixture
def client(settings: Settings):  # type: ignore[no-untyped-def]
    app = create_app(settings)
    client = app.test_client()
    if settings.api_key is not None:
        client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {settings.api_key.get_secret_value()}"
    yield client
    app.extensions["cronman"].store.engine.dispose()


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_requests_are_counted_by_route_template_not_raw_path(client: FlaskClient) -> None:
    before = value("cronman_api_requests_total", method="GET", route="/v1/jobs/<job_id>", status="404")
    hist_before = value("cronman_api_request_duration_seconds_count", method="GET", route="/v1/jobs/<job_id>")
    for i in range(3):
        assert client.get(f"/v1/jobs/missing-{i}").status_code == 404
    assert value("cronman_api_requests_total", method="GET", route="/v1/jobs/<job_id>", status="404") == before + 3
    assert value("cronman_api_request_duration_seconds_count", method="GET", route="/v1/jobs/<job_id>") == (
        hist_before + 3
    )
    body = client.get("/metrics").get_data(as_text=True)
    assert "missing-0" not in body
    unmatched = value("cronman_api_requests_total", method="GET", route="<unmatched>", status="404")
    client.get("/no/such/path/123")
    assert value("cronman_api_requests_total", method="GET", route="<unmatched>", status="404") == unmatched + 1


def test_job_changes_and_validation_errors_are_counted(client: FlaskClient) -> None:
    def changes() -> dict[str, float]:
        return {c: value("cronman_api_job_changes_total", change=c) for c in ("created", "updated", "deleted")}

    start = changes()
    invalid_cron = value("cronman_api_validation_errors_total", code="invalid_cron")
    invalid_json = value("cronman_api_validation_errors_total", code="invalid_json")
    assert client.post("/v1/jobs", json={**JOB, "id": "m1"}).status_code == 201
    assert client.put("/v1/jobs/m2", json=JOB).status_code == 201
    assert client.put("/v1/jobs/m2", json={**JOB, "paused": True}).status_code == 200
    assert client.patch("/v1/jobs/m1", json={"paused": True}).status_code == 200
    assert client.post("/v1/jobs/m1/resume").status_code == 200
    assert client.delete("/v1/jobs/m1").status_code == 204
    assert client.post("/v1/jobs", json={**JOB, "id": "m1"}).status_code == 201
    assert client.post("/v1/jobs", json={**JOB, "id": "m1"}).status_code == 409  # not a change, not "validation"
    bad = {**JOB, "schedule": {"type": "cron", "expression": "not a cron"}}
    assert client.post("/v1/jobs", json=bad).status_code == 400
    assert client.post("/v1/jobs", data="{", content_type="application/json").status_code == 400
    end = changes()
    assert {c: end[c] - start[c] for c in end} == {"created": 3, "updated": 3, "deleted": 1}
    assert value("cronman_api_validation_errors_total", code="invalid_cron") == invalid_cron + 1
    assert value("cronman_api_validation_errors_total", code="invalid_json") == invalid_json + 1


@pytest.mark.parametrize(
    ("method", "route", "status", "expected"),
    [
        ("POST", "/v1/jobs", 201, "created"),
        ("POST", "/v1/jobs", 400, None),
        ("PUT", "/v1/jobs/<job_id>", 201, "created"),
        ("PUT", "/v1/jobs/<job_id>", 200, "updated"),
        ("PATCH", "/v1/jobs/<job_id>", 200, "updated"),
        ("POST", "/v1/jobs/<job_id>/pause", 200, "updated"),
        ("POST", "/v1/jobs/<job_id>/trigger", 202, None),
        ("DELETE", "/v1/jobs/<job_id>", 204, "deleted"),
        ("DELETE", "/v1/jobs/<job_id>", 404, None),
        ("GET", "/v1/jobs/<job_id>", 200, None),
    ],
)
def test_job_change_table(method: str, route: str, status: int, expected: str | None) -> None:
    assert job_change(method, route, status) == expected


def test_access_line_per_request_without_bodies_or_headers(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="cronman.api.access"):
        r = client.post("/v1/jobs", json={**JOB, "id": "logged"}, headers={"X-Api-Key": "caller-s3cret"})
        assert r.status_code == 201
        client.get("/v1/jobs", headers={"Authorization": "Bearer caller-s3cret"})  # refused: a wrong key
        client.get("/v1/jobs/logged")
        client.get("/healthz")  # probes are debug-level
    records = [r for r in caplog.records if r.name == "cronman.api.access"]
    seen = [(r.method, r.route, r.status) for r in records]  # type: ignore[attr-defined]
    assert [(m, route) for m, route, _ in seen] == [
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/<job_id>"),
    ]
    assert seen[0][2] == 201 and seen[1][2] in (401, 403) and seen[2][2] == 200
    assert getattr(records[0], "job_id", None) is None  # the id was in the body, not the route
    assert records[2].job_id == "logged"  # type: ignore[attr-defined]
    assert all(isinstance(r.duration_ms, float) for r in records)  # type: ignore[attr-defined]
    text = caplog.text + " ".join(json.dumps(r.__dict__, default=str) for r in records)
    for secret in ("caller-s3cret", "hook-s3cret", "4111-1111"):
        assert secret not in text


def test_prepare_multiprocess_dir_respects_a_given_directory(tmp_path: Path) -> None:
    given = tmp_path / "prom"
    given.mkdir()
    (given / "counter_123.db").write_bytes(b"stale")
    (given / "keep.txt").write_text("not ours")
    env = {"PROMETHEUS_MULTIPROC_DIR": str(given)}
    path, made = prepare_multiprocess_dir(env)
    assert (path, made) == (given, False)
    assert sorted(p.name for p in given.iterdir()) == ["keep.txt"]

    env = {}
    path, made = prepare_multiprocess_dir(env)
    try:
        assert made and env["PROMETHEUS_MULTIPROC_DIR"] == str(path)
        assert str(path).startswith("/tmp/") and path.is_dir() and not any(path.iterdir())
    finally:
        path.rmdir()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_gunicorn_workers_add_up(settings_env: dict[str, str], tmp_path: Path) -> None:
    """Several workers answer; /metrics counts every request whichever worker served it and whichever
    worker serves the scrape; gunicorn's own log lines are JSON too."""
    port = free_port()
    metrics_dir = tmp_path / "prom"
    env = {
        **settings_env,
        "CRONMAN_API_PORT": str(port),
        "CRONMAN_API_HOST": "127.0.0.1",
        "CRONMAN_API_WORKERS": "3",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    key = settings_env.get("CRONMAN_API_KEY")
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    log = tmp_path / "api.log"
    child = Child("api", [sys.executable, "-m", "cronman", "api"], env=env, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        child.wait_until(lambda: requests.get(f"{url}/readyz", timeout=1).ok, 30, "the API to be ready")
        n = 90

        def get(i: int) -> int:
            # A new connection each time, several at once, so the requests spread over the workers.
            headers = {"Connection": "close", **auth}
            return requests.get(f"{url}/v1/jobs/nope-{i}", timeout=10, headers=headers).status_code

        with ThreadPoolExecutor(max_workers=9) as pool:
            assert set(pool.map(get, range(n))) == {404}
        series = ("cronman_api_requests_total", (("method", "GET"), ("route", "/v1/jobs/<job_id>"), ("status", "404")))
        for _ in range(5):  # every scrape sees the same total, whichever worker answers it
            samples = _samples(requests.get(f"{url}/metrics", timeout=5, headers={"Connection": "close"}).text)
            assert samples[series] == n
        workers = {p.name.rsplit("_", 1)[1] for p in metrics_dir.glob("counter_*.db")}
        assert len(workers) >= 2, f"one worker served everything: {workers}"
    finally:
        child.stop()
    assert child.proc.returncode == 0
    text = log.read_text()
    if key:
        assert key not in text
    docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    gunicorn = [d for d in docs if d["logger"] == "gunicorn.error"]
    assert any("Booting worker" in str(d["msg"]) for d in gunicorn)
    access = [d for d in docs if d["logger"] == "cronman.api.access"]
    assert len(access) == n  # probes and scrapes are debug-level
    assert {(d["method"], d["route"], d["status"]) for d in access} == {("GET", "/v1/jobs/<job_id>", 404)}
    assert all(d["job_id"].startswith("nope-") and d["duration_ms"] >= 0 for d in access)
