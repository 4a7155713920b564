"""Fixtures for the dashboard tests: the app against real PostgreSQL and Redis, namespace keys, a
logged-in test client, and history rows written straight into the database."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from api import create_app
from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore
from cronman.store.partitions import ensure_partitions
from tests.clients import job, keyed, send  # noqa: F401 - the tests here import them from this module

_HIDDEN_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings)
    yield app
    app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def engine(app: Flask) -> Engine:
    return app.extensions["cronman"].store.engine  # type: ignore[no-any-return]


@pytest.fixture
def key_store(engine: Engine) -> ApiKeyStore:
    return ApiKeyStore(engine)


@pytest.fixture
def new_key(key_store: ApiKeyStore) -> Callable[[str], str]:
    def make(namespace: str) -> str:
        return key_store.create(namespace, f"tests: {namespace}")[1]

    return make


def csrf_token(html: str) -> str:
    found = _HIDDEN_TOKEN.search(html)
    assert found, "the page carries no CSRF token"
    return found.group(1)


class Browser:
    """A Flask test client that logs in to the dashboard and posts its forms with their token."""

    def __init__(self, app: Flask) -> None:
        self.client: FlaskClient = app.test_client()
        self.token = ""

    def login(self, key: str, expect: int = 302) -> Any:
        page = self.client.get("/ui/login")
        r = self.client.post("/ui/login", data={"csrf_token": csrf_token(page.text), "key": key, "next": "/ui/jobs"})
        assert r.status_code == expect, r.text
        if expect == 302:
            self.token = csrf_token(self.client.get("/ui/jobs").text)
        return r

    def get(self, path: str, **kw: Any) -> Any:
        return self.client.get(path, **kw)

    def post(self, path: str, data: dict[str, Any] | None = None, token: bool = True, **kw: Any) -> Any:
        form = dict(data or {})
        if token:
            form["csrf_token"] = self.token
        return self.client.post(path, data=form, **kw)


@pytest.fixture
def browser(app: Flask) -> Callable[[], Browser]:
    return lambda: Browser(app)


def add_history(
    engine: Engine,
    job_id: str,
    status: str,
    scheduled_for: datetime,
    *,
    attempt: int = 1,
    execution_id: str | None = None,
    lag_ms: int = 12,
    dead_lettered: bool | None = None,
) -> str:
    exec_id = execution_id or str(uuid.uuid4())
    with engine.begin() as conn:
        ensure_partitions(conn, [scheduled_for.astimezone(UTC).date()])  # past days have none by default
        conn.execute(
            text(
                # written by the job's current incarnation (history before its creation counts then)
                "INSERT INTO scheduled_jobs (job_id, scheduled_for, attempt, execution_id, status, node, fired_at, "
                "finished_at, lag_ms, http_status, error, dead_lettered, incarnation, namespace) "
                "SELECT :j, :t, :a, :x, :s, 'node-a', :t, :t, :lag, :code, :err, :dl, "
                "(SELECT incarnation FROM jobs WHERE id = :j), (SELECT namespace FROM jobs WHERE id = :j)"
            ),
            {
                "j": job_id,
                "t": scheduled_for,
                "a": attempt,
                "x": exec_id,
                "s": status,
                "lag": lag_ms,
                "code": 200 if status == "succeeded" else 503,
                "err": None if status == "succeeded" else "HTTP 503",
                "dl": dead_lettered,
            },
        )
    return exec_id
