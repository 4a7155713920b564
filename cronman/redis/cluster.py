"""The cluster as seen from Redis: who is alive and which slots each owns (read side, for the API)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from cronman.model.hashing import SLOTS, shared_ownership
from cronman.redis.keys import Keys, lua
from cronman.redis.redisconn import SyncRedis

# A heartbeat not refreshed for two intervals and this much more is overdue: its node is routed
# around (its slots go to the others) while its heartbeat lives on until its TTL runs out.
OVERDUE_MARGIN_SECONDS = 1.0


def overdue_after(heartbeat_interval_seconds: float) -> float:
    """Seconds after its last heartbeat that a node counts as overdue (docs/architecture.md,
    "Membership"): two missed beats and a margin, however long the heartbeat's TTL."""
    return 2 * heartbeat_interval_seconds + OVERDUE_MARGIN_SECONDS


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


def live_nodes(client: SyncRedis, keys: Keys) -> list[NodeInfo]:
    flat = client.eval(lua("members"), 1, keys.members)
    return parse_members(list(flat))


@lru_cache(maxsize=16)
def slot_counts(members: frozenset[str], replication_factor: int) -> Mapping[str, int]:
    """Slots owned per node, computed once per membership (the set of live node ids)."""
    return MappingProxyType(shared_ownership(replication_factor).table(members))


def cluster_view(
    client: SyncRedis, keys: Keys, replication_factor: int, heartbeat_interval_seconds: float
) -> dict[str, Any]:
    """The live nodes and the slots each owns. A node whose heartbeat is overdue (see
    overdue_after) is listed as such, owning none: the others route around it."""
    nodes = live_nodes(client, keys)
    late = overdue_after(heartbeat_interval_seconds)
    counts = slot_counts(frozenset(n.node_id for n in nodes if n.heartbeat_age_seconds <= late), replication_factor)
    return {
        "replication_factor": replication_factor,
        "slots": SLOTS,
        "nodes": [
            {
                "id": n.node_id,
                "heartbeat_age_seconds": n.heartbeat_age_seconds,
                "overdue": n.heartbeat_age_seconds > late,
                "slots_owned": counts.get(n.node_id, 0),
                "jobs_owned": n.info.get("jobs"),
                "ready": n.info.get("ready", False),
                "started_at": n.info.get("started_at"),
                **{k: n.info[k] for k in ("in_flight", "fires_per_s", "lag_p99_ms", "parked") if k in n.info},
            }
            for n in nodes
        ],
    }
