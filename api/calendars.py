"""/v1/calendars: business calendars per namespace (the days their jobs do not fire).

The scheduler nodes keep every calendar, and on a change notification load again those whose
version moved. A job names calendars of its own namespace; deleting one that live jobs still name
is a 409 naming them. A write past a namespace's quotas is refused before the work it would cost:
the body's size before it is parsed, the count and the entries before any entry is.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.common import json_body, own_namespace, requested_namespace, services, target_namespace
from cronman.errors import NotFound, PayloadTooLarge
from cronman.model.calendars import calendar_to_dict
from cronman.model.timeutil import iso_dt
from cronman.store.calendar_store import (
    CALENDAR_NAME_RE,
    CalendarQuotas,
    CalendarStore,
    StoredCalendar,
    check_name,
    parse_calendar,
)

bp = Blueprint("calendars", __name__, url_prefix="/v1/calendars")


def _store() -> CalendarStore:
    return CalendarStore(services().store.engine)


def calendar_json(c: StoredCalendar) -> dict[str, Any]:
    return {
        "name": c.name,
        "namespace": c.namespace,
        **calendar_to_dict(c.calendar),
        "created_at": iso_dt(c.created_at),
        "updated_at": iso_dt(c.updated_at),
    }


def _known_name(name: str) -> str:
    if not CALENDAR_NAME_RE.match(name):
        raise NotFound(f"no calendar {name!r}", field="name")
    return name


@bp.put("/<name>")
def put_calendar(name: str) -> Response:
    quotas = CalendarQuotas.of(services().settings)
    try:
        _, doc = json_body(quotas.max_bytes)
    except PayloadTooLarge:
        raise quotas.too_many_bytes() from None
    check_name(name)
    namespace, store = target_namespace(), _store()
    quotas.check_entries(doc)
    store.check_room(namespace, name, quotas)
    stored, created = store.put(namespace, name, parse_calendar(doc, quotas.max_entries), quotas)
    services().notify_change()
    resp = jsonify(calendar_json(stored))
    resp.status_code = 201 if created else 200
    if created:
        resp.headers["Location"] = f"/v1/calendars/{name}"
    return resp


@bp.get("")
def list_calendars() -> Response:
    """The caller's namespace's calendars; the admin key sees every namespace unless it names one."""
    namespace = requested_namespace() or own_namespace()
    return jsonify({"calendars": [calendar_json(c) for c in _store().list(namespace)]})


@bp.get("/<name>")
def get_calendar(name: str) -> Response:
    return jsonify(calendar_json(_store().get(target_namespace(), _known_name(name))))


@bp.delete("/<name>")
def delete_calendar(name: str) -> Response:
    _store().delete(target_namespace(), _known_name(name))
    services().notify_change()
    return Response(status=204)
