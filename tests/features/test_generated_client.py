"""A client generated from the served /openapi.json by openapi-python-client drives a job's life
against the API on a real socket: the description and the server agree, because both come from one
model (cronman.model.spec). The generator must not warn: a warning means part of the API was left out of
the client it made."""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests
from flask import Flask
from werkzeug.serving import make_server

from cronman.model.spec import OPTION_DEFAULTS
from tests.conftest import ADMIN_KEY

PACKAGE = "cronman_generated_client"
GENERATOR = [sys.executable, "-m", "openapi_python_client"]


@pytest.fixture
def api_url(app: Flask) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="test-api", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def generated(api_url: str, tmp_path: Path) -> Iterator[ModuleType]:
    """The client package generated, in this test's own directory, from the description served."""
    served = requests.get(f"{api_url}/openapi.json", timeout=10)
    assert served.status_code == 200
    (tmp_path / "openapi.json").write_bytes(served.content)
    (tmp_path / "config.yaml").write_text("post_hooks: []\n")  # no formatting: the code runs as generated
    out = tmp_path / PACKAGE
    run = subprocess.run(
        [*GENERATOR, "generate", "--path", "openapi.json", "--output-path", str(out), "--meta", "none"]
        + ["--config", "config.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert "warning" not in said.lower(), said
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def _part(package: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{package.__name__}.{name}")


def test_a_generated_client_creates_reads_lists_patches_pauses_triggers_and_deletes_a_job(
    generated: ModuleType, api_url: str
) -> None:
    models = _part(generated, "models")
    ops = {
        n: _part(generated, f"api.default.{n}")
        for n in ("create_job", "get_job", "list_jobs", "patch_job", "pause_job", "trigger_job", "delete_job")
    }
    with generated.AuthenticatedClient(base_url=api_url, token=ADMIN_KEY, raise_on_unexpected_status=True) as client:
        spec = models.JobSpec.from_dict(
            {
                "id": "generated-1",
                "name": "from a generated client",
                "labels": {"team": "payments"},
                "schedule": {"type": "cron", "expression": "0 7 * * *", "timezone": "Europe/Paris"},
                "target": {"type": "http", "url": "https://example.com/hook", "headers": {"X-Token": "secret"}},
                "payload": {"invoice": 42},
                "misfire_policy": "fire_all",
            }
        )
        created = ops["create_job"].sync_detailed(client=client, body=spec)
        assert created.status_code == 201 and isinstance(created.parsed, models.Job)
        job = created.parsed
        assert (job.id, job.namespace, job.state) == ("generated-1", "default", models.JobState.ACTIVE)
        assert isinstance(job.schedule, models.CronSchedule) and job.schedule.timezone == "Europe/Paris"
        assert isinstance(job.target, models.HttpTarget) and job.target.headers["X-Token"] == "<redacted>"
        assert job.misfire_policy == models.MisfirePolicy.FIRE_ALL
        # options the job does not set come back with the model's defaults
        assert job.late_after_seconds == OPTION_DEFAULTS.late_after_seconds
        assert job.catchup_window_seconds == OPTION_DEFAULTS.catchup_window_seconds

        read = ops["get_job"].sync(job_id="generated-1", client=client)
        assert isinstance(read, models.Job) and read.version == job.version and read.payload == {"invoice": 42}

        listed = ops["list_jobs"].sync(client=client, selector="team=payments")
        assert isinstance(listed, models.JobList) and [j.id for j in listed.jobs] == ["generated-1"]

        patch = models.JobPatch.from_dict({"late_after_seconds": 300, "labels": {"env": "prod"}})
        patched = ops["patch_job"].sync(job_id="generated-1", client=client, body=patch)
        assert isinstance(patched, models.Job) and patched.late_after_seconds == 300
        assert patched.labels.additional_properties == {"team": "payments", "env": "prod"}

        paused = ops["pause_job"].sync(job_id="generated-1", client=client)
        assert isinstance(paused, models.Job) and paused.paused and paused.state == models.JobState.PAUSED
        assert paused.paused_reason.reason == models.PausedReasonReason.PAUSED and paused.paused_reason.by == "admin"

        triggered = ops["trigger_job"].sync_detailed(job_id="generated-1", client=client)
        assert triggered.status_code == 202 and triggered.parsed.job_id == "generated-1"
        assert len(triggered.parsed.execution_id) == 36

        deleted = ops["delete_job"].sync_detailed(job_id="generated-1", client=client)
        assert deleted.status_code == 204
        gone = ops["get_job"].sync_detailed(job_id="generated-1", client=client)
        assert gone.status_code == 404 and isinstance(gone.parsed, models.Error)
        assert gone.parsed.error.code == "not_found"
