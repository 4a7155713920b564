"""What every /v1 blueprint needs: the services, the caller and its namespace, JSON bodies, query
arguments."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from flask import current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from api.auth import caller
from cronman.errors import Forbidden, InvalidInput, PayloadTooLarge, UnsupportedMediaType
from cronman.model.changes import Stop
from cronman.model.namespaces import DEFAULT_NAMESPACE, check_namespace
from cronman.store.audit import Actor
from cronman.store.store import JobRecord

JSON_TYPES = ("application/json", "application/merge-patch+json")


def services():  # type: ignore[no-untyped-def]
    return current_app.extensions["cronman"]


def now_ms() -> int:
    return int(time.time() * 1000)


def stops_of(record: JobRecord) -> list[Stop]:
    """What a write that left a job paused tells the nodes to stop at once."""
    return [Stop(record.id, record.version)] if record.paused else []


def own_namespace() -> str | None:
    """The caller's namespace (None: every namespace, for the admin key)."""
    return caller().namespace


def actor() -> Actor:
    """The caller as job events name it."""
    return Actor(caller().name)


def requested_namespace() -> str | None:
    """The ``namespace`` query parameter: the admin key's way to act in a namespace; a namespace
    key may name only its own."""
    # (without a query string there is none, and nothing to parse: most writes have none)
    requested = request.args.get("namespace") if request.query_string else None
    if requested is None:
        return None
    check_namespace(requested)
    own = own_namespace()
    if own is not None and requested != own:
        raise Forbidden(f"this key belongs to namespace {own!r}; it cannot act in {requested!r}", field="namespace")
    return requested


def target_namespace() -> str:
    """The one namespace a request acts in: the requested one, the key's own, or the default."""
    return requested_namespace() or own_namespace() or DEFAULT_NAMESPACE


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a double")
    return value


def json_body(limit: int | None = None) -> tuple[bytes, dict[str, Any]]:
    """The request's JSON object body (and its bytes), within ``limit`` bytes (default: the app's)."""
    mimetype = request.mimetype or ""
    if mimetype not in JSON_TYPES:
        raise UnsupportedMediaType(
            f"send the body as JSON with Content-Type: application/json (got {mimetype or 'none'!r})",
            field="Content-Type",
        )
    if limit is None:
        limit = current_app.config["MAX_CONTENT_LENGTH"]
    else:
        request.max_content_length = limit
    too_large = PayloadTooLarge(f"the request body exceeds {limit} bytes", field="body")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise too_large from None
    try:
        doc = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object", code="invalid_json")
    return raw, doc


def int_arg(name: str, default: int, lo: int, hi: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer", field=name) from None
    if not lo <= value <= hi:
        raise InvalidInput(f"{name} must be between {lo} and {hi}", field=name)
    return value
