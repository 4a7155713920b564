"""The REST API: a Flask application factory with blueprints, served by gunicorn (``cronman api``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
import sqlalchemy.exc
from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

from api.metrics import init_app as init_metrics
from api.metrics import note_error
from cronman.errors import CronmanError
from cronman.keys import Keys
from cronman.settings import Settings, load_settings
from cronman.store import JobStore, make_engine

log = logging.getLogger("cronman.api")

MAX_BODY_BYTES = 1024 * 1024


@dataclass
class Services:
    settings: Settings
    store: JobStore
    redis: redis.Redis
    keys: Keys

    def notify_change(self) -> None:
        """Wake the scheduler nodes; they poll anyway, so a failure here only slows them down."""
        try:
            self.redis.publish(self.keys.changes_channel, b"")
        except redis.RedisError as exc:
            log.warning("could not publish a change notification: %s", exc)


def _error(status: int, code: str, message: str, field: str | None = None):  # type: ignore[no-untyped-def]
    note_error(code)
    return jsonify({"error": {"code": code, "message": message, "field": field}}), status


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or load_settings()
    app = Flask("cronman")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.compact = True  # type: ignore[attr-defined]
    engine = make_engine(settings.database_url)
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
    app.extensions["cronman"] = Services(settings, JobStore(engine), client, Keys(settings.redis_prefix))

    from api.batch import bp as batch_bp
    from api.commands import bp as commands_bp
    from api.jobs import bp as jobs_bp
    from api.ops import bp as ops_bp
    from api.signing import bp as signing_bp
    from api.throttles import bp as throttles_bp

    for blueprint in (jobs_bp, batch_bp, throttles_bp, signing_bp, commands_bp, ops_bp):
        app.register_blueprint(blueprint)

    from api.auth import install_auth

    install_auth(app, settings)
    init_metrics(app)

    @app.errorhandler(CronmanError)
    def _cronman_error(exc: CronmanError):  # type: ignore[no-untyped-def]
        return _error(exc.status, exc.code, exc.message, exc.field)

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
