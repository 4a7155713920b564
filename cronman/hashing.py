"""Job ids to slots, and slots to their owners by rendezvous (highest-random-weight) hashing.

A job's slot is a fixed hash of its id, stored on the job row. A slot's owners are the
``replicas`` live nodes with the highest score for (node, slot), so a node joining or leaving
moves only the slots whose top ``replicas`` change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

SLOTS = 4096


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def slot_of(job_id: str, slots: int = SLOTS) -> int:
    return _h64(job_id.encode()) % slots


def score(node_id: str, slot: int) -> int:
    return _h64(f"{node_id}\x00{slot}".encode())


def owners(slot: int, nodes: Iterable[str], replicas: int) -> list[str]:
    """The nodes that own ``slot``, best first."""
    ranked = sorted(nodes, key=lambda n: score(n, slot), reverse=True)
    return ranked[:replicas]


def owned_slots(node_id: str, nodes: Iterable[str], replicas: int, slots: int = SLOTS) -> frozenset[int]:
    """Every slot for which ``node_id`` is among the top ``replicas`` of ``nodes``."""
    members = sorted(set(nodes) | {node_id})
    if len(members) <= replicas:
        return frozenset(range(slots))
    mine: list[int] = []
    for s in range(slots):
        my_score = score(node_id, s)
        higher = sum(1 for n in members if n != node_id and score(n, s) > my_score)
        if higher < replicas:
            mine.append(s)
    return frozenset(mine)


def slot_table(nodes: Iterable[str], replicas: int, slots: int = SLOTS) -> dict[str, int]:
    """How many slots each node owns (for the cluster view)."""
    members = sorted(set(nodes))
    counts = dict.fromkeys(members, 0)
    for s in range(slots):
        for n in owners(s, members, replicas):
            counts[n] += 1
    return counts
