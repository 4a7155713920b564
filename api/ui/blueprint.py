"""The ``/ui`` blueprint: its session store, the checks before each request, the headers after,
and HTML pages for errors."""

from __future__ import annotations

import json
import logging

import redis
import sqlalchemy.exc
from flask import Blueprint, Response, g, render_template, request, url_for
from flask.sansio.blueprints import BlueprintSetupState
from werkzeug.exceptions import HTTPException

from api.ui.session import SessionStore
from api.ui.web import (
    CSRF_FIELD,
    fmt_in_zone,
    fmt_utc,
    load_session,
    pretty_json,
    query_url,
    relative,
    secure_headers,
)
from cronman import __version__
from cronman.errors import CronmanError, Unauthorized

log = logging.getLogger("cronman.api.ui")

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates", static_folder="static")


@bp.record_once
def _setup(state: BlueprintSetupState) -> None:
    svc = state.app.extensions["cronman"]
    s = svc.settings
    admin_key = s.api_key.get_secret_value() if s.api_key else None
    state.app.extensions["cronman_ui"] = SessionStore(
        svc.redis, svc.keys, svc.store.engine, admin_key, s.ui_session_seconds
    )


bp.before_request(load_session)
bp.after_request(secure_headers)


@bp.context_processor
def _helpers() -> dict[str, object]:
    s = g.get("ui_session")
    return {
        "ui_session": s,
        "csrf_field": CSRF_FIELD,
        "csrf": s.csrf if s is not None else "",
        "csrf_headers": json.dumps({"X-CSRF-Token": s.csrf}) if s is not None else "{}",
        "fmt_utc": fmt_utc,
        "fmt_in_zone": fmt_in_zone,
        "relative": relative,
        "pretty_json": pretty_json,
        "query_url": query_url,
        "asset": lambda name: url_for("ui.static", filename=name, v=__version__),
    }


def _error_page(status: int, title: str, text: str) -> Response:
    if request.headers.get("HX-Request"):  # a section asked for itself: leave the page as it is
        return Response(text, status=status, mimetype="text/plain", headers={"HX-Reswap": "none"})
    html = render_template("ui/error.html", status=status, title=title, text=text)
    return Response(html, status=status, mimetype="text/html")


@bp.errorhandler(CronmanError)
def _cronman_error(exc: CronmanError) -> Response:
    if isinstance(exc, Unauthorized):
        return Response(status=302, headers={"Location": url_for("ui.login")})
    return _error_page(exc.status, exc.code.replace("_", " "), exc.message)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> Response:
    return _error_page(exc.code or 500, exc.name, exc.description or exc.name)


@bp.errorhandler(redis.RedisError)
def _redis_down(exc: redis.RedisError) -> Response:
    log.warning("dashboard: Redis unavailable: %s", type(exc).__name__)
    resp = _error_page(503, "unavailable", "Sessions are kept in Redis, which is unavailable; try again shortly.")
    resp.headers["Retry-After"] = "5"
    return resp


@bp.errorhandler(sqlalchemy.exc.OperationalError)
@bp.errorhandler(sqlalchemy.exc.InterfaceError)
def _database_down(exc: Exception) -> Response:
    log.warning("dashboard: database unavailable: %s", type(exc).__name__)
    resp = _error_page(503, "unavailable", "The database is unavailable; try again shortly.")
    resp.headers["Retry-After"] = "5"
    return resp


@bp.errorhandler(Exception)
def _unexpected(exc: Exception) -> Response:
    log.exception("dashboard: unhandled error")
    return _error_page(500, "internal error", "An internal error occurred; it has been logged.")
