"""The API served over a real socket (werkzeug's threaded server, in this process, so that a fault
injector can stand in front of it), and clients of it."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from api import create_app
from cronman.cli import main
from cronman.client import Client
from cronman.settings import Settings
from tests.conftest import ADMIN_KEY


class _Handler(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass
class Faults:
    """A WSGI layer in front of the API: answers the next requests with the statuses queued in
    ``pending`` (each with a JSON error body, and ``Retry-After`` when given) before letting
    requests through; records every request it sees as (method, path, client port)."""

    app: Any
    pending: list[tuple[int, str | None]] = field(default_factory=list)
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, status: int, times: int = 1, retry_after: str | None = None) -> None:
        with self.lock:
            self.pending += [(status, retry_after)] * times

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        with self.lock:
            self.seen.append((environ["REQUEST_METHOD"], environ["PATH_INFO"], str(environ.get("REMOTE_PORT"))))
            fault = self.pending.pop(0) if self.pending else None
        if fault is None:
            return self.app(environ, start_response)
        status, retry_after = fault
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        body = json.dumps({"error": {"code": f"injected_{status}", "message": "injected fault", "field": None}})
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if retry_after is not None:
            headers.append(("Retry-After", retry_after))
        start_response(f"{status} Injected", headers)
        return [body.encode()]


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings)
    yield app
    app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def engine(app: Flask) -> Engine:
    return app.extensions["cronman"].store.engine  # type: ignore[no-any-return]


@pytest.fixture
def faults(app: Flask) -> Faults:
    return Faults(app)


def serve(wsgi: Any) -> tuple[BaseWSGIServer, str]:
    server = make_server("127.0.0.1", 0, wsgi, threaded=True, request_handler=_Handler)
    threading.Thread(target=server.serve_forever, name="test-api", daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def api_url(faults: Faults) -> Iterator[str]:
    """The API (behind ``faults``) on a real socket."""
    server, url = serve(faults)
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture
def cron(api_url: str) -> Iterator[Client]:
    """A client with the admin key, quick to retry."""
    with Client(api_url, ADMIN_KEY, backoff_factor=0.05, timeout=(2, 10)) as client:
        yield client


def job(job_id: str | None = "job-1", **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schedule": {"type": "cron", "expression": "0 7 * * *", "timezone": "Europe/Paris"},
        "target": {"type": "http", "url": "https://example.com/hook"},
        **extra,
    }
    if job_id is not None:
        doc["id"] = job_id
    return doc


@dataclass(frozen=True)
class Run:
    rc: int
    out: str
    err: str


@pytest.fixture
def cli(api_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> Any:
    """Runs ``cronman ...`` in this process against the served API (CRONMAN_API_URL and the admin
    key in the environment, a config directory of its own); returns (rc, stdout, stderr)."""
    for name in [n for n in os.environ if n.startswith("CRONMAN_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CRONMAN_API_URL", api_url)
    monkeypatch.setenv("CRONMAN_API_KEY", ADMIN_KEY)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def run(*argv: str, stdin: str | None = None) -> Run:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        rc = main(list(argv))
        captured = capsys.readouterr()
        return Run(rc, captured.out, captured.err)

    return run
