"""/v1/notifications: which events of which jobs of a namespace are sent where (cronman.store.notifications)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.common import json_body, own_namespace, requested_namespace, services, target_namespace
from cronman.errors import NotFound
from cronman.model.targets import redact_target
from cronman.model.timeutil import iso_dt
from cronman.store.notifications import NAME_RE, Rule, RuleStore, check_name, check_target, parse_rule

bp = Blueprint("notifications", __name__, url_prefix="/v1/notifications")


def _store() -> RuleStore:
    return RuleStore(services().store.engine)


def rule_json(r: Rule) -> dict[str, Any]:
    return {
        "name": r.name,
        "namespace": r.namespace,
        "events": r.events,
        "selector": r.selector,
        "target": {"type": r.target.get("type"), **redact_target(r.target)},
        "min_interval_seconds": r.min_interval_seconds,
        "created_at": iso_dt(r.created_at),
        "updated_at": iso_dt(r.updated_at),
    }


def _known_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise NotFound(f"no notification {name!r}", field="name")
    return name


@bp.put("/<name>")
def put_rule(name: str) -> Response:
    raw, _ = json_body()
    check_name(name)
    spec = parse_rule(raw)
    namespace = target_namespace()
    settings = services().settings
    check_target(spec, settings, namespace)
    rule, created = _store().put(namespace, name, spec, settings.quota_notification_rules_per_namespace)
    resp = jsonify(rule_json(rule))
    resp.status_code = 201 if created else 200
    if created:
        resp.headers["Location"] = f"/v1/notifications/{name}"
    return resp


@bp.get("")
def list_rules() -> Response:
    """The caller's namespace's rules; the admin key sees every namespace unless it names one."""
    namespace = requested_namespace() or own_namespace()
    return jsonify({"notifications": [rule_json(r) for r in _store().list(namespace)]})


@bp.get("/<name>")
def get_rule(name: str) -> Response:
    return jsonify(rule_json(_store().get(target_namespace(), _known_name(name))))


@bp.delete("/<name>")
def delete_rule(name: str) -> Response:
    _store().delete(target_namespace(), _known_name(name))
    return Response(status=204)
