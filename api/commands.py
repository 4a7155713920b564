"""The command queue from the API's side: the command token a key signs its queued commands with,
and what became of a command (``/v1/commands/{command_id}``)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.auth import caller
from api.common import own_namespace, services
from cronman.errors import Conflict, NotFound
from cronman.model.timeutil import iso_dt
from cronman.store.commands import ADMIN_KEY, COMMAND_ID_RE, command_token, get_command

bp = Blueprint("commands", __name__)


@bp.get("/v1/commands:token")
def token() -> Response:
    """The calling key's command token: a producer signs each message it puts on the command queue
    with it (see cronman.store.commands.sign_command); the command then acts in the key's namespace."""
    secret = services().settings.command_secret
    if secret is None:
        raise Conflict(
            "the command queue is not set up on this server (CRONMAN_COMMAND_SECRET is not set)",
            code="not_configured",
        )
    who = caller()
    key = ADMIN_KEY if who.is_admin else who.name.removeprefix("key:")
    resp = jsonify(
        {
            "token": command_token(secret.get_secret_value(), key, who.namespace),
            "key": key,
            "namespace": who.namespace,
        }
    )
    resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.get("/v1/commands/<command_id>")
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
