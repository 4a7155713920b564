"""/v1/throttles: named limits on deliveries in flight (and per second) for a namespace's jobs.

The scheduler nodes read every policy and re-read them on a change notification. Deleting a policy
that jobs still name is allowed: those jobs then run unthrottled.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.common import json_body, own_namespace, requested_namespace, services, target_namespace
from cronman.errors import NotFound
from cronman.model.timeutil import iso_dt
from cronman.store.throttles import THROTTLE_NAME_RE, ThrottlePolicy, ThrottleStore, check_name, parse_policy

bp = Blueprint("throttles", __name__, url_prefix="/v1/throttles")


def _store() -> ThrottleStore:
    return ThrottleStore(services().store.engine)


def policy_json(p: ThrottlePolicy) -> dict[str, Any]:
    return {
        "name": p.name,
        "namespace": p.namespace,
        "max_in_flight": p.max_in_flight,
        "max_per_second": p.max_per_second,
        "created_at": iso_dt(p.created_at),
        "updated_at": iso_dt(p.updated_at),
    }


def _known_name(name: str) -> str:
    if not THROTTLE_NAME_RE.match(name):
        raise NotFound(f"no throttle policy {name!r}", field="name")
    return name


@bp.put("/<name>")
def put_policy(name: str) -> Response:
    raw, _ = json_body()
    check_name(name)
    spec = parse_policy(raw)
    quota = services().settings.quota_throttles_per_namespace
    policy, created = _store().put(target_namespace(), name, spec, quota)
    services().notify_change()
    resp = jsonify(policy_json(policy))
    resp.status_code = 201 if created else 200
    if created:
        resp.headers["Location"] = f"/v1/throttles/{name}"
    return resp


@bp.get("")
def list_policies() -> Response:
    """The caller's namespace's policies; the admin key sees every namespace unless it names one."""
    namespace = requested_namespace() or own_namespace()
    return jsonify({"throttles": [policy_json(p) for p in _store().list(namespace)]})


@bp.get("/<name>")
def get_policy(name: str) -> Response:
    return jsonify(policy_json(_store().get(target_namespace(), _known_name(name))))


@bp.delete("/<name>")
def delete_policy(name: str) -> Response:
    _store().delete(target_namespace(), _known_name(name))
    services().notify_change()
    return Response(status=204)
