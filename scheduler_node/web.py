"""The node's small HTTP port: liveness, readiness (owns and has loaded its slots) and metrics."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cronman.errors import ConfigError

if TYPE_CHECKING:
    from scheduler_node.node import Node

log = logging.getLogger("cronman.node")


async def start_web(node: Node, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve the node's port (0: any free one); returns the runner and the port bound, which is
    logged (and put in the node's heartbeat by the node). A port that is taken is one clear error,
    not a traceback."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "node": node.node_id})

    async def readyz(_: web.Request) -> web.Response:
        ready = node.ready
        body = {
            "status": "ready" if ready else "not_ready",
            "node": node.node_id,
            "jobs": len(node.jobs),
            "slots": len(node.owned),
            "nodes": node.live_ids,
            "history_buffered": len(node.history) if node.history is not None else 0,
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        if node.history is not None:
            node.metrics.history_buffered.set(len(node.history))
        node.metrics.tally.flush()
        return web.Response(body=generate_latest(node.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"cannot serve the node's health and metrics port {host}:{port}: {exc.strerror or exc}; "
            "choose another with --port or CRONMAN_NODE_PORT (0: any free port, -1: none)"
        ) from None
    bound = port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        bound = int(server.sockets[0].getsockname()[1])
    log.info("serving health and metrics", extra={"node": node.node_id, "host": host, "port": bound})
    return runner, bound
