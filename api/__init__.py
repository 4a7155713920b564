"""The REST API: a Flask application factory with blueprints, served by gunicorn (``cronman api``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import sqlalchemy.exc
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from api.json_provider import FastJSONProvider
from api.metrics import init_app as init_metrics
from api.metrics import note_error
from cronman.errors import CronmanError
from cronman.model.changes import Stop, encode
from cronman.redis.keys import Keys
from cronman.redis.redisconn import SyncRedis, sync_client
from cronman.settings import Settings, load_settings
from cronman.store.store import JobStore, make_engine

log = logging.getLogger("cronman.api")

MAX_BODY_BYTES = 1024 * 1024


class ChangeNotifier:
    """Tells the scheduler nodes of changes (cronman.model.changes), from a thread of its own. A change
    that stops jobs (a pause, a delete) names them, and the request that made it waits until the
    message is out (at most ``wait`` seconds: Redis away must not hold the API up), so that the
    nodes hear of it by the time the caller has the answer. Other changes only raise a flag:
    however many a burst makes, nodes get one wake-up per interval. What is pending goes out in one
    message. Nodes read the change feed anyway, so a message lost only makes them later."""

    def __init__(self, client: SyncRedis, channel: str, interval: float = 0.02, wait: float = 0.5) -> None:
        self._client = client
        self._channel = channel
        self._interval = interval
        self._wait = wait
        self._cond = threading.Condition()
        self._stops: list[Stop] = []
        self._pending = False
        self._asked = 0  # notifications asked for, and how many of them went out (or were given up)
        self._done = 0
        self._thread: threading.Thread | None = None

    def notify(self, stops: Sequence[Stop] = ()) -> None:
        with self._cond:
            self._stops.extend(stops)
            # The thread waits for a first pending change, or for stops during its interval: a
            # change while one is already pending need not wake it (a burst of creates woke it once
            # each, only for it to go back to waiting).
            wake = bool(stops) or not self._pending
            self._pending = True
            self._asked += 1
            ticket = self._asked
            # started lazily (gunicorn forks workers after the app is built), ends when idle
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cronman-notify", daemon=True)
                self._thread.start()
            if wake:
                self._cond.notify_all()
            if stops:
                self._cond.wait_for(lambda: self._done >= ticket, self._wait)

    def _run(self, idle_seconds: float = 60.0) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._pending, idle_seconds):
                    self._thread = None
                    return
                stops, self._stops, self._pending = self._stops, [], False
                ticket = self._asked
            try:
                self._client.publish(self._channel, encode(stops))
            except redis.RedisError as exc:
                log.warning("could not publish a change notification: %s", exc)
            with self._cond:
                self._done = ticket
                self._cond.notify_all()
                if not stops:  # a wake-up: the next one after the interval, unless a stop comes first
                    self._cond.wait_for(lambda: bool(self._stops), self._interval)


@dataclass
class Services:
    settings: Settings
    store: JobStore
    redis: SyncRedis
    keys: Keys
    notifier: ChangeNotifier

    def notify_change(self, stops: Sequence[Stop] = ()) -> None:
        """Tell the scheduler nodes: of ``stops`` before returning, of anything else soon."""
        self.notifier.notify(stops)


def _error(status: int, code: str, message: str, field: str | None = None):  # type: ignore[no-untyped-def]
    note_error(code)
    return jsonify({"error": {"code": code, "message": message, "field": field}}), status


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or load_settings()
    app = Flask("cronman")
    app.json = FastJSONProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    engine = make_engine(settings.database_url, pre_ping=False)
    client = sync_client(settings, timeout=2.0)
    keys = Keys(settings.redis_prefix)
    notifier = ChangeNotifier(client, keys.changes_channel)
    app.extensions["cronman"] = Services(
        settings,
        JobStore(engine, quota=settings.quota_jobs_per_namespace, prepare=settings.database_prepared_statements),
        client,
        keys,
        notifier,
    )

    from api.backfills import bp as backfills_bp
    from api.batch import bp as batch_bp
    from api.calendars import bp as calendars_bp
    from api.commands import bp as commands_bp
    from api.executions import bp as executions_bp
    from api.flow import bp as flow_bp
    from api.jobs import bp as jobs_bp
    from api.notifications import bp as notifications_bp
    from api.ops import bp as ops_bp
    from api.signing import bp as signing_bp
    from api.throttles import bp as throttles_bp
    from api.ui import bp as ui_bp

    blueprints = (
        jobs_bp,
        batch_bp,
        throttles_bp,
        calendars_bp,
        backfills_bp,
        signing_bp,
        commands_bp,
        executions_bp,
        flow_bp,
        ops_bp,
        ui_bp,
        notifications_bp,
    )
    for blueprint in blueprints:
        app.register_blueprint(blueprint)

    from api.auth import install_auth

    install_auth(app, settings)
    init_metrics(app)
    if settings.trusted_networks:
        from api.proxies import TrustedProxies

        app.wsgi_app = TrustedProxies(app.wsgi_app, settings.trusted_networks)  # type: ignore[method-assign]

    @app.after_request
    def _hsts(resp: Response) -> Response:
        """HSTS on answers that went out over HTTPS (directly, as a trusted proxy reports it, or
        as CRONMAN_UI_SECURE_COOKIE says of the proxy in front); never over plain HTTP."""
        if settings.hsts_seconds and (request.is_secure or settings.ui_secure_cookie):
            resp.headers.setdefault("Strict-Transport-Security", f"max-age={settings.hsts_seconds}")
        return resp

    @app.errorhandler(CronmanError)
    def _cronman_error(exc: CronmanError):  # type: ignore[no-untyped-def]
        note_error(exc.code)
        return jsonify({"error": exc.to_dict()}), exc.status

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):  # type: ignore[no-untyped-def]
        code = (exc.name or "error").lower().replace(" ", "_")
        return _error(exc.code or 500, code, exc.description or exc.name)

    @app.errorhandler(sqlalchemy.exc.OperationalError)
    @app.errorhandler(sqlalchemy.exc.InterfaceError)
    def _database_unavailable(exc: Exception):  # type: ignore[no-untyped-def]
        log.warning("database unavailable: %s", type(exc).__name__)
        resp = _error(503, "unavailable", "the database is unavailable; try again shortly")
        return resp[0], 503, {"Retry-After": "5"}

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):  # type: ignore[no-untyped-def]
        log.exception("unhandled error")
        return _error(500, "internal_error", "an internal error occurred; it has been logged")

    return app
