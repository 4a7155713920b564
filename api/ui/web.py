"""The dashboard's request plumbing: who is logged in, the CSRF check on every change, the
security headers on every answer, and the helpers templates use to show times."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode, urlsplit
from zoneinfo import ZoneInfo

from flask import Response, current_app, g, redirect, request, url_for

from api.ui.session import COOKIE, COOKIE_PATH, LOGIN_COOKIE, Session, SessionStore
from cronman.errors import Forbidden, Unauthorized
from cronman.model.schedule import zone
from cronman.model.timeutil import from_ms, to_ms
from cronman.settings import Settings
from cronman.store.audit import Actor

# No inline script or style anywhere: scripts, styles and the vendored libraries are static files.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" would make browsers send "Origin: null" on form posts
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
PUBLIC_ENDPOINTS = frozenset({"ui.login", "ui.static"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def settings() -> Settings:
    return current_app.extensions["cronman"].settings  # type: ignore[no-any-return]


def sessions() -> SessionStore:
    return current_app.extensions["cronman_ui"]  # type: ignore[no-any-return]


def session() -> Session:
    found = g.get("ui_session")
    if found is None:
        raise Unauthorized("log in first")
    return found  # type: ignore[no-any-return]


def namespace() -> str | None:
    """The namespace every view is scoped to (None: the admin, every namespace)."""
    return session().namespace


def actor() -> Actor:
    return Actor(session().who, {"via": "ui"})


def now_ms() -> int:
    return int(time.time() * 1000)


def _same_origin() -> bool:
    """A browser names the page a request came from; a cross-site one is refused even with a token."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:  # not a browser, or an old one: the token decides
        return True
    return urlsplit(origin).netloc == request.host


def load_session() -> Response | None:
    """Before every dashboard request: the session from its cookie, and the CSRF check on changes."""
    if request.endpoint == "ui.static":
        return None
    g.ui_session = sessions().load(request.cookies.get(COOKIE), settings().auth_disabled)
    if request.endpoint in PUBLIC_ENDPOINTS:
        return None
    if g.ui_session is None:
        return _to_login()
    if request.method not in SAFE_METHODS:
        sent = request.form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if not _same_origin() or not g.ui_session.csrf_ok(sent):
            raise Forbidden("this change did not carry the page's CSRF token; reload the page and try again")
    return None


def _to_login() -> Response:
    target = url_for("ui.login", next=local_path(request.full_path))
    if request.headers.get("HX-Request"):
        resp = Response(status=401)
        resp.headers["HX-Redirect"] = target
        return resp
    return redirect(target)  # type: ignore[return-value]


def query_url(endpoint: str, params: Mapping[str, str], **more: str) -> str:
    """The URL of ``endpoint`` with ``params`` and ``more`` as its query string, whatever their
    names: a parameter a user named ``endpoint`` or ``_external`` is a query parameter like any
    other, never an argument of ``url_for``."""
    query = urlencode({**params, **more})
    return url_for(endpoint) + (f"?{query}" if query else "")


def local_path(path: str | None, default: str = "/ui/jobs") -> str:
    """``path`` if it is a path of this dashboard, else ``default`` (no open redirects)."""
    if not path:
        return default
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or not parts.path.startswith("/ui/") or "\\" in path:
        return default
    return path.rstrip("?")


def secure_headers(resp: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        resp.headers.setdefault(name, value)
    if request.endpoint != "ui.static":
        resp.headers["Cache-Control"] = "no-store"
        resp.vary.add("Cookie")
        resp.vary.add("HX-Request")
    return resp


def cookie_secure() -> bool:
    return request.is_secure or settings().ui_secure_cookie


def set_session_cookie(resp: Response, token: str, max_age: int) -> None:
    resp.set_cookie(
        COOKIE, token, max_age=max_age, path=COOKIE_PATH, httponly=True, samesite="Strict", secure=cookie_secure()
    )


def clear_session_cookie(resp: Response) -> None:
    resp.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="Strict", secure=cookie_secure())


def login_nonce(resp: Response) -> str:
    """A token for the login form, also set as a cookie: a login posted from another site has neither
    (a double-submit check, since there is no session yet to hold a token)."""
    nonce = secrets.token_urlsafe(24)
    resp.set_cookie(
        LOGIN_COOKIE, nonce, max_age=900, path=COOKIE_PATH, httponly=True, samesite="Strict", secure=cookie_secure()
    )
    return nonce


def login_nonce_ok() -> bool:
    cookie, sent = request.cookies.get(LOGIN_COOKIE), request.form.get(CSRF_FIELD)
    return bool(cookie) and bool(sent) and secrets.compare_digest(cookie.encode(), sent.encode())  # type: ignore[union-attr]


def client_address() -> str:
    return (request.remote_addr or "unknown")[:64]


# -- what templates show -----------------------------------------------------------------------


def fmt_utc(value: datetime | int | None) -> str:
    if value is None:
        return "—"
    dt = from_ms(value) if isinstance(value, int) else value.astimezone(UTC)
    return dt.strftime("%Y-%m-%d %H:%M:%S") + (f".{dt.microsecond // 1000:03d}" if dt.microsecond else "") + "Z"


def fmt_in_zone(value: int, zone_name: str) -> str:
    tz: ZoneInfo = zone(zone_name)
    return from_ms(value).astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")


def relative(value: datetime | int | None, now: int | None = None) -> str:
    """ "in 3 min", "12 s ago"."""
    if value is None:
        return ""
    ms = value if isinstance(value, int) else to_ms(value)
    delta = (ms - (now if now is not None else now_ms())) / 1000
    size = abs(delta)
    if size < 1:
        return "now"
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if size >= span:
            amount = f"{size / span:.0f}" if span == 1 or size >= 10 * span else f"{size / span:.1f}".rstrip("0")
            amount = amount.rstrip(".")
            return f"in {amount} {unit}" if delta > 0 else f"{amount} {unit} ago"
    return ""


def pretty_json(value: Any, limit: int = 64 * 1024) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"
