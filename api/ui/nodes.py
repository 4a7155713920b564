"""The cluster page's rows: each live node's own figures from its heartbeat, whatever it reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cronman.model.hashing import slot_table
from cronman.redis.cluster import NodeInfo


@dataclass(frozen=True, slots=True)
class NodeRow:
    id: str
    heartbeat_age_seconds: float
    ready: bool | None
    slots: int | None  # as the node reports it, else as rendezvous hashing assigns them
    jobs: int | None
    in_flight: int | None
    fires_per_s: float | None
    lag_p99_ms: float | None
    started_at: Any


def _number(info: dict[str, Any], name: str) -> Any:
    value = info.get(name)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def node_rows(nodes: list[NodeInfo], replication_factor: int) -> list[NodeRow]:
    assigned = slot_table([n.node_id for n in nodes], replication_factor) if nodes else {}
    rows = []
    for n in nodes:
        ready = n.info.get("ready")
        slots = _number(n.info, "slots")
        rows.append(
            NodeRow(
                id=n.node_id,
                heartbeat_age_seconds=n.heartbeat_age_seconds,
                ready=ready if isinstance(ready, bool) else None,
                slots=slots if slots is not None else assigned.get(n.node_id, 0),
                jobs=_number(n.info, "jobs"),
                in_flight=_number(n.info, "in_flight"),
                fires_per_s=_number(n.info, "fires_per_s"),
                lag_p99_ms=_number(n.info, "lag_p99_ms"),
                started_at=n.info.get("started_at"),
            )
        )
    return rows
