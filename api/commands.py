"""/v1/commands/{command_id}: what became of a job command sent through the command queue."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.common import own_namespace, services
from cronman.commands import COMMAND_ID_RE, get_command
from cronman.errors import NotFound
from cronman.timeutil import iso_dt

bp = Blueprint("commands", __name__, url_prefix="/v1/commands")


@bp.get("/<command_id>")
def get(command_id: str) -> Response:
    if not COMMAND_ID_RE.match(command_id):
        raise NotFound(f"no command {command_id!r}", field="command_id")
    c = get_command(services().store.engine, command_id, own_namespace())
    return jsonify(
        {
            "command_id": c.command_id,
            "namespace": c.namespace,
            "action": c.action,
            "job_id": c.job_id,
            "status": c.status,
            "error": c.error,
            "received_at": iso_dt(c.received_at),
            "applied_at": iso_dt(c.applied_at),
        }
    )
