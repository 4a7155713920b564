"""The cluster as seen from Redis: who is alive and which slots each owns (read side, for the API)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from cronman.hashing import SLOTS, slot_table
from cronman.keys import Keys, lua


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    heartbeat_age_seconds: float
    info: dict[str, Any]


def parse_members(flat: list[Any]) -> list[NodeInfo]:
    """The members script's answer: Redis's time, then (node id, ms since its beat, info) each."""
    nodes: list[NodeInfo] = []
    for i in range(1, len(flat) - 2, 3):
        node_id = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
        try:
            info = json.loads(flat[i + 2])
        except (ValueError, TypeError):
            info = {}
        age = max(0, int(flat[i + 1])) / 1000
        nodes.append(NodeInfo(node_id, round(age, 3), info if isinstance(info, dict) else {}))
    return sorted(nodes, key=lambda n: n.node_id)


def live_nodes(client: redis.Redis, keys: Keys) -> list[NodeInfo]:
    flat = client.eval(lua("members"), 1, keys.members)
    return parse_members(list(flat))


def cluster_view(client: redis.Redis, keys: Keys, replication_factor: int) -> dict[str, Any]:
    nodes = live_nodes(client, keys)
    counts = slot_table([n.node_id for n in nodes], replication_factor) if nodes else {}
    return {
        "replication_factor": replication_factor,
        "slots": SLOTS,
        "nodes": [
            {
                "id": n.node_id,
                "heartbeat_age_seconds": n.heartbeat_age_seconds,
                "slots_owned": counts.get(n.node_id, 0),
                "jobs_owned": n.info.get("jobs"),
                "ready": n.info.get("ready", False),
                "started_at": n.info.get("started_at"),
                **{k: n.info[k] for k in ("in_flight", "fires_per_s", "lag_p99_ms", "parked") if k in n.info},
            }
            for n in nodes
        ],
    }
