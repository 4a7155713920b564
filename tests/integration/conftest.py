from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text

from api import create_app
from cronman.settings import Settings
from cronman.store.store import make_engine
from tests.clients import keyed
from tests.conftest import ADMIN_KEY


@pytest.fixture
def app(settings: Settings):  # type: ignore[no-untyped-def]
    app = create_app(settings)
    yield app
    app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def client(app) -> FlaskClient:  # type: ignore[no-untyped-def]
    """A test client that sends the admin key with every request."""
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {ADMIN_KEY}"
    return client


@pytest.fixture
def api(settings: Settings) -> Iterator[FlaskClient]:
    """The API (an app of its own) through a test client with the admin key."""
    app = create_app(settings)
    yield keyed(app, ADMIN_KEY)
    app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def db(settings: Settings) -> Iterator:  # type: ignore[type-arg]
    engine = make_engine(settings.database_url, pool_size=1)
    yield engine
    engine.dispose()


def count(db, sql: str) -> int:  # type: ignore[no-untyped-def]
    with db.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())
