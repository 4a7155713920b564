"""Fixtures for the feature tests: the API against real PostgreSQL and Redis, clients holding the
admin key or a namespace's key, and a way to count change notifications."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from api import create_app
from cronman.redis.keys import Keys
from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore
from tests.clients import job, keyed, send  # noqa: F401 - the tests here import them from this module
from tests.conftest import ADMIN_KEY


def rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params))


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    app = create_app(settings)
    yield app
    app.extensions["cronman"].store.engine.dispose()


@pytest.fixture
def engine(app: Flask) -> Engine:
    return app.extensions["cronman"].store.engine  # type: ignore[no-any-return]


@pytest.fixture
def admin(app: Flask) -> FlaskClient:
    return keyed(app, ADMIN_KEY)


@pytest.fixture
def key_store(engine: Engine) -> ApiKeyStore:
    return ApiKeyStore(engine)


@pytest.fixture
def client_for(app: Flask, key_store: ApiKeyStore) -> Callable[[str], FlaskClient]:
    """A client holding a new key of the given namespace; its prefix is ``client.key_prefix``."""

    def make(namespace: str) -> FlaskClient:
        record, key = key_store.create(namespace, f"tests: {namespace}")
        client = keyed(app, key)
        client.key_prefix = record.prefix  # type: ignore[attr-defined]
        return client

    return make


class Notifications:
    """Counts (and keeps) the change notifications published for the scheduler nodes."""

    def __init__(self, url: str, channel: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(channel)
        self.count = 0
        self.messages: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            msg = self._pubsub.get_message(timeout=0.05)
            if msg is not None:
                self.messages.append(msg["data"])
                self.count += 1

    def settle(self, seconds: float = 0.3) -> int:
        time.sleep(seconds)
        return self.count

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._pubsub.close()
        self._client.close()


@pytest.fixture
def notifications(settings: Settings) -> Iterator[Notifications]:
    n = Notifications(settings.redis_url, Keys(settings.redis_prefix).changes_channel)
    time.sleep(0.1)  # subscribed before the test publishes
    yield n
    n.close()
