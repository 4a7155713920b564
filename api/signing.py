"""/v1/signing-secrets: rotate a namespace's secret for signed deliveries, and see which are active."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.common import services, target_namespace
from cronman.model.timeutil import iso_dt
from cronman.store.signing_secrets import SigningSecretStore

bp = Blueprint("signing", __name__, url_prefix="/v1/signing-secrets")


def _store() -> SigningSecretStore:
    return SigningSecretStore(services().store.engine)


@bp.post("")
def rotate_secret() -> Response:
    """A new secret for the namespace, shown only in this answer; the previous one keeps signing
    for a day."""
    namespace = target_namespace()
    secret, created_at = _store().rotate(namespace)
    services().notify_change()
    resp = jsonify({"namespace": namespace, "secret": secret, "created_at": iso_dt(created_at)})
    resp.status_code = 201
    resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.get("")
def list_secrets() -> Response:
    namespace = target_namespace()
    return jsonify(
        {
            "namespace": namespace,
            "active": [
                {"prefix": a.prefix, "created_at": iso_dt(a.created_at), "retires_at": iso_dt(a.retires_at)}
                for a in _store().active(namespace)
            ],
        }
    )
