"""Fixtures for the security tests: the API with the admin key, clients with and without keys."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from api import create_app
from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore
from tests.clients import job, keyed, send  # noqa: F401 - the tests here import them from this module
from tests.conftest import ADMIN_KEY


def make_app(settings: Settings, **changes: Any) -> Flask:
    return create_app(settings.model_copy(update=changes) if changes else settings)


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    app = make_app(settings)
    yield app
    app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def app_with(settings: Settings) -> Iterator[Callable[..., Flask]]:
    """Builds apps whose settings differ from the test's (``dev_mode=False``, ...)."""
    made: list[Flask] = []

    def make(**changes: Any) -> Flask:
        made.append(make_app(settings, **changes))
        return made[-1]

    yield make
    for app in made:
        app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def admin(app: Flask) -> FlaskClient:
    return keyed(app, ADMIN_KEY)


@pytest.fixture
def anon(app: Flask) -> FlaskClient:
    return keyed(app, None)


@pytest.fixture
def key_store(app: Flask) -> ApiKeyStore:
    return ApiKeyStore(app.extensions["cronman"].store.engine)


@pytest.fixture
def client_for(app: Flask, key_store: ApiKeyStore) -> Callable[[str], FlaskClient]:
    """A client holding a new key of the given namespace."""

    def make(namespace: str) -> FlaskClient:
        _, key = key_store.create(namespace, f"tests: {namespace}")
        return keyed(app, key)

    return make
