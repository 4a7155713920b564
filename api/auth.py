"""Who is calling: ``Authorization: Bearer <key>`` on every /v1 endpoint.

The admin key (CRONMAN_API_KEY) sees every namespace; any other key is looked up by its hash and
sees only its own namespace. /healthz, /readyz, /metrics and /openapi.json stay open. The work of
an execution that completes later may instead report its end (``POST
/v1/executions/{id}:complete``, ``:heartbeat``) with the ``Cronman-Completion-Token`` sent with
the attempt, and no key: that request has no caller, only the token, which api.executions checks.
"""

from __future__ import annotations

import hmac
import logging
import re
from dataclasses import dataclass

from flask import Flask, Response, g, jsonify, request

from cronman.errors import Unauthorized
from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore

log = logging.getLogger("cronman.api.auth")

ADMIN_ONLY_PATHS = frozenset({"/v1/cluster"})
_MAX_KEY_LENGTH = 512
COMPLETION_TOKEN_HEADER = "Cronman-Completion-Token"
MAX_TOKEN_LENGTH = 512
# The endpoints a completion token opens (POST only), without a key.
_TOKEN_PATH = re.compile(r"^/v1/executions/[^/]+:(complete|heartbeat)$")


@dataclass(frozen=True, slots=True)
class Caller:
    namespace: str | None  # None: every namespace
    name: str = "admin"  # who the job events say did it: "admin", or "key:<prefix>" for a namespace key

    @property
    def is_admin(self) -> bool:
        return self.namespace is None


ADMIN = Caller(None, "admin")


def caller() -> Caller:
    """The authenticated caller of this request."""
    found = g.get("cronman_caller")
    if found is None:
        raise Unauthorized("this request was not authenticated")
    return found  # type: ignore[no-any-return]


def _needs_key(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def completion_token() -> str | None:
    """The request's Cronman-Completion-Token, if it sent one."""
    return request.headers.get(COMPLETION_TOKEN_HEADER)


def _token_only() -> bool:
    """A report of an execution's work authorised by its completion token alone (no key)."""
    return (
        request.method == "POST"
        and "Authorization" not in request.headers
        and bool(completion_token())
        and _TOKEN_PATH.match(request.path) is not None
    )


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > _MAX_KEY_LENGTH:
        return None
    return token


def _refusal(status: int, code: str, message: str, challenge: str | None) -> Response:
    resp = jsonify({"error": {"code": code, "message": message, "field": "Authorization"}})
    resp.status_code = status
    if challenge is not None:
        resp.headers["WWW-Authenticate"] = challenge
    return resp


def install_auth(app: Flask, settings: Settings) -> None:
    """Register the before-request hook that authenticates /v1 requests."""
    keys = ApiKeyStore(app.extensions["cronman"].store.engine)
    admin_key = settings.api_key.get_secret_value().encode() if settings.api_key else None
    if settings.auth_disabled:
        log.warning("authentication is disabled (CRONMAN_AUTH_DISABLED): every caller is an admin")
    elif admin_key is None:
        log.info("no admin key (CRONMAN_API_KEY) is set: only namespace keys are accepted")

    def authenticate() -> Response | None:
        path = request.path
        if not _needs_key(path):
            return None
        if settings.auth_disabled:
            g.cronman_caller = ADMIN
            return None
        if _token_only():
            return None  # the endpoint checks the token against the execution's attempt
        header = request.headers.get("Authorization")
        token = _bearer(header)
        if token is None:
            message = (
                "send an API key as Authorization: Bearer <key>"
                if not header
                else "the Authorization header must be: Bearer <key>"
            )
            return _refusal(401, "unauthorized", message, 'Bearer realm="cronman"')
        if admin_key is not None and hmac.compare_digest(token.encode(), admin_key):
            who = ADMIN
        else:
            found = keys.lookup(token)
            if found is None:
                return _refusal(
                    401,
                    "unauthorized",
                    "the API key is unknown or revoked",
                    'Bearer realm="cronman", error="invalid_token"',
                )
            who = Caller(found.namespace, f"key:{found.prefix}")
        if path in ADMIN_ONLY_PATHS and not who.is_admin:
            return _refusal(403, "forbidden", "this endpoint needs the admin key", None)
        g.cronman_caller = who
        return None

    app.before_request(authenticate)
