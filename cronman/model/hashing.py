"""Job ids to slots, and slots to their owners by rendezvous (highest-random-weight) hashing.

A job's slot is a fixed hash of its id, stored on the job row. A slot's owners are the
``replicas`` live nodes with the highest score for (node, slot), so a node joining or leaving
moves only the slots whose top ``replicas`` change.

:class:`Ownership` answers these questions for a changing membership without recomputing
everything: each node's scores are computed once, and the top ``replicas`` of every slot are kept
for the last membership asked about, so a join costs one pass over the slots and a leave a rescan
of only the leaver's slots.
"""

from __future__ import annotations

import bisect
import hashlib
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable

SLOTS = 4096


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def slot_of(job_id: str, slots: int = SLOTS) -> int:
    return _h64(job_id.encode()) % slots


def score(node_id: str, slot: int) -> int:
    return _h64(f"{node_id}\x00{slot}".encode())


def score_row(node_id: str, slots: int = SLOTS) -> array:
    """``score(node_id, s)`` for every slot, as 64-bit unsigned integers (8 bytes a slot)."""
    prefix = f"{node_id}\x00".encode()
    blob = b"".join(hashlib.blake2b(prefix + str(s).encode(), digest_size=8).digest() for s in range(slots))
    row = array("Q")
    row.frombytes(blob)
    if sys.byteorder == "little":
        row.byteswap()  # the digests are big-endian numbers
    return row


Ranked = tuple[int, str]  # (score, node id): ties on the score, a 64-bit collision, go to the larger id


class Ownership:
    """Owners of every slot for a set of live nodes, kept up to date as the set changes.

    Thread-safe. Holds each node's scores (32 KiB at 4096 slots) for the current members and for up
    to ``spare_rows`` recently departed nodes, so a node that flaps costs no rehashing.
    """

    def __init__(self, replicas: int, slots: int = SLOTS, *, spare_rows: int = 64) -> None:
        if replicas < 1 or slots < 1:
            raise ValueError("replicas and slots must be at least 1")
        self.replicas = replicas
        self.slots = slots
        self._spare_rows = spare_rows
        self._lock = threading.Lock()
        self._rows: OrderedDict[str, array] = OrderedDict()
        self._members: frozenset[str] = frozenset()
        # Per slot: the owners as (score, node) in ascending order, so [0] is the weakest.
        self._top: list[list[Ranked]] = [[] for _ in range(slots)]
        # Per slot: the weakest owner's score once the slot has ``replicas`` owners, else -1.
        self._floor: list[int] = [-1] * slots
        self._owned: dict[str, set[int]] = {}
        self._frozen: dict[str, frozenset[int]] = {}
        self._table: dict[str, int] | None = None

    # ---- queries ----

    def owned(self, node_id: str, nodes: Iterable[str]) -> frozenset[int]:
        """Every slot for which ``node_id`` is among the top ``replicas`` of ``nodes`` plus itself."""
        members = frozenset(nodes) | {node_id}
        with self._lock:
            self._move_to(members)
            mine = self._frozen.get(node_id)
            if mine is None:
                mine = self._frozen[node_id] = frozenset(self._owned[node_id])
            return mine

    def owners(self, slot: int, nodes: Iterable[str]) -> tuple[str, ...]:
        """The nodes that own ``slot``, best first."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside 0..{self.slots - 1}")
        with self._lock:
            self._move_to(frozenset(nodes))
            return tuple(node for _, node in reversed(self._top[slot]))

    def table(self, nodes: Iterable[str]) -> dict[str, int]:
        """How many slots each node owns."""
        with self._lock:
            self._move_to(frozenset(nodes))
            if self._table is None:
                self._table = {n: len(self._owned[n]) for n in sorted(self._members)}
            return dict(self._table)

    def assignment(self, nodes: Iterable[str]) -> tuple[tuple[str, ...], ...]:
        """The owners of every slot, best first (for measurements and comparisons)."""
        with self._lock:
            self._move_to(frozenset(nodes))
            return tuple(tuple(node for _, node in reversed(t)) for t in self._top)

    # ---- membership changes ----

    def _move_to(self, members: frozenset[str]) -> None:
        if members == self._members:
            return
        removed = self._members - members
        added = members - self._members
        incremental = (len(removed) * self.replicas + len(added)) * self.slots
        if len(members) * self.slots <= incremental:
            self._reset()
            removed, added = frozenset(), members
        for node in sorted(removed):
            self._leave(node)
        for node in sorted(added):
            self._join(node)
        self._frozen.clear()
        self._table = None
        self._evict_rows()

    def _reset(self) -> None:
        self._members = frozenset()
        self._top = [[] for _ in range(self.slots)]
        self._floor = [-1] * self.slots
        self._owned = {}

    def _join(self, node: str) -> None:
        row = self._row(node)
        mine: set[int] = set()
        top, floor, owned, full = self._top, self._floor, self._owned, self.replicas
        for s, sc in enumerate(row):
            if sc < floor[s]:
                continue
            t = top[s]
            entry = (sc, node)
            if len(t) == full:
                if entry < t[0]:
                    continue
                owned[t.pop(0)[1]].discard(s)
            bisect.insort(t, entry)
            mine.add(s)
            if len(t) == full:
                floor[s] = t[0][0]
        owned[node] = mine
        self._members = self._members | {node}

    def _leave(self, node: str) -> None:
        self._members = self._members - {node}
        rows = self._rows
        for s in self._owned.pop(node, set()):
            t = self._top[s]
            t.remove((rows[node][s], node))
            present = {n for _, n in t}
            candidates = [(rows[m][s], m) for m in self._members if m not in present]
            if candidates:
                best = max(candidates)
                bisect.insort(t, best)
                self._owned[best[1]].add(s)
            self._floor[s] = t[0][0] if len(t) == self.replicas else -1

    def _row(self, node: str) -> array:
        row = self._rows.get(node)
        if row is None:
            row = self._rows[node] = score_row(node, self.slots)
        else:
            self._rows.move_to_end(node)
        return row

    def _evict_rows(self) -> None:
        spare = len(self._rows) - len(self._members) - self._spare_rows
        for node in list(self._rows):
            if spare <= 0:
                break
            if node not in self._members:
                del self._rows[node]
                spare -= 1


_shared: dict[tuple[int, int], Ownership] = {}
_shared_lock = threading.Lock()


def shared_ownership(replicas: int, slots: int = SLOTS) -> Ownership:
    """One :class:`Ownership` per (replicas, slots) in this process."""
    with _shared_lock:
        found = _shared.get((replicas, slots))
        if found is None:
            found = _shared[(replicas, slots)] = Ownership(replicas, slots)
        return found


def owners(slot: int, nodes: Iterable[str], replicas: int) -> list[str]:
    """The nodes that own ``slot``, best first: the definition, for one slot (one score per node);
    :meth:`Ownership.owners` answers the same from its table when the membership is stable."""
    return sorted(set(nodes), key=lambda n: (score(n, slot), n), reverse=True)[:replicas]


def owned_slots(node_id: str, nodes: Iterable[str], replicas: int, slots: int = SLOTS) -> frozenset[int]:
    """Every slot for which ``node_id`` is among the top ``replicas`` of ``nodes``."""
    return shared_ownership(replicas, slots).owned(node_id, nodes)


def slot_table(nodes: Iterable[str], replicas: int, slots: int = SLOTS) -> dict[str, int]:
    """How many slots each node owns (for the cluster view)."""
    return shared_ownership(replicas, slots).table(nodes)
