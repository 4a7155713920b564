"""The node's small HTTP port: liveness, readiness (owns and has loaded its slots) and metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from scheduler_node.node import Node


async def start_web(node: Node, host: str, port: int) -> web.AppRunner:
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
            "history_buffered": len(node.history),
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        node.metrics.history_buffered.set(len(node.history))
        return web.Response(body=generate_latest(node.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
